"""Benchmark: ghost/floor of an earlier commit against this checkout, run in turn.

On a shared CPU the floor itself drifts by several percent within an hour, so a before/after
read from two tables measured at different times mixes the code's change with the machine's.
This runs both sides in turn, round by round: the earlier commit from a temporary
``git worktree`` (its ``src/`` first on the path), then this checkout. Two modes:

- ``interleaved`` (the default): per side and round, one process loads the model and calls
  the floor and ``score_sequences(method="ghost")`` alternately, ``--repeats`` times each after
  a warm-up (the order swapped every repeat), so both see the same state of the machine; the
  child is this file's own ``--child`` code, which uses only what both sides' ``isouq`` have
  (``load_model``, ``encode``, ``collate``, ``token_probs``, ``summarize``,
  ``score_sequences``);
- ``processes``: per side and round, that side's own ``benchmarks/score_sequences.py`` (each
  method in a process of its own, as in the kept tables, peak memory included); the ratio
  then also carries the difference between two processes (several percent either way).

    python benchmarks/score_sequences_ab.py --before 1eb079b --rounds 3 --out benchmarks/results

Writes ``score_sequences_ab[_TAG].json`` (+ ``.md``): both commits, every run, and per batch
size the ghost/floor of every round on each side with their medians. In ``processes`` mode,
arguments after ``--`` go to both sides' ``score_sequences.py`` (e.g. ``-- --repeats 5``).
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


def side_env(tree: Path) -> dict[str, str]:
    """The environment of a process that runs ``tree``'s ``isouq``: its ``src/`` first on the
    path, and the shipped data found from this checkout (a worktree elsewhere does not see
    ``shared/data`` beside it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [
        env.get("PYTHONPATH")])])
    if "ISOUQ_DATA" not in env:
        from isouq.data.qa import data_root

        env["ISOUQ_DATA"] = str(data_root())
    return env


def run_side(tree: Path, out: Path, batch_sizes: list[int], methods: list[str],
             extra: list[str]) -> dict:
    """One ``score_sequences.py`` run of ``tree`` (its own script and ``src/``): its JSON."""
    env = side_env(tree)
    cmd = [sys.executable, str(tree / "benchmarks" / "score_sequences.py"), "--batch-sizes",
           *map(str, batch_sizes), "--methods", *methods, "--out", str(out), *extra]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "score_sequences.json").read_text())


def run_interleaved(tree: Path, batch_sizes: list[int], repeats: int, model: str) -> dict:
    """One process of ``tree``'s ``isouq`` (this file's ``--child``): per batch size, floor
    and ghost called alternately; {"ghost/floor": {batch: ratio}, "rows": [...]}."""
    env = side_env(tree)
    rows = []
    for b in batch_sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(b), str(repeats), model],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"the {tree} side failed at batch {b}:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"ghost/floor": {r["batch"]: r["ghost/floor"] for r in rows}, "rows": rows}


def child(batch: int, repeats: int, model_name: str) -> dict:
    """Floor and ghost of one batch, alternately in this process: seconds per answer of each
    call, their medians and ghost/floor (the medians' ratio)."""
    import torch

    import isouq
    from floor import floor_and_ghost
    from isouq.models import load_model
    from score_sequences import load_pairs

    torch.set_num_threads(os.cpu_count() or 1)
    model, tok, _ = load_model(model_name)
    prompts, answers = load_pairs(batch)
    fns, b = floor_and_ghost(model, tok, prompts, answers)
    for f in fns.values():
        f()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for k in (("floor", "ghost") if r % 2 == 0 else ("ghost", "floor")):
            t = time.perf_counter()
            fns[k]()
            times[k].append((time.perf_counter() - t) / batch)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "tokens_padded": int(b.input_ids.shape[1]), "src": isouq.__file__,
            "floor_s_per_answer": med["floor"], "ghost_s_per_answer": med["ghost"],
            "ghost/floor": med["ghost"] / med["floor"], "times": times}


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
    ap.add_argument("--before", metavar="REV", help="the earlier commit (required)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--methods", nargs="+", default=["floor", "ghost"],
                    help="processes mode: the methods each side's score_sequences.py runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", default="interleaved", choices=["interleaved", "processes"])
    ap.add_argument("--repeats", type=int, default=10,
                    help="interleaved: timed calls of each method per process")
    ap.add_argument("--model", default="smollm2", help="interleaved: the model scored")
    ap.add_argument("--tag", default=None, help="suffix of the result files' names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", nargs=3, metavar=("BATCH", "REPEATS", "MODEL"),
                    help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="after --: more arguments for both sides "
                    "(processes mode)")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(int(a.child[0]), int(a.child[1]), a.child[2])))
        return
    if a.before is None:
        ap.error("--before REV is required: the earlier commit to run beside this checkout")
    if a.extra and a.mode != "processes":
        ap.error("arguments after -- go to score_sequences.py: use them with --mode processes")
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
                    where = tree if side == "before" else ROOT
                    if a.mode == "interleaved":
                        doc = run_interleaved(where, a.batch_sizes, a.repeats, a.model)
                        gf, extra = doc["ghost/floor"], {"rows": doc["rows"]}
                    else:
                        doc = run_side(where, Path(tmp) / f"{side}{rnd}", a.batch_sizes,
                                       a.methods, a.extra)
                        gf, extra = ghost_floor(doc), {"rows": doc["rows"],
                                                       "ratios": doc["ratios"]}
                    runs.append({"side": side, "round": rnd, "ghost/floor": gf, **extra})
                    print(f"round {rnd} {side:>6}: ghost/floor "
                          + ", ".join(f"batch {b} {v:.3f}" for b, v in gf.items()), flush=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
    summary = summarize(runs, a.batch_sizes)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "before": before, "after": after + ("+uncommitted" if dirty else ""),
           "mode": a.mode, "batch_sizes": a.batch_sizes, "rounds": a.rounds,
           **({"repeats": a.repeats, "model": a.model} if a.mode == "interleaved" else
              {"methods": a.methods, "extra": a.extra}), "summary": summary, "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "score_sequences_ab" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    from isouq.runio import markdown_table

    md = (f"# ghost/floor, {before} (before) against {doc['after']} (after), in turn\n\n"
          f"{doc['date']}, {doc['machine']}; {a.mode}, {a.rounds} round(s)\n\n"
          + markdown_table(summary))
    (out / f"{stem}.md").write_text(md)
    print(markdown_table(summary))


if __name__ == "__main__":
    main()
