#!/usr/bin/env bash
# What scripts/gpu_check.sh needs on a GPU machine that reaches nothing outside itself, gathered
# into .gpu/ (git-ignored; it travels with the device tool's `carry`): SmolLM2's config and
# tokenizer (its weights are too large to travel: the checks draw random ones), the shipped
# TruthfulQA copy, an Opacus wheel (the peer the classifier benchmark compares against) and a
# bitsandbytes wheel (the quantized layers' tests and `--quantize` on CUDA; the GPU image lacks
# it: /work/.library/device/KINDS.md) and the server's packages (fastapi, uvicorn, pydantic, the
# openai client: the serve step), each the version this checkout's .venv holds.
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
version() { .venv/bin/pip show "$1" | awk '/^Version/{print $2}'; }
.venv/bin/pip download -q --no-deps "opacus==$(version opacus)" -d .gpu/whl
# the GPU machine's Python (3.12, manylinux): bitsandbytes ships one wheel for every Python
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 "bitsandbytes==$(version bitsandbytes)" -d .gpu/whl
# isouq serve and benchmarks/serve_load.py (the serve step): the packages the GPU image lacks
# (/work/.library/device/KINDS.md lists what it has: httpx, anyio, h11, prometheus-client, ...)
for pkg in fastapi starlette uvicorn pydantic annotated-types typing-inspection openai httpx2 \
           httpcore2 truststore opentelemetry-api annotated-doc sniffio typing_extensions; do
  .venv/bin/pip download -q --no-deps "$pkg==$(version "$pkg")" -d .gpu/whl
done
for pkg in pydantic_core jiter; do  # compiled: the GPU machine's Python 3.12 wheels
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 "$pkg==$(version "$pkg")" -d .gpu/whl
done
du -sh .gpu
