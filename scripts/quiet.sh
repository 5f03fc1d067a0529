#!/usr/bin/env bash
# Stop the background runs while something is timed, and log when they were stopped.
#
#   scripts/quiet.sh run CMD [ARG…]   # stop them all, run CMD, continue them (also on failure)
#   scripts/quiet.sh status           # which background runs there are, running or stopped
#
# The background runs are the long resumable scripts: scaling_hmc.sh, polygraph_benchmark.sh and
# qa_long.sh (each in its own process group, as `setsid nohup bash scripts/NAME.sh …` starts
# them). `run` sends SIGSTOP to each group, runs CMD, sends SIGCONT, and appends one line
# "START END" (seconds since the epoch) to runs/pauses.log: the polygraph benchmark keeps no
# seconds of a chunk that ran during a pause (scripts/polygraph/collect.py --pauses), so its
# costs are never inflated by a stop.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${PAUSES:-runs/pauses.log}
NAMES=${QUIET_NAMES:-"scaling_hmc.sh polygraph_benchmark.sh qa_long.sh"}

groups() {  # the process group of every background run found, one per line
  local name pid g
  for name in $NAMES; do
    for pid in $(pgrep -f "scripts/$name" || true); do
      g=$(ps -o pgid= "$pid" | tr -d ' ')
      [ "$g" = "$pid" ] && echo "$g $name"
    done
  done
}

case "${1:-}" in
  status)
    groups | while read -r g name; do
      case "$(ps -o stat= "$g" | tr -d ' ')" in
        T*) echo "$name: stopped (process group $g)" ;;
        *) echo "$name: running (process group $g)" ;;
      esac
    done ;;
  run)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 run CMD [ARG…]" >&2; exit 2; }
    mkdir -p "$(dirname "$LOG")"
    found=$(groups)
    start=$(date +%s)
    cont() {
      local g name
      while read -r g name; do
        [ -n "$g" ] && kill -CONT -- "-$g" 2>/dev/null || true
      done <<< "$found"
      echo "$start $(date +%s)" >> "$LOG"
    }
    trap cont EXIT
    while read -r g name; do
      [ -n "$g" ] || continue
      kill -STOP -- "-$g" && echo "quiet: stopped $name (process group $g)" >&2
    done <<< "$found"
    "$@" ;;
  *) echo "usage: $0 run CMD [ARG…] | status" >&2; exit 2 ;;
esac
