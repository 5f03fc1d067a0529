#!/usr/bin/env bash
# The working tree that travels to a lent GPU machine is limited to 64 MiB (tracked files,
# untracked files git does not ignore, carried paths such as .gpu/), and results/ alone holds
# about 100 MB of kept evidence. The GPU checks read none of it (scripts/gpu_check.sh reads
# src/, tests/, benchmarks/ and .gpu/), so for the time of the device calls git stops tracking
# it: its files leave the index (nothing on disk changes) and .git/info/exclude ignores them.
#
#   bash scripts/gpu_slim.sh size   # what would travel now, in MiB
#   bash scripts/gpu_slim.sh on     # results/ out of what travels (refused with changes there)
#   bash scripts/gpu_slim.sh off    # results/ tracked again, as committed
#
# Between on and off, commit nothing under results/ (git would record its removal); the
# background runs may go on writing there: off shows what they wrote as changes, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
MARK="# scripts/gpu_slim.sh on: results/ out of what travels, until gpu_slim.sh off"

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
    if grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null; then echo "already on" >&2; size; exit 0; fi
    if [ -n "$(git status --porcelain -- results)" ]; then
      echo "results/ has changes git does not hold: commit them (or stop what writes them) first" >&2
      exit 2
    fi
    git rm -r -q --cached -- results
    mkdir -p "$(dirname "$EXCLUDE")"
    printf '%s\n/results/\n' "$MARK" >> "$EXCLUDE"
    size ;;
  off)
    if grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null; then
      # the mark and the pattern after it
      awk -v m="$MARK" '$0 == m {skip = 1; next} skip && $0 == "/results/" {skip = 0; next}
                        {skip = 0; print}' "$EXCLUDE" > "$EXCLUDE.tmp"
      mv "$EXCLUDE.tmp" "$EXCLUDE"
    fi
    git reset -q -- results
    size ;;
  *) echo "usage: $0 size|on|off" >&2; exit 2 ;;
esac
