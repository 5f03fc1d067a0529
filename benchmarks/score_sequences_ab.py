"""Benchmark: ghost/floor of an earlier commit against this checkout, run in turn.

On a shared CPU the floor itself drifts by several percent within an hour, so a before/after
read from two tables measured at different times mixes the code's change with the machine's.
This runs both sides in turn: in each round, the earlier commit's own
``benchmarks/score_sequences.py`` (in a temporary ``git worktree``, its ``src/`` first on the
path), then this checkout's, each a fresh ``score_sequences.py`` run of ``--methods`` (default
floor and ghost, each method in its own process) at ``--batch-sizes``; and reports every run's
ghost/floor beside the other side's.

    python benchmarks/score_sequences_ab.py --before 1eb079b --rounds 3 --out benchmarks/results

Writes ``score_sequences_ab.json`` (+ ``.md``; ``--tag`` adds a suffix): both commits, each
run's rows and ratios as ``score_sequences.py`` wrote them, and per batch size the ghost/floor
of every round on each side with their medians. Extra arguments after ``--`` go to both sides'
``score_sequences.py`` (e.g. ``-- --repeats 5``); both sides must accept them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("before", "after")


def git(*args: str, cwd: Path = ROOT) -> str:
    """stdout of ``git args`` in ``cwd``, stripped; CalledProcessError on failure."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def run_side(tree: Path, out: Path, batch_sizes: list[int], methods: list[str],
             extra: list[str]) -> dict:
    """One ``score_sequences.py`` run of ``tree`` (its own script and ``src/``): its JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [
        env.get("PYTHONPATH")])])
    if "ISOUQ_DATA" not in env:  # a worktree outside this checkout does not see shared/data
        from isouq.data.qa import data_root

        env["ISOUQ_DATA"] = str(data_root())
    cmd = [sys.executable, str(tree / "benchmarks" / "score_sequences.py"), "--batch-sizes",
           *map(str, batch_sizes), "--methods", *methods, "--out", str(out), *extra]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "score_sequences.json").read_text())


def ghost_floor(doc: dict) -> dict[int, float]:
    """batch size -> ghost/floor of one ``score_sequences.py`` run."""
    return {r["batch"]: r["ghost/floor"] for r in doc["ratios"] if "ghost/floor" in r}


def summarize(runs: list[dict], batch_sizes: list[int]) -> list[dict]:
    """Per batch size: each side's ghost/floor by round and its median, and after / before."""
    rows = []
    for b in batch_sizes:
        row: dict = {"batch": b}
        for side in SIDES:
            vals = [r["ghost/floor"][b] for r in runs if r["side"] == side]
            row[f"{side} ghost/floor by round"] = ", ".join(f"{v:.2f}" for v in vals)
            row[f"{side} median"] = statistics.median(vals)
        row["after / before (medians)"] = row["after median"] / row["before median"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, metavar="REV", help="the earlier commit")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--methods", nargs="+", default=["floor", "ghost"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default=None, help="suffix of the result files' names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("extra", nargs="*", help="after --: more arguments for both sides")
    a = ap.parse_args()
    if not {"floor", "ghost"} <= set(a.methods):
        ap.error("--methods must include floor and ghost (ghost/floor is what is compared)")
    try:
        before = git("rev-parse", "--short", f"{a.before}^{{commit}}")
    except subprocess.CalledProcessError:
        ap.error(f"--before {a.before}: not a commit of this repository (git rev-parse)")
    after = git("rev-parse", "--short", "HEAD")
    # what the after side runs: src/ and the benchmark scripts, as they are in the working tree
    dirty = bool(git("status", "--porcelain", "--", "src", "benchmarks/*.py"))
    # killed (SIGTERM): the finally blocks still remove the temporary worktree
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="isouq-ab-") as tmp:
        tree = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(tree), before)
        try:
            for rnd in range(1, a.rounds + 1):
                for side in SIDES:
                    doc = run_side(tree if side == "before" else ROOT, Path(tmp) / f"{side}{rnd}",
                                   a.batch_sizes, a.methods, a.extra)
                    gf = ghost_floor(doc)
                    runs.append({"side": side, "round": rnd, "ghost/floor": gf,
                                 "rows": doc["rows"], "ratios": doc["ratios"]})
                    print(f"round {rnd} {side:>6}: ghost/floor "
                          + ", ".join(f"batch {b} {v:.3f}" for b, v in gf.items()), flush=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
    summary = summarize(runs, a.batch_sizes)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "before": before, "after": after + ("+uncommitted" if dirty else ""),
           "batch_sizes": a.batch_sizes, "methods": a.methods, "rounds": a.rounds,
           "extra": a.extra, "summary": summary, "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "score_sequences_ab" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    from isouq.runio import markdown_table

    md = (f"# ghost/floor, {before} (before) against {doc['after']} (after), in turn\n\n"
          f"{doc['date']}, {doc['machine']}; {a.rounds} round(s)\n\n" + markdown_table(summary))
    (out / f"{stem}.md").write_text(md)
    print(markdown_table(summary))


if __name__ == "__main__":
    main()
