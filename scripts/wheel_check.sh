#!/usr/bin/env bash
# The wheel works: build it (python -m build --wheel) from the files git would ship, install it
# with the llm extra into a fresh virtual environment (no system site-packages, no access to this
# checkout), and run `isouq --help`, `isouq models` and `isouq score` with a tiny local model.
# Needs .venv (scripts/setup.sh: the dev extra brings `build`; transformers makes the tiny model).
# Exits non-zero if any step fails. KEEP=1 keeps the temporary folder for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
TMP=$(mktemp -d "${TMPDIR:-/tmp}/isouq-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then trap 'echo "[wheel] kept $TMP"' EXIT; else trap 'rm -rf "$TMP"' EXIT; fi
start=$SECONDS
step() { echo "[wheel] $(( SECONDS - start ))s: $*"; }

step "copying the sources git would ship (no build/, egg-info or caches of this checkout)"
mkdir "$TMP/src"
git ls-files -co --exclude-standard -z -- pyproject.toml README.md LICENSE src \
  | tar --null -T - -cf - | tar -xf - -C "$TMP/src"

step "python -m build --wheel"
"$PY" -m build --wheel --outdir "$TMP/dist" "$TMP/src" >"$TMP/build.log" 2>&1 \
  || { tail -40 "$TMP/build.log"; exit 1; }
wheels=("$TMP"/dist/isouq-*-py3-none-any.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || { echo "[wheel] no single wheel in dist/"; exit 1; }
WHEEL=${wheels[0]}
step "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"

step "fresh venv (no system site-packages); pip install -c constraints.txt '$(basename "$WHEEL")[llm]'"
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q -c constraints.txt "$WHEEL[llm]"

step "a tiny random Llama and its tokenizer, saved to a folder (tests/tiny.py)"
"$PY" - "$TMP/model" <<'EOF'
import sys

sys.path.insert(0, "tests")
import tiny

tiny.causal_lm("llama-tied").save_pretrained(sys.argv[1])
tiny.tokenizer().save_pretrained(sys.argv[1])
EOF
mkdir "$TMP/work"
cat >"$TMP/work/pairs.jsonl" <<'EOF'
{"id": "q0", "question": "what is the capital of france", "answer": "paris"}
{"id": "q1", "prompt": [{"role": "user", "content": "who wrote hamlet"}], "answer": "shakespeare wrote hamlet"}
{"id": "q2", "question": "why is the sky blue", "answer": "because the sky is blue"}
EOF

# From here on only the new environment: outside the checkout, nothing of .venv on PATH.
cd "$TMP/work"
run() { env -u PYTHONPATH PATH="$TMP/venv/bin:/usr/bin:/bin" HF_HUB_OFFLINE=1 \
          ISOUQ_CACHE="$TMP/cache" OMP_NUM_THREADS=1 "$@"; }

step "the installed package: version, licence, location"
run python - "$TMP/venv" <<'EOF'
import importlib.metadata as md
import sys
from pathlib import Path

import isouq

where = Path(isouq.__file__).resolve()
assert Path(sys.argv[1]).resolve() in where.parents, f"isouq imported from {where}"
assert md.version("isouq") == isouq.__version__, (md.version("isouq"), isouq.__version__)
meta = md.metadata("isouq")
assert meta["License-Expression"] == "Apache-2.0", meta["License-Expression"]
files = {str(f) for f in md.files("isouq")}
assert any(f.endswith("licenses/LICENSE") for f in files), "LICENSE is not in the wheel"
assert "isouq/data/demo_truthfulqa.jsonl" in files, "the package data is not in the wheel"
print(f"isouq {isouq.__version__} from {where.parent}")
EOF

step "isouq --help"
run isouq --help >/dev/null
step "isouq models"
run isouq models >models.txt
grep -q smollm2 models.txt || { cat models.txt; echo "[wheel] smollm2 not listed"; exit 1; }
step "isouq score (3 answers, tiny model)"
run isouq score pairs.jsonl --out scores.jsonl --model "$TMP/model" --batch-size 2
run python - <<'EOF'
import json
import math

rows = [json.loads(line) for line in open("scores.jsonl")]
assert [r["key"] for r in rows] == ["q0", "q1", "q2"], rows
for r in rows:
    s = r["scores"]
    assert s["epistemic"] > 0 and 0 < s["mean_prob"] < 1 and math.isfinite(s["aleatoric"]), r
print(f"{len(rows)} rows scored")
EOF
step "ok"
