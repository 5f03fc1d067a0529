#!/usr/bin/env bash
# LM-Polygraph's polygraph_eval on isouq's three embedded models × TriviaQA and TruthfulQA,
# fully offline, isouq's estimators beside LM-Polygraph's white-box ones (docs/polygraph.md).
#
#   bash scripts/polygraph_benchmark.sh [--limit 500] [--chunk 24] [--models "smollm2 ..."] \
#        [--datasets "triviaqa truthfulqa"] [--config configs/polygraph/polygraph_eval.yaml] \
#        [--after 500 --results results/polygraph_prereg --prereg configs/preregistration/v1.yaml]
#
# --after M: the seeded questions M+1 to --limit only (those a run of --limit M never saw);
# --results: where the kept files and archived chunks go (default results/polygraph);
# --prereg: the pre-registration file whose SHA-256 the kept files carry.
#
# Resumable, also on a fresh checkout: each chunk of --chunk questions is one polygraph_eval run
# under .cache/polygraph_runs/[<results folder>/]<dataset>__<model>__n<limit>-s<seed>-c<chunk>/chunk-KKK/
# (git-ignored; the folder's name for any --results but results/polygraph),
# archived when it finishes as results/polygraph/chunks/<same name>/chunk-KKK.json (committed);
# an archived chunk is skipped, an unfinished one is run again. Models in turn; within a model,
# chunk by chunk with the datasets alternating. After each chunk the kept results
# results/polygraph/polygraph__<dataset>__<model>.json are rebuilt from every archived chunk
# (scripts/polygraph/collect.py), marked partial until --limit questions are in. Time something
# else beside it with `scripts/quiet.sh run CMD`: the run is stopped meanwhile, and a chunk
# that was stopped keeps its answers but not its seconds (no inflated cost).
# Needs .venv-polygraph (docs/polygraph.md: python3 -m venv .venv-polygraph;
# .venv-polygraph/bin/pip install -c constraints.txt -e ".[polygraph]"; the registry models
# fetched there: .venv-polygraph/bin/isouq models --fetch NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=500; CHUNK=24; SEED=0; AFTER=0; RESULTS=results/polygraph; PREREG=""
MODELS="smollm2 gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b"
DATASETS="triviaqa truthfulqa"
CONFIG=configs/polygraph/polygraph_eval.yaml
while [ $# -gt 0 ]; do
  case "$1" in
    --limit) LIMIT=$2; shift 2;;
    --chunk) CHUNK=$2; shift 2;;
    --seed) SEED=$2; shift 2;;
    --models) MODELS=$2; shift 2;;
    --datasets) DATASETS=$2; shift 2;;
    --config) CONFIG=$2; shift 2;;
    --after) AFTER=$2; shift 2;;
    --results) RESULTS=$2; shift 2;;
    --prereg) PREREG=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
PY=.venv-polygraph/bin/python
EVAL=.venv-polygraph/bin/polygraph_eval
[ -x "$EVAL" ] || { echo "no $EVAL: set up .venv-polygraph first (docs/polygraph.md)" >&2; exit 2; }
# offline: nothing may be downloaded (LM-Polygraph's default metrics and NLI models would try)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_EVALUATE_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
MODELDIR=.cache/polygraph_models; DATADIR=.cache/polygraph_data; RUNDIR=.cache/polygraph_runs
# another --results folder runs apart: a run of the same questions made for another folder
# (another pre-registration's) is never taken for one of this folder's
[ "$RESULTS" = results/polygraph ] || RUNDIR="$RUNDIR/$(basename "$RESULTS")"
# another config (e.g. configs/polygraph/sampling.yaml) runs and keeps its results apart
# (in a --results folder of its own, the names stay plain)
TAG=$(basename "$CONFIG" .yaml)
if [ "$TAG" = polygraph_eval ] || [ "$RESULTS" != results/polygraph ]; then SUFFIX=""; else SUFFIX="__$TAG"; fi
SET="n$LIMIT"; [ "$AFTER" = 0 ] || SET="n$LIMIT-after$AFTER"
$PY scripts/polygraph/export_models.py --out "$MODELDIR" $MODELS
for model in $MODELS; do
  if $PY -c "import json,sys; sys.exit(0 if json.load(open('$MODELDIR/$model/tokenizer_config.json')).get('chat_template') or __import__('os').path.exists('$MODELDIR/$model/chat_template.jinja') else 1)"; then
    style=chat; instruct=true
  else
    style=plain; instruct=false
  fi
  for ds in $DATASETS; do
    $PY scripts/polygraph/prepare_data.py --dataset "$ds" --style "$style" --limit "$LIMIT" \
        --seed "$SEED" --chunk "$CHUNK" --after "$AFTER" --out "$DATADIR"
  done
  # chunk by chunk, the datasets in turn: a run cut short keeps both datasets' first chunks
  nchunks=$(( (LIMIT + CHUNK - 1) / CHUNK ))
  for k in $(seq 0 $((nchunks - 1))); do
    for ds in $DATASETS; do
      name="$ds-$style-$SET-s$SEED-c$CHUNK"
      chunk="$DATADIR/$name/$(printf 'chunk-%03d' "$k")"
      [ -d "$chunk" ] || continue
      run="${ds}__${model}__$SET-s$SEED-c$CHUNK$SUFFIX"
      out="$RUNDIR/$run/$(basename "$chunk")"
      kept="$RESULTS/chunks/$run"
      target=$($PY scripts/polygraph/prepare_data.py --dataset "$ds" --style "$style" \
          --limit "$LIMIT" --seed "$SEED" --after "$AFTER" --count)
      if [ -f "$kept/$(basename "$chunk").json" ]; then continue; fi
      if [ ! -f "$out/done" ]; then
        rm -rf "$out"; mkdir -p "$out"; echo "$(date +%s) ${OMP_NUM_THREADS:-}" > "$out/started"
        echo "[polygraph] $model × $ds: $(basename "$chunk") of $nchunks ($(date +%H:%M:%S))"
        HYDRA_CONFIG="$PWD/$CONFIG" "$EVAL" model.path="$MODELDIR/$model" instruct=$instruct \
            dataset="$chunk" save_path="$out" > "$out/stdout.log" 2>&1
        printf '%s\n' "$name" > "$out/done"
      fi
      $PY scripts/polygraph/collect.py --chunks "$kept" --archive "$out" --data-chunk "$chunk" \
          --data "$DATADIR/$name" --dataset "$ds" --model "$model" --limit "$target" \
          --config "$CONFIG" ${PREREG:+--prereg "$PREREG"} \
          --out "$RESULTS/polygraph__${ds}__${model}$SUFFIX.json"
    done
  done
done
echo "[polygraph] finished ($(date +%H:%M:%S))"
