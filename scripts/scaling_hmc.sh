#!/usr/bin/env bash
# The scaling study's large HMC sizes in the background, resumable (docs/scaling.md).
#
#   setsid nohup scripts/scaling_hmc.sh > /dev/null 2>&1 < /dev/null &   # MLP(256,256), MLP(512,512)
#   WIDTHS=1028 setsid nohup scripts/scaling_hmc.sh > /dev/null 2>&1 < /dev/null &
#   scripts/scaling_hmc.sh commit [MESSAGE]   # keep MLP(1028,1028)'s progress in git (below)
#
# Runs `isouq experiment scaling --study hmc --sizes $WIDTHS` at the kept study's settings
# (1000 warmup + 1000 draws per chain, 2 chains, 50x50 grid, seed 0) at the lowest priority
# (nice 19), appending to $OUT/hmc_background.log. Kill it at any time and run this script
# again to resume exactly where the last checkpoint left off.
#
# Checkpoints. MLP(1028,1028) (above 500,000 parameters) runs compact: no draws, running sums
# of the predictive statistics, under 50 MB in $OUT/compact_checkpoints/hmc_w1028/, written
# atomically after every segment (2 iterations, a few minutes) and KEPT IN GIT: a new checkout
# resumes from the last committed one. `scripts/scaling_hmc.sh commit` keeps it: it refreshes
# the progress row (`isouq experiment scaling --out $OUT --progress`), the hmc_in_progress
# table and the "How far it is" paragraph of docs/scaling.md, then, with the run stopped for
# the moment git reads the files (hmc_pause.sh), adds the checkpoint folder and commits it with
# $OUT/results.json, tables.md, hmc_background.log and docs/scaling.md (those paths only).
# Each commit adds the checkpoint files that changed (16-50 MB): every few hours is enough.
# Smaller sizes checkpoint their draws under $OUT/checkpoints/hmc_w<width>/ (git-ignored); a
# size with no live checkpoint starts from its snapshot in git,
# $OUT/checkpoint_snapshot/hmc_w<width>/, if any (docs/scaling.md).
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

docs_progress() {  # docs/scaling.md: the hmc_in_progress table and the "How far it is" paragraph
  .venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path

sys.path.insert(0, "tools")  # tools/docs_tables.py: repository tooling, not in the package
import docs_tables as dt

out, doc = Path(sys.argv[1]), Path("docs/scaling.md")
text, _ = dt.replace_blocks(doc.read_text(), lambda name: dt.render(name, "."), str(doc))
meta_file = out / "compact_checkpoints/hmc_w1028/meta.json"
rows = json.loads((out / "results.json").read_text())["tables"].get("hmc_in_progress", [])
row = next((r for r in rows if r["n_params"] == 1_065_012), None)
if row is None or not meta_file.exists() or not json.loads(meta_file.read_text())["log"]:
    doc.write_text(text)
    sys.exit(print("scaling_hmc.sh: MLP(1028,1028) is not in progress; docs tables only"))
meta = json.loads(meta_file.read_text())
log = meta["log"][-10:]
its = sum(s["stop"] - s["start"] for s in log)
timed = [s for s in log if "cpu_seconds" in s]
cpu_s = sum(s["cpu_seconds"] for s in timed)
wall, cpu = sum(s["seconds"] for s in log) / its, cpu_s / sum(s["stop"] - s["start"] for s in timed)
steps = sum(s["leapfrog_steps"] for s in log) / its / 2
ms = 1e3 * cpu_s / sum(s["leapfrog_steps"] for s in timed)
done, total = meta["done"], meta["total"]
warmup = int(meta["fingerprint"]["num_warmup"])
phase = f"warmup runs to {warmup:,}" if done < warmup else f"sampling since {warmup:,}"
cost = json.loads((out / "cost.json").read_text())
model = next(r for r in cost["projection"] if r["n_params"] == 1_065_012)
# CPU left at the measured CPU ms a step and cost.json's steps an iteration once adapted, the
# warmup's iterations longer by its factor (1.15 over the run: 1.3 for a warmup iteration)
per_it = 2 * model["steps_per_iteration"] * ms / 1e3
w_left, s_left = max(warmup - done, 0), min(total - done, total - warmup)
cpu_left = per_it * (w_left * (2 * cost["warmup_factor"] - 1) + s_left) / 3600
share = cpu / wall
para = f"""How far it is, from that record (`results.json`, row `hmc_in_progress`, and the
checkpoint's `meta.json`): **{done:,} of {total:,} iterations** per chain ({phase}),
{row['hours_so_far']} wall hours and {row['cpu_hours_so_far']} CPU-hours of sampling so far; the
checkpoint is {row['checkpoint_mb']} MB. Over the last {len(log)} segments ({its} iterations) an
iteration took {wall:,.0f} s of wall time and {cpu:,.0f} s of CPU time (the process's, both
chains), {steps:,.0f} leapfrog steps a chain at {ms:.0f} ms of CPU a step. At that rate **about
{row['hours_left_at_recent_rate']:,} wall hours ({row['cpu_hours_left_at_recent_rate']:,}
CPU-hours) are left**. The steps an iteration fall while the warmup adapts the step size (from
up to 900 a chain in the first iterations); at {ms:.0f} ms a step and the
{model['steps_per_iteration']:.0f} steps an adapted iteration takes in the cost model of
`results/scaling/cost.json` (which undershot the finished w = 256 and 512 runs by 15–42 %),
**about {cpu_left:,.0f} CPU-hours are left, {cpu_left / share:,.0f} wall hours** at the
{share:.2f} CPU-seconds per wall second this run got at nice 19 beside other work (2 would be
both cores). The projection in that file, 200 CPU-hours for the whole run, counts 2 cores'
wall time on the loaded machine, not CPU time.

"""
a = text.find("How far it is, from that record")
b = text.find("### The compact checkpoint of MLP(1028,1028)")
if a < 0 or b < a:
    print("scaling_hmc.sh: docs/scaling.md has no 'How far it is' paragraph; table only")
else:
    text = text[:a] + para + text[b:]
doc.write_text(text)
PY
}

commit() {
  local msg=${1:-"scaling: MLP(1028,1028) HMC progress and compact checkpoint"}
  nice -n 19 .venv/bin/isouq experiment scaling --out "$OUT" --progress
  docs_progress
  MSG=$msg OUT=$OUT scripts/hmc_pause.sh run bash -c '
    git add -- "$OUT/compact_checkpoints" &&
    git commit -q -m "$MSG" -- "$OUT/compact_checkpoints" "$OUT/results.json" "$OUT/tables.md" \
        "$OUT/hmc_background.log" docs/scaling.md'
  git log --oneline -1
}

main() {
  cd "$(dirname "$0")/.."
  OUT=${OUT:-results/scaling}
  if [ "${1:-}" = commit ]; then
    shift
    commit "$@"
    return
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
