#!/usr/bin/env bash
# The GPU checks, in one call of a lent GPU machine (docs/development.md, "On a GPU"):
#
#   device run:  bash scripts/gpu_check.sh      (carry .gpu, made here by scripts/gpu_prepare.sh)
#                STEPS="tests classifiers" bash scripts/gpu_check.sh    (other steps)
# By default: tests, aligned, spans and paper_sizes (about 9 minutes: on a machine whose calls
# stop at 10 minutes, run them as two calls, STEPS="tests aligned spans", then
# STEPS=paper_sizes).
#
# 1. exactness: the ghost-rule (quantized and adapter layers among them, `--quantize` through
#    `isouq score --device cuda`), classifier, sequence and span tests with every tensor on the
#    GPU (ISOUQ_TEST_DEVICE=cuda, TF32 off), against brute-force per-example gradients and
#    Opacus, and FSDP2 over NCCL against one process (one rank per GPU);
# 2. LLM scoring: benchmarks/score_sequences.py on SmolLM2's architecture (random weights) in
#    float32 and bfloat16, batch 16 and 32: forward, floor, training backward, loop, ghost;
# 3. half precision: ghost against the loop in bf16/fp16 and against the float32 loop;
# 4. classifiers: benchmarks/classifiers.py (ResNet-10, BatchNorm; Opacus on the GroupNorm twin);
# 5. paper_sizes: benchmarks/paper_sizes.py, the paper's four LLM architectures (1B-14B, random
#    weights, bfloat16) at batch 1, 16, 64: floor, forward + full backward, ghost, peak memory,
#    and a profile of the 3B model's floor and ghost at batch 16;
#    aligned: the 3B model's floor and ghost with and without rows padded to a multiple of 8
#    positions (tensor-core-aligned T × T Grams; ISOUQ_TOKEN_MULTIPLE), at batch 16 and 64;
#    compiled (asked for by name, STEPS=compiled): the 3B model's floor, ghost and ghost with
#    graph capture (compile=True) at batch 16 and 64, on the same card, from the same encoded
#    pairs, through the same timing wrapper (issue 64's targets: ghost/floor ≤ 1.3 at 16,
#    ≤ 1.15 at 64); a refused capture is kept with its reason;
# 6. spans: benchmarks/spans.py, 16 answers of 5 sentences, span scores against the whole answer
#    and the per-span loop, on SmolLM2's architecture (float32) and Llama 3.2 3B (bfloat16);
# 7. serve: `isouq serve --device cuda` on SmolLM2's architecture (random weights saved by
#    benchmarks/random_weights.py), /v1/score at 1 and 16 clients against its in-process ceiling
#    (benchmarks/serve_load.py; the pass cost the server timed is in its meta).
# Results land in $OUT (JSON, and one log of everything printed).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 ISOUQ_DATA=$PWD/.gpu/data
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

step() {  # name, seconds allowed, command...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "== $name"
  timeout "$limit" "$@"
  echo "== $name: exit $?, $((SECONDS - t0)) s"
}
# the steps run in this file's order, paper_sizes (the longest) last
STEPS=${STEPS:-tests aligned spans paper_sizes}  # more: compiled serve llm_fp32 llm_bf16 half_precision classifiers
want() { [[ " $STEPS " == *" $1 "* ]]; }
want tests && step tests 150 env ISOUQ_TEST_DEVICE=cuda python3 -m pytest -q -n 8 -p no:cacheprovider \
  --ignore=tests/ghost/test_memory.py tests/ghost tests/test_classifier_classes.py tests/test_sequences.py \
  tests/test_spans.py tests/test_big_models.py::test_fsdp_over_nccl_equals_one_process
want llm_fp32 && step llm_fp32 180 python3 benchmarks/score_sequences.py --config .gpu/smollm2 --device cuda \
  --batch-sizes 16 32 --methods forward floor ghost loop --repeats 10 --tag cuda --out "$OUT"
want llm_bf16 && step llm_bf16 70 python3 benchmarks/score_sequences.py --config .gpu/smollm2 --device cuda \
  --dtype bfloat16 --batch-sizes 16 32 --methods floor ghost --repeats 10 --tag cuda_bf16 --out "$OUT"
want half_precision && step half_precision 60 python3 benchmarks/half_precision.py --config .gpu/smollm2 \
  --device cuda --tag cuda --out "$OUT"
want classifiers && step classifiers 150 python3 benchmarks/classifiers.py --device cuda --repeats 9 \
  --no-loop --out "$OUT/classifiers_cuda.json"
want aligned && step aligned 120 python3 benchmarks/paper_sizes.py --models llama-3.2-3b \
  --methods floor ghost floor_unaligned ghost_unaligned --tokenizer .gpu/smollm2 --device cuda \
  --dtype bfloat16 --batch-sizes 16 64 --tag cuda_bf16_aligned --out "$OUT"
want compiled && step compiled ${COMPILED_LIMIT:-420} python3 benchmarks/paper_sizes.py --models llama-3.2-3b \
  --methods floor ghost ghost_compiled --tokenizer .gpu/smollm2 --device cuda --dtype bfloat16 \
  --batch-sizes 16 64 --warmups 2 --tag cuda_bf16_compiled --out "$OUT"
want spans && step spans 150 python3 benchmarks/spans.py --config .gpu/smollm2 --device cuda \
  --out "$OUT/spans_cuda.json"
want spans && step spans_3b 150 python3 benchmarks/spans.py --config benchmarks/configs/llama-3.2-3b \
  --tokenizer .gpu/smollm2 --device cuda --dtype bfloat16 --out "$OUT/spans_cuda_llama-3.2-3b.json"
want serve && step serve 300 bash -c 'python3 benchmarks/random_weights.py --config .gpu/smollm2 \
  --save /tmp/smollm2-random && python3 benchmarks/serve_load.py --model /tmp/smollm2-random \
  --device cuda --endpoints score --levels 1 16 --seconds 20 --min-batches 5 --warmup-batches 2 \
  --out "$OUT/serve_load_cuda.json"'
want paper_sizes && step paper_sizes ${PAPER_SIZES_LIMIT:-420} python3 benchmarks/paper_sizes.py \
  --tokenizer .gpu/smollm2 --device cuda --dtype bfloat16 --batch-sizes 1 16 64 \
  --profile llama-3.2-3b:16 --tag cuda_bf16 --out "$OUT"
rm -f "$OUT"/*.md  # the tables are printed above; the JSON holds every number
