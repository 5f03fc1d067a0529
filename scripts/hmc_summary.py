"""The compact summary of a resumable HMC size of the scaling study: what git keeps of the run.

The run's checkpoint (``OUT/compact_checkpoints/hmc_w<width>/``, about 40 MB for MLP(1028,1028),
rewritten after every segment of 2 iterations) is a git-ignored cache on the machine that runs
it. This script reads its ``meta.json`` (settings, iterations done, every segment's wall and CPU
seconds and leapfrog steps) and ``OUT/cost.json`` (the cost model of ``scripts/hmc_cost.py``)
and writes ``OUT/hmc_w<width>_summary.json`` (11 kB at 112 iterations, about 170 kB at the end):

- ``done``, ``total``, ``phase``, ``updated``, the fingerprint of the run's settings;
- ``cost_per_iteration``: over the last ``--recent`` segments and over the whole record, the
  wall and CPU seconds an iteration (both chains), the leapfrog steps an iteration per chain
  and the CPU milliseconds a leapfrog step (CPU time is the process's: it does not count time
  the run was stopped or starved, wall time does);
- ``projection``: iterations left, CPU-hours left at the recent CPU seconds an iteration, and
  at the recent CPU milliseconds a step with the cost model's steps an adapted iteration
  (``cost.json``: ``steps_per_iteration``; warmup iterations ``2·warmup_factor − 1`` times an
  adapted one); wall hours at the recent wall seconds an iteration;
- ``segments``: every segment's record, as the checkpoint holds it.

    .venv/bin/python scripts/hmc_summary.py                       # results/scaling, w = 1028
    python3 scripts/hmc_summary.py --out results/scaling --width 1028 --recent 10

Standard library only. Exits 2 with one line when the checkpoint is not there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COMMAND = ("WIDTHS={width} setsid nohup scripts/scaling_hmc.sh > /dev/null 2>&1 < /dev/null &")


def _rate(segments: list[dict]) -> dict:
    """Cost an iteration over ``segments`` (iterations both chains run together)."""
    its = sum(s["stop"] - s["start"] for s in segments)
    timed = [s for s in segments if "cpu_seconds" in s]
    cpu_its = sum(s["stop"] - s["start"] for s in timed)
    cpu = sum(s["cpu_seconds"] for s in timed)
    cpu_steps = sum(s.get("leapfrog_steps", 0) for s in timed)
    steps = sum(s.get("leapfrog_steps", 0) for s in segments)
    wall = sum(s["seconds"] for s in segments)
    return {
        "segments": len(segments), "iterations": its,
        "wall_seconds_per_iteration": round(wall / its, 1) if its else None,
        "cpu_seconds_per_iteration": round(cpu / cpu_its, 1) if cpu_its else None,
        "leapfrog_steps_per_iteration_per_chain": round(steps / its / 2, 1) if its else None,
        "cpu_ms_per_leapfrog_step": round(1e3 * cpu / cpu_steps, 1) if cpu_steps else None,
        "cpu_seconds_per_wall_second": round(
            cpu / sum(s["seconds"] for s in timed), 2) if timed else None,
    }


def summarize(meta: dict, cost: dict | None, *, width: int, recent: int,
              checkpoint_bytes: int) -> dict:
    """The summary of one run from its checkpoint's meta (and the cost model, if any).

    Args:
        meta: the checkpoint's ``meta.json``.
        cost: ``cost.json`` of ``scripts/hmc_cost.py``, or None.
        width: the size's width (MLP(width, width)).
        recent: how many of the last segments set the recent rate.
        checkpoint_bytes: the checkpoint's size on disk.

    Returns:
        The JSON-ready summary (see the module's docstring).
    """
    log = list(meta.get("log") or [])
    fp = meta.get("fingerprint") or {}
    done, total = int(meta["done"]), int(meta["total"])
    warmup = int(fp.get("num_warmup", 0))
    last, whole = _rate(log[-recent:]), _rate(log)
    left = max(total - done, 0)
    w_left, s_left = max(warmup - done, 0), min(left, total - warmup)
    proj: dict = {"iterations_left": left}
    if last["cpu_seconds_per_iteration"] is not None:
        proj["cpu_hours_left_at_recent_rate"] = round(
            last["cpu_seconds_per_iteration"] * left / 3600, 1)
    if last["wall_seconds_per_iteration"] is not None:
        proj["wall_hours_left_at_recent_rate"] = round(
            last["wall_seconds_per_iteration"] * left / 3600, 1)
    model = next((r for r in (cost or {}).get("projection", [])
                  if r.get("n_params") == (fp.get("spec") or {}).get("n_params")), None)
    if model is not None and last["cpu_ms_per_leapfrog_step"] is not None:
        chains = int(fp.get("num_chains", 2))
        adapted = chains * model["steps_per_iteration"] * last["cpu_ms_per_leapfrog_step"] / 1e3
        factor = 2 * cost["warmup_factor"] - 1  # a warmup iteration, against an adapted one
        proj["cost_model_steps_per_iteration"] = model["steps_per_iteration"]
        proj["cost_model_warmup_factor"] = cost["warmup_factor"]
        proj["cpu_hours_left_at_cost_model_steps"] = round(
            adapted * (w_left * factor + s_left) / 3600, 1)
        proj["cost_model_cpu_hours_whole_run"] = model["cpu_hours"]
        proj["cost_model_wall_hours_whole_run_2_cores"] = model["wall_hours_2_cores"]
    return {
        "what": f"MLP({width},{width}) HMC of the scaling study: progress and measured cost, from "
                "its checkpoint's meta.json (the checkpoint is a git-ignored cache)",
        "checkpoint": f"compact_checkpoints/hmc_w{width}",
        "checkpoint_mb": round(checkpoint_bytes / 1e6, 1),
        "command": COMMAND.format(width=width),
        "done": done, "total": total, "num_warmup": warmup,
        "phase": "warmup" if done < warmup else "sampling",
        "updated": meta.get("updated"),
        "wall_hours_so_far": round(float(meta.get("seconds", 0.0)) / 3600, 2),
        "cpu_hours_so_far": round(sum(s.get("cpu_seconds", 0.0) for s in log) / 3600, 2),
        "leapfrog_steps": sum(s.get("leapfrog_steps", 0) for s in log),
        "cost_per_iteration": {"recent": last, "all": whole},
        "projection": proj,
        "fingerprint": fp,
        "segments": log,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/scaling"),
                    help="the scaling study's folder (default results/scaling)")
    ap.add_argument("--width", type=int, default=1028)
    ap.add_argument("--recent", type=int, default=10,
                    help="the last segments that set the recent rate (default 10)")
    args = ap.parse_args(argv)
    ck = args.out / "compact_checkpoints" / f"hmc_w{args.width}"
    if not (ck / "meta.json").is_file():
        print(f"hmc_summary: no checkpoint in {ck} (no meta.json); run this on the machine that "
              "runs the size, or start it there first", file=sys.stderr)
        return 2
    if args.recent < 1:
        print(f"hmc_summary: --recent must be ≥ 1, got {args.recent}", file=sys.stderr)
        return 2
    meta = json.loads((ck / "meta.json").read_text())
    cost_file = args.out / "cost.json"
    cost = json.loads(cost_file.read_text()) if cost_file.is_file() else None
    names = ["meta.json", *meta.get("files", []), *meta.get("parts", []),
             *([meta["state"]] if meta.get("state") else [])]
    size = sum((ck / n).stat().st_size for n in names if (ck / n).is_file())
    doc = summarize(meta, cost, width=args.width, recent=args.recent, checkpoint_bytes=size)
    dest = args.out / f"hmc_w{args.width}_summary.json"
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(dest)
    r, p = doc["cost_per_iteration"]["recent"], doc["projection"]
    print(f"{dest}: {doc['done']:,} of {doc['total']:,} iterations ({doc['phase']}); last "
          f"{r['iterations']} iterations: {r['wall_seconds_per_iteration']} s wall, "
          f"{r['cpu_seconds_per_iteration']} s CPU an iteration; about "
          f"{p.get('cpu_hours_left_at_recent_rate')} CPU-hours left at that rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
