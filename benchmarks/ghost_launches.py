"""Benchmark: the operations a ghost batch runs beyond the floor's, counted (no GPU needed).

On a GPU a ghost batch of the paper's models is host-bound (docs/performance.md, "At the
paper's sizes"): its time follows the kernels it launches and the Python around them more than
its flops. Each aten operation that computes (views and metadata excluded) launches about one
kernel on CUDA, and which operations run does not depend on the device or on the layer widths,
as long as the cost rule makes the same choices (the Gram form wherever T < width, as at the
real sizes; a shared-input group's Gram formed as on CUDA, ``ghost.shared.CONCAT_DEVICES``).
So this counts them on the CPU, with a ``TorchDispatchMode``, for the paper's four
architectures at their own depth and layer structure (``benchmarks/configs/``) but narrow
(hidden 256, the MLP and the vocabulary at their proportions' floor): one batch of B TruthfulQA
(question, best answer) pairs, the floor (forward + backward with every weight frozen) and
``score_sequences(method="ghost")``, and among them those that make the host wait for the
device (a value or a size read back: ``.item()``, ``nonzero``).

``--src DIR`` runs another checkout's ``src/`` (e.g. an older commit's ``git worktree``) for a
before/after in one run; each (model, method) runs in its own process.

    python benchmarks/ghost_launches.py --tokenizer .gpu/smollm2 --out benchmarks/results
    git worktree add /tmp/before REV && python benchmarks/ghost_launches.py --tokenizer \\
        .gpu/smollm2 --src /tmp/before/src --tag before --out benchmarks/results
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
MODELS = ("olmo-1b", "llama-3.2-3b", "llama-2-7b", "phi-4")
#: aten operations that only make views or read metadata (no kernel on CUDA)
VIEWS = frozenset({
    "aten.view", "aten.t", "aten.transpose", "aten._unsafe_view", "aten.slice", "aten.detach",
    "aten.unsqueeze", "aten.squeeze", "aten.expand", "aten.alias", "aten.as_strided",
    "aten.permute", "aten.select", "aten._reshape_alias", "aten.split", "aten.unbind",
    "aten.split_with_sizes", "aten.lift_fresh", "aten.promote_types", "aten.is_same_size",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset",
    "aten.result_type", "aten._has_compatible_shallow_copy_type", "aten.is_nonzero",
})


def narrow_config(name: str, hidden: int = 256):
    """The model's config at its depth and layer structure, ``hidden`` wide: attention heads
    of 64, the key/value heads in the model's proportion, the MLP in its proportion to the
    hidden size, the vocabulary at most 4,096 (above 4 × hidden: the head stays "wide")."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(HERE / "configs" / name)
    heads = hidden // 64
    kv = max(1, heads * cfg.num_key_value_heads // cfg.num_attention_heads)
    ratio = cfg.intermediate_size / cfg.hidden_size
    cfg.update({"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv,
                "head_dim": 64, "intermediate_size": int(round(ratio * hidden / 64)) * 64,
                "vocab_size": min(cfg.vocab_size, 4096)})
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids inside the vocabulary
        if isinstance(getattr(cfg, k, None), int):
            setattr(cfg, k, getattr(cfg, k) % cfg.vocab_size)
    return cfg


def count(model_name: str, method: str, batch: int, tokenizer: str, dtype: str) -> dict:
    """One (model, method): the computing aten operations of one batch, after one warm-up."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import isouq.ghost.shared as shared
    from floor import floor_and_ghost
    from random_weights import FoldedTokenizer
    from score_sequences import load_pairs

    shared.CONCAT_DEVICES = {"cpu", "cuda"}  # count the operations CUDA runs (one per group)
    torch.manual_seed(0)
    cfg = narrow_config(model_name)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype)).eval()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if len(tok) > cfg.vocab_size:
        tok = FoldedTokenizer(tok, cfg.vocab_size)
    prompts, answers = load_pairs(batch)
    fns, b = floor_and_ghost(model, tok, prompts, answers)
    fn = fns[method]

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    fn()  # warm-up: first-call checks (norm formulas, dtype probes) are not per batch
    with Count() as c:
        fn()
    ops = {k: v for k, v in c.ops.items() if k not in VIEWS}
    return {"model": model_name, "method": method, "batch": batch, "dtype": dtype,
            "tokens_padded": int(b.input_ids.shape[1]), "layers": cfg.num_hidden_layers,
            "ops": sum(ops.values()), "by_op": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


#: operations whose result size or value the host must read: the CPU waits for the GPU
SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique")


def syncs(row: dict) -> int:
    """How many of a row's operations make the host wait for the device."""
    return sum(row["by_op"].get(k, 0) for k in SYNCS)


def main() -> None:
    from record import source_commit  # benchmarks/, on the path when run as a script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokenizer", required=True, help="folder of a saved tokenizer")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: the norm layers' half-precision path; the Grams' factors are "
                    "upcast on the CPU, multiplied as they are on CUDA (a copy each fewer)")
    ap.add_argument("--src", default=None, help="another checkout's src/ to count instead")
    ap.add_argument("--tag", default=None, help="suffix of the result file's name")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(count(a.child[0], a.child[1], a.batch, a.tokenizer, a.dtype)))
        return
    src = Path(a.src).resolve() if a.src else (HERE.parent / "src").resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    rows = []
    for m in a.models:
        for method in ("floor", "ghost"):
            out = subprocess.run([sys.executable, __file__, "--child", m, method, "--batch",
                                  str(a.batch), "--tokenizer", a.tokenizer, "--dtype", a.dtype],
                                 env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(f"{m} {method}: {rows[-1]['ops']} operations", flush=True)
    table = []
    for m in a.models:
        f, g = (next(r for r in rows if r["model"] == m and r["method"] == k)
                for k in ("floor", "ghost"))
        extra = collections.Counter(g["by_op"])
        extra.subtract(f["by_op"])
        table.append({"model": m, "layers": f["layers"], "floor ops": f["ops"],
                      "ghost ops": g["ops"], "ghost − floor": g["ops"] - f["ops"],
                      "per layer": round((g["ops"] - f["ops"]) / f["layers"], 1),
                      "host syncs ghost − floor": syncs(g) - syncs(f),
                      "most added": ", ".join(f"{k.removeprefix('aten.')} {v}"
                                              for k, v in extra.most_common(5) if v > 0)})
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "src": str(src),
           "commit": source_commit(src), "batch": a.batch, "dtype": a.dtype, "rows": rows,
           "table": table}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "ghost_launches" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    from isouq.runio import markdown_table

    print(markdown_table(table))


if __name__ == "__main__":
    main()
