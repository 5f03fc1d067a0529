#!/usr/bin/env bash
# isouq qa long for the three embedded models, in rounds: every model gets STEP more prompts
# per round (so a run stopped at any time leaves data for each model), up to all 210 prompts
# (--questions 1050). Resumable: run it again and it continues where it stopped.
#
#   nice -n 19 bash scripts/qa_long.sh composed      # the model's own short answers
#   nice -n 19 bash scripts/qa_long.sh generated     # the model's answers to the prompts
#   MODELS="smollm2" STEP=40 nice -n 19 bash scripts/qa_long.sh composed
#
# The two settings may run at the same time (their rows are separate files; results.json,
# tables.md and the figure are rewritten one process at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
SETTING=${1:?give composed or generated}
OUT=${OUT:-results/qa_long}
MODELS=${MODELS:-"smollm2 gemma3-270m qwen2.5-coder-0.5b"}
STEP=${STEP:-20}
TOTAL=${TOTAL:-210}
for ((n = STEP; n < TOTAL + STEP; n += STEP)); do
  (( n > TOTAL )) && n=$TOTAL
  for m in $MODELS; do
    .venv/bin/isouq qa long --model "$m" --settings "$SETTING" --answers "$n" --out "$OUT" "${@:2}"
  done
done
