#!/usr/bin/env bash
# The working tree that travels to a lent GPU machine is limited to 64 MiB (tracked files,
# untracked files git does not ignore, carried paths such as .gpu/), and results/ alone holds
# about 100 MB of kept evidence. The GPU checks read none of it (scripts/gpu_check.sh reads
# src/, tests/, benchmarks/ and .gpu/), so for the time of the device calls it leaves the
# working tree, by git's sparse checkout (the files stay in git; nothing is deleted from it):
#
#   bash scripts/gpu_slim.sh size   # what would travel now, in MiB
#   bash scripts/gpu_slim.sh on     # results/ out of the working tree (refused with changes there)
#   bash scripts/gpu_slim.sh off    # results/ back, as committed
#
# Stop the background runs that write under results/ first (they would write into the folder
# the sparse checkout leaves out): kill their process groups, or keep them stopped meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."

size() {  # MiB of what travels: tracked files on disk, untracked ones not ignored, and .gpu/
  local files gpu=0
  files=$(git ls-files -z --cached --others --exclude-standard |
          xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
  [ -d .gpu ] && gpu=$(du -sb .gpu | cut -f1)
  awk -v f="$files" -v g="$gpu" 'BEGIN {printf "%.1f MiB (working tree %.1f, .gpu %.1f; limit 64)\n",
      (f + g) / 2^20, f / 2^20, g / 2^20}'
}

case "${1:-size}" in
  size) size ;;
  on)
    if [ -n "$(git status --porcelain -- results)" ]; then
      echo "results/ has changes git does not hold: commit them (or stop what writes them) first" >&2
      exit 2
    fi
    git sparse-checkout set --no-cone '/*' '!/results/'
    size ;;
  off)
    git sparse-checkout disable
    size ;;
  *) echo "usage: $0 size|on|off" >&2; exit 2 ;;
esac
