#!/usr/bin/env bash
# The kept QA reference study (results/qa): SmolLM2 on 200 questions per dataset, Gemma 3 270M
# and Qwen2.5-Coder-0.5B on 100 each, judged by Qwen2.5-Coder-1.5B, with every method. Every
# run is resumable: re-run this script to continue after an interruption; a (dataset, model)
# already complete with the same settings is skipped without loading a model. Extra arguments
# go to every run, e.g.
#   bash scripts/qa_reference.sh --device cuda
#   bash scripts/qa_reference.sh --methods gradient naive_entropy p_true   # without semantic entropy
# Semantic entropy dominates the cost: about 45 calls of the 1.5B entailment judge per question,
# 1-5 minutes per question on a 2-core CPU (README, "QA reference study"), so run this in the
# background, e.g. `nohup bash scripts/qa_reference.sh > qa.log 2>&1 &`; set ISOUQ_THREADS=1
# when other jobs share the machine.
# SmolLM2 answers both datasets in sentences of ~26 tokens, so its semantic entropy costs about the
# same on each (~170 s/question on a 2-core AMD EPYC, ~45 s on a 2-core Intel Xeon of family 6
# model 207, with the packed 1.5B judge).
set -euo pipefail
cd "$(dirname "$0")/.."
ISOUQ="${ISOUQ:-$( [ -x .venv/bin/isouq ] && echo .venv/bin/isouq || echo isouq )}"
methods=(--methods gradient naive_entropy p_true semantic_entropy)
for a in "$@"; do [ "$a" = "--methods" ] && methods=(); done
# the judge of correctness and entailment is an optional model too: fetched once, before the runs
"$ISOUQ" models --fetch qwen2.5-coder-1.5b >/dev/null
for spec in "triviaqa qwen2.5-coder-0.5b 100" "truthfulqa qwen2.5-coder-0.5b 100" \
            "truthfulqa gemma3-270m 100" "triviaqa gemma3-270m 100" \
            "triviaqa smollm2 200" "truthfulqa smollm2 200"; do
  set -- $spec "$@"
  dataset=$1 model=$2 limit=$3
  shift 3
  "$ISOUQ" models --fetch "$model" >/dev/null 2>&1 || true
  "$ISOUQ" qa run --dataset "$dataset" --model "$model" --limit "$limit" --batch-size 8 \
      "${methods[@]}" "$@" --out results/qa
done
# calibrations of every kept model from these rows (no model loaded; minutes): docs/calibration.md
"$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )" \
    scripts/calibration_results.py --qa results/qa --out results/calibration
"$ISOUQ" report results/validation results/scaling results/scaling_vi_fan_in results/proxy_bias_2d \
    results/proxy_bias_text results/qa results/calibration/summary --out results/report
