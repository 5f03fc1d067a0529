#!/usr/bin/env bash
# The scaling study's large HMC sizes in the background, resumable (docs/scaling.md).
#
#   setsid nohup scripts/scaling_hmc.sh > /dev/null 2>&1 < /dev/null &   # MLP(256,256), MLP(512,512)
#   WIDTHS=1028 setsid nohup scripts/scaling_hmc.sh > /dev/null 2>&1 < /dev/null &
#   scripts/scaling_hmc.sh summary          # what git keeps of MLP(1028,1028)'s progress (below)
#
# Runs `isouq experiment scaling --study hmc --sizes $WIDTHS` at the kept study's settings
# (1000 warmup + 1000 draws per chain, 2 chains, 50x50 grid, seed 0) at the lowest priority
# (nice 19), appending to $OUT/hmc_background.log. Kill it at any time and run this script
# again to resume exactly where the last checkpoint left off.
#
# Checkpoints are a cache on the machine that runs the size, never committed (.gitignore;
# scripts/check_repo_size.py fails CI on a tracked file over 2 MB). MLP(1028,1028) (above
# 500,000 parameters) runs compact: no draws, running sums of the predictive statistics, about
# 40 MB in $OUT/compact_checkpoints/hmc_w1028/, written atomically after every segment
# (2 iterations, a few minutes). It takes days of CPU (docs/scaling.md): run it on a machine
# that can keep it that long; to move it, stop it after a checkpoint and copy that folder.
# `scripts/scaling_hmc.sh summary` writes what git keeps of it: the progress row
# (`isouq experiment scaling --out $OUT --progress`: results.json, tables.md) and
# $OUT/hmc_w1028_summary.json (scripts/hmc_summary.py: iterations done, the measured cost an
# iteration, the hours left, every segment's record; about 170 kB at the end of the run);
# commit those paths by hand.
# Smaller sizes checkpoint their draws under $OUT/checkpoints/hmc_w<width>/ (git-ignored); a
# size with no live checkpoint starts from a copy in $OUT/checkpoint_snapshot/hmc_w<width>/,
# if any (docs/scaling.md).
#
# Stop it while anything is timed (a benchmark, a timing test): it runs in its own process
# group, whose id is in $PIDFILE (default runs/scaling_hmc.pid), and
#   scripts/hmc_pause.sh stop      # kill -STOP -- -<pgid>: every process of the run halts
#   scripts/hmc_pause.sh cont      # kill -CONT -- -<pgid>
#   scripts/hmc_pause.sh run CMD…  # stop, run CMD, continue (also when CMD fails)
# A stopped run keeps its memory and resumes mid-segment; the CPU seconds it records per
# segment do not count the stop (the wall seconds do).
#
# A finished size becomes one row of $OUT/sizes.jsonl and results.json, tables.md and
# scaling.png are rebuilt.
#
# The whole script is one function, read before it runs: editing this file while a run uses it
# does not change what that run does.
set -euo pipefail

summary() {  # what git keeps of the run: the progress row and the compact summary
  nice -n 19 .venv/bin/isouq experiment scaling --out "$OUT" --progress
  .venv/bin/python scripts/hmc_summary.py --out "$OUT" --width 1028
  echo "commit with: git commit -m '...' -- $OUT/hmc_w1028_summary.json $OUT/results.json $OUT/tables.md $OUT/hmc_background.log"
}

main() {
  cd "$(dirname "$0")/.."
  OUT=${OUT:-results/scaling}
  if [ "${1:-}" = summary ]; then
    summary
    return
  fi
  if [ "${1:-}" = commit ]; then
    echo "scaling_hmc.sh: checkpoints are no longer committed; run 'scripts/scaling_hmc.sh summary' and commit its files" >&2
    return 2
  fi
  # its own process group (hmc_pause.sh signals the whole group, never the caller's shell)
  if [ "$(ps -o pgid= $$ | tr -d ' ')" != "$$" ]; then
    exec setsid bash "scripts/scaling_hmc.sh" "$@"
  fi
  WIDTHS=${WIDTHS:-256 512}
  PIDFILE=${PIDFILE:-runs/scaling_hmc.pid}
  mkdir -p "$OUT" "$(dirname "$PIDFILE")"
  echo $$ > "$PIDFILE"
  trap 'rm -f "$PIDFILE"' EXIT
  for w in $WIDTHS; do
    snap="$OUT/checkpoint_snapshot/hmc_w$w" live="$OUT/checkpoints/hmc_w$w"
    if [ -f "$snap/meta.json" ] && [ ! -f "$live/meta.json" ]; then
      mkdir -p "$OUT/checkpoints" && rm -rf "$live" && cp -r "$snap" "$live"
      echo "== $(date -u +%FT%TZ) hmc_w$w: no live checkpoint; resuming from the snapshot in git" \
        >> "$OUT/hmc_background.log"
    fi
  done
  echo "== $(date -u +%FT%TZ) start: widths $WIDTHS (pid $$, process group $$)" >> "$OUT/hmc_background.log"
  # shellcheck disable=SC2086
  nice -n 19 .venv/bin/isouq experiment scaling --study hmc --sizes $WIDTHS --out "$OUT" \
      >> "$OUT/hmc_background.log" 2>&1
  echo "== $(date -u +%FT%TZ) finished" >> "$OUT/hmc_background.log"
}

main "$@"; exit $?  # one line: bash has read it all before main runs
