#!/usr/bin/env bash
# The scaling study's large HMC sizes in the background, resumable (docs/scaling.md).
#
#   scripts/scaling_hmc.sh                 # MLP(256,256) then MLP(512,512) into results/scaling
#   WIDTHS="1028" scripts/scaling_hmc.sh   # another size
#
# Runs `isouq experiment scaling --study hmc --sizes $WIDTHS` at the kept study's settings
# (1000 warmup + 1000 draws per chain, 2 chains, 50x50 grid, seed 0) with nice 19, appending
# to $OUT/hmc_background.log. Each size checkpoints its sampler every few minutes under
# $OUT/checkpoints/hmc_w<width>/ (git-ignored); kill it at any time and run this script again
# to resume exactly where the last checkpoint left off. On a new checkout, a size with no live
# checkpoint starts from its snapshot in git, $OUT/checkpoint_snapshot/hmc_w<width>/, if any
# (docs/scaling.md: a consistent copy of a checkpoint, taken while the run writes it). A
# finished size becomes one row of $OUT/sizes.jsonl and results.json, tables.md and
# scaling.png are rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/scaling}
WIDTHS=${WIDTHS:-256 512}
mkdir -p "$OUT"
for w in $WIDTHS; do
  snap="$OUT/checkpoint_snapshot/hmc_w$w" live="$OUT/checkpoints/hmc_w$w"
  if [ -f "$snap/meta.json" ] && [ ! -f "$live/meta.json" ]; then
    mkdir -p "$OUT/checkpoints" && rm -rf "$live" && cp -r "$snap" "$live"
    echo "== $(date -u +%FT%TZ) hmc_w$w: no live checkpoint; resuming from the snapshot in git" \
      >> "$OUT/hmc_background.log"
  fi
done
echo "== $(date -u +%FT%TZ) start: widths $WIDTHS (pid $$)" >> "$OUT/hmc_background.log"
# shellcheck disable=SC2086
nice -n 19 .venv/bin/isouq experiment scaling --study hmc --sizes $WIDTHS --out "$OUT" \
    >> "$OUT/hmc_background.log" 2>&1
echo "== $(date -u +%FT%TZ) finished" >> "$OUT/hmc_background.log"
