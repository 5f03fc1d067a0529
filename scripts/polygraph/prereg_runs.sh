#!/usr/bin/env bash
# The pre-registered fresh runs (configs/preregistration/v1.yaml to v4.yaml),
# resumable on any checkout: each pre-registration's answers are made and fitted by the code of
# the commit fixed for it (CODE below, a git worktree under .cache/prereg_code/, with this
# checkout's results/, .cache/ and .venv-polygraph linked in), small models first. For each
# answer set, its questions as the pre-registration's fresh_sets give them: the LM-Polygraph
# benchmark (scripts/polygraph_benchmark.sh: archived chunks are skipped), then, once it is
# complete, its features (scripts/polygraph/features.py --rows-only) and its pre-registered fit
# (scripts/polygraph/prereg_verdict.py --fit; done sets are skipped).
#
#   setsid nohup bash scripts/polygraph/prereg_runs.sh > runs/prereg.log 2>&1 &
#
# With arguments, only the runs named, as PREREG:MODEL (e.g. v2:gemma3-270m): a second runner
# on a second core takes other runs than the first (two runners on one run would collide).
#
# Needs .venv-polygraph with the four models (docs/polygraph.md). Days on a 2-core CPU for the
# 1.5B model; stop it at any time. Then, in the main venv, the verdict from the kept files:
#   .venv/bin/python scripts/polygraph/prereg_verdict.py --prereg configs/preregistration/v1.yaml
# (v3.yaml's family holds v2's SmolLM2 sets, v4.yaml's v1's sets but the 1.5B model's).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
declare -A CODE=([v1]=166e1762c8d2829ff6622408b152fce5a7ebb84d
                 [v2]=f3613774badf5178040190d56e4b14b3174838e1
                 [v3]=21d66add7dac92ebcac3f32e37fc7dbad2ab0fd7
                 [v4]=54cc1b0eb0809e7025e1807eb2541d229eeebc5d)
declare -A RESULTS=([v1]=results/polygraph_prereg [v2]=results/polygraph_tasks_prereg
                    [v3]=results/polygraph_tasks_prereg_v3 [v4]=results/polygraph_prereg_v4)
declare -A CONFIG=([v1]=configs/polygraph/polygraph_eval.yaml [v2]=configs/polygraph/tasks.yaml
                   [v3]=configs/polygraph/tasks.yaml [v4]=configs/polygraph/polygraph_eval.yaml)

questions() {  # questions PREREG MODEL DATASET: "--limit L --after A" of its fresh_sets
  python3 - "configs/preregistration/$1.yaml" "$2" "$3" <<'PY'
import re, sys
# fresh_sets.DATASET (v1, v2) or fresh_sets.runs.MODEL.DATASET (v3), a one-line flow mapping;
# read without PyYAML so that this script runs on a bare python3
text, model, ds = open(sys.argv[1], encoding="utf-8").read(), sys.argv[2], sys.argv[3]
runs = text.split("\n  runs:\n", 1)
if len(runs) == 2:
    text = re.split(rf"^    {re.escape(model)}:\n", runs[1], maxsplit=1, flags=re.M)[1]
line = re.search(rf"^ +{re.escape(ds)}: \{{limit: (\d+), after: (\d+)", text, re.M)
print(f"--limit {line[1]} --after {line[2]}")
PY
}

code() {  # the worktree of pre-registration $1's commit, made once
  local d=.cache/prereg_code/$1
  if [ ! -d "$d" ]; then
    git worktree add --detach "$d" "${CODE[$1]}" >/dev/null
    rm -rf "$d/results" && ln -s "$ROOT/results" "$d/results"
    ln -s "$ROOT/.cache" "$d/.cache" && ln -s "$ROOT/.venv-polygraph" "$d/.venv-polygraph"
  fi
  echo "$d"
}

run() {  # run PREREG MODEL DATASET...: each set's benchmark, then once complete its features and fit
  local v=$1 model=$2; shift 2
  local d; d=$(code "$v")
  for ds in "$@"; do
    # shellcheck disable=SC2046  # the options are words
    (cd "$d" && PYTHONPATH="$PWD/src" bash scripts/polygraph_benchmark.sh \
        $(questions "$v" "$model" "$ds") --config "${CONFIG[$v]}" --models "$model" \
        --datasets "$ds" --results "${RESULTS[$v]}" --prereg "configs/preregistration/$v.yaml")
    local f=${RESULTS[$v]}/polygraph__${ds}__${model}.json
    python3 -c "import json,sys; sys.exit(0 if json.load(open('$f')).get('complete') else 1)" \
        || continue
    [ -f "${RESULTS[$v]}/verdict/${ds}__${model}.oof.json" ] && continue
    (cd "$d" && PYTHONPATH="$PWD/src" .venv-polygraph/bin/python scripts/polygraph/features.py \
        --results "${RESULTS[$v]}" --models "$model" --datasets "$ds" --rows-only \
     && PYTHONPATH="$PWD/src" .venv-polygraph/bin/python scripts/polygraph/prereg_verdict.py \
        --prereg "configs/preregistration/$v.yaml" --fit --sets "${ds}__${model}")
  done
}

declare -A DATASETS=([v1:smollm2]=truthfulqa [v1:qwen2.5-coder-0.5b]=truthfulqa
                     [v4:qwen2.5-coder-1.5b]="truthfulqa triviaqa")
# v2's Gemma and Qwen sets are v3's (results/polygraph_tasks_prereg/void/README.md), and v1's
# 1.5B sets v4's: the earlier code kept pad tokens in the answers
ORDER=(v1:smollm2 v1:qwen2.5-coder-0.5b v2:smollm2 v3:gemma3-270m v3:qwen2.5-coder-0.5b
       v4:qwen2.5-coder-1.5b v3:qwen2.5-coder-1.5b)
for r in "$@"; do
  [[ " ${ORDER[*]} " == *" $r "* ]] || { echo "[prereg] no run '$r'; the runs: ${ORDER[*]}"; exit 2; }
done
for r in "${@:-${ORDER[@]}}"; do
  # shellcheck disable=SC2086  # the datasets are words
  run "${r%%:*}" "${r#*:}" ${DATASETS[$r]:-compare units truthfulqa-mc1}
done
echo "[prereg] finished ($(date +%H:%M:%S))"
