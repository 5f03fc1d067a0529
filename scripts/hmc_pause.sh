#!/usr/bin/env bash
# Stop and continue the background HMC run (scripts/scaling_hmc.sh) while something is timed.
#
#   scripts/hmc_pause.sh stop             # SIGSTOP its process group: it halts where it is
#   scripts/hmc_pause.sh cont             # SIGCONT: it goes on
#   scripts/hmc_pause.sh status           # running, stopped, or not running
#   scripts/hmc_pause.sh run CMD [ARG…]   # stop, run CMD, continue (also on failure or Ctrl-C)
#
# scripts/scaling_hmc.sh runs in its own process group and writes that group's id to
# $PIDFILE (default runs/scaling_hmc.pid); without the file (no run) every command but
# `status` does nothing and `run` just runs CMD. Signals go to that group only.
set -euo pipefail
cd "$(dirname "$0")/.."
PIDFILE=${PIDFILE:-runs/scaling_hmc.pid}

pgid() {  # the run's process group id, if it is alive and really its own group
  [ -f "$PIDFILE" ] || return 1
  local g
  g=$(tr -dc 0-9 < "$PIDFILE")
  [ -n "$g" ] && kill -0 "$g" 2>/dev/null || return 1
  [ "$(ps -o pgid= "$g" | tr -d ' ')" = "$g" ] || return 1
  ps -o args= "$g" | grep -q scaling_hmc || return 1  # a stale file: the id was reused
  echo "$g"
}

signal() {
  local g
  if g=$(pgid); then
    kill "-$1" -- "-$g"
    echo "hmc_pause: SIG$1 to process group $g"
  else
    echo "hmc_pause: no background HMC run ($PIDFILE)"
  fi
}

case "${1:-}" in
  stop) signal STOP ;;
  cont) signal CONT ;;
  status)
    if g=$(pgid); then
      state=$(ps -o stat= "$g" | tr -d ' ')
      case "$state" in T*) echo "stopped (process group $g)" ;; *) echo "running (process group $g)" ;; esac
    else
      echo "not running"
    fi ;;
  run)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 run CMD [ARG…]" >&2; exit 2; }
    signal STOP
    trap 'signal CONT' EXIT
    "$@" ;;
  *) echo "usage: $0 stop|cont|status|run CMD [ARG…]" >&2; exit 2 ;;
esac
