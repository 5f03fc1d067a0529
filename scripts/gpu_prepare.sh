#!/usr/bin/env bash
# What scripts/gpu_check.sh needs on a GPU machine that reaches nothing outside itself, gathered
# into .gpu/ (git-ignored; it travels with the device tool's `carry`): SmolLM2's config and
# tokenizer (its weights are too large to travel: the checks draw random ones), the shipped
# TruthfulQA copy, and an Opacus wheel (the peer the classifier benchmark compares against).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu/smollm2 .gpu/data .gpu/whl
.venv/bin/python - <<'PY'
from isouq.models import load_model

model, tok, _ = load_model("smollm2")
model.config.save_pretrained(".gpu/smollm2")
tok.save_pretrained(".gpu/smollm2")
PY
data=${ISOUQ_DATA:-../shared/data}
cp -r "$data/truthfulqa" .gpu/data/
.venv/bin/pip download -q --no-deps "opacus==$(.venv/bin/pip show opacus | awk '/^Version/{print $2}')" -d .gpu/whl
du -sh .gpu
