#!/usr/bin/env bash
# The QA evidence study with exact or lexical labels (docs/qa-evidence.md): TruthfulQA MC1 for
# the three offline models (the first 400 questions of each first, then all 817) and TriviaQA
# short answers (SmolLM2 100 early, then 1,000; the others 500). Every run is resumable: re-run this
# script to continue after an interruption; finished rows are skipped without recomputation.
# CPU hours: run it in the background, e.g.
#   ISOUQ_THREADS=1 nohup nice -n 19 bash scripts/qa_evidence.sh > qa_evidence.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
ISOUQ="${ISOUQ:-$( [ -x .venv/bin/isouq ] && echo .venv/bin/isouq || echo isouq )}"
MODELS=(smollm2 gemma3-270m qwen2.5-coder-0.5b)
for m in "${MODELS[@]}"; do "$ISOUQ" models --fetch "$m" >/dev/null 2>&1 || true; done
mc() { echo "=== qa mc $1 --limit $2 ($(date -u))"; "$ISOUQ" qa mc --model "$1" --limit "$2" --out results/qa_mc; }
short() { echo "=== qa short $1 --limit $2 ($(date -u))"; "$ISOUQ" qa short --model "$1" --limit "$2" --out results/qa_short; }
mc smollm2 400
short smollm2 100
mc gemma3-270m 400
mc qwen2.5-coder-0.5b 400
for m in "${MODELS[@]}"; do mc "$m" 817; done
short smollm2 1000
short gemma3-270m 500
short qwen2.5-coder-0.5b 500
"$ISOUQ" report results/qa_mc results/qa_short --n-bootstrap 2000 --out results/report_evidence
