"""Benchmark: ghost and its floors of an earlier commit against this checkout, run in turn, in
absolute seconds per answer, with the machine's noise beside every ratio.

On a shared CPU the floor itself drifts by several percent within an hour, so a before/after
read from two tables measured at different times mixes the code's change with the machine's.
This runs both sides in turn, round by round: the earlier commit from a temporary
``git worktree`` (its ``src/`` first on the path), then this checkout's working tree as it was
when the run started (its ``src/`` and ``benchmarks/*.py`` copied then, so that edits made
while it runs do not reach it; the files that differ from HEAD are listed in the result). Three
things are timed on each side, in seconds per answer:

- ``ghost``: ``score_sequences(method="ghost")`` on the pairs encoded once, as the floor's
  batch is (``encoded=``, where that side's isouq takes it; encoding included otherwise);
- ``floor``: the library's floor (``benchmarks/floor.py``): forward + activation-only backward
  through isouq's own ``token_probs``;
- ``hf_floor``: the independent floor (``benchmarks/hf_floor.py``): the same forward +
  activation-only backward of the same batch in plain transformers, no isouq code at all, on its
  own copy of the model (loaded by transformers from ``--hf-model``, by default the folder of
  the weights ``--model`` loads).

A slowdown that ghost and the library's floor share leaves ghost/floor unmoved; it shows as
ghost/hf_floor and ghost's own after/before moving while hf_floor's after/before does not. The
hf_floor runs the same code on both sides, so its spread over rounds, (max − min) / median, is
the noise of the machine; it is printed beside every ratio (each side's for the side's ratios,
both sides' rounds together for after / before), and an after / before whose distance from 1 is
no larger is marked as inside the noise.

Two modes:

- ``interleaved`` (the default): per side, round and batch size one process loads the model and
  calls the three alternately, ``--repeats`` times each after ``--warmups`` untimed calls (the
  order rotated every repeat), so all three see the same state of the machine; the child is
  this file's own ``--child`` code, which uses only what both sides' ``isouq`` have
  (``load_model``, ``encode``, ``collate``, ``token_probs``, ``summarize``,
  ``score_sequences``), and checks on the timed batch that the independent floor computes
  isouq's p̄ (the same work);
- ``processes``: per side and round, that side's own ``benchmarks/score_sequences.py`` (floor
  and ghost each in a process of its own, as in the kept tables) and ``hf_floor.py`` in a
  process of its own; the ratios then also carry the difference between processes.

    python benchmarks/score_sequences_ab.py --before 1eb079b --rounds 4 --out benchmarks/results

Writes ``score_sequences_ab[_TAG].json`` (+ ``.md``): both commits, the machine's load average
at the start and end (and around every run), every run with each call's raw seconds per answer
(interleaved; processes mode: each process's median, and hf_floor's raw seconds), and per batch
size and side the median and min–max over rounds of each, the ratios and the noise. In
``processes`` mode, arguments after ``--`` go to both sides' ``score_sequences.py`` (e.g.
``-- --config DIR``).
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
#: what is timed on each side: ghost, the library's floor, the independent floor
METHODS = ("ghost", "floor", "hf_floor")
#: the ratios compared: (numerator, denominator)
RATIOS = (("ghost", "floor"), ("ghost", "hf_floor"))
#: the largest |p̄ of the independent floor − p̄ of isouq| of one batch that is the same work
SAME_P_BAR = 1e-4


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


def load_avg() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes, now."""
    return [round(x, 2) for x in os.getloadavg()]


def spread(values: list[float]) -> float:
    """(max − min) / median of ``values``: how far apart repeated measurements fall."""
    return (max(values) - min(values)) / statistics.median(values)


def stats(values: list[float]) -> dict:
    """Median, min, max and every value of measurements over rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "by_round": values}


def hf_model_dir(model: str) -> str:
    """The saved folder transformers loads for the independent floor: ``model`` itself when it
    is a folder, else the folder of the ``config.json`` that isouq's ``load_model`` read (for a
    GGUF model: its float32 cache)."""
    if Path(model).is_dir():
        return str(Path(model).resolve())
    from isouq.models import load_model

    _, _, info = load_model(model)
    configs = [Path(f).parent for f in info.files if Path(f).name == "config.json"]
    if not configs:
        raise SystemExit(f"--model {model}: no saved folder with a config.json among the files "
                         "it loads from; pass the folder transformers should load as --hf-model")
    return str(configs[0])


def snapshot(dest: Path) -> Path:
    """A copy of this checkout's ``src/`` and ``benchmarks/*.py`` as they are now, in
    ``dest``: the after side, fixed for the whole run."""
    import shutil

    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "benchmarks").mkdir(parents=True)
    for f in (ROOT / "benchmarks").glob("*.py"):
        shutil.copy2(f, dest / "benchmarks" / f.name)
    return dest


def run_interleaved(tree: Path, batch_sizes: list[int], opts: dict) -> list[dict]:
    """One process of ``tree``'s ``isouq`` per batch size (this file's ``--child``): ghost and
    both floors called alternately; one row per batch size."""
    env = side_env(tree)
    rows = []
    for b in batch_sizes:
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps({**opts, "batch": b})],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"the {tree} side failed at batch {b}:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def run_processes(tree: Path, out: Path, batch_sizes: list[int], opts: dict,
                  extra: list[str]) -> list[dict]:
    """``tree``'s own ``score_sequences.py`` (floor and ghost, a process each) and then, per
    batch size, ``hf_floor.py`` in a process of its own; one row per batch size."""
    env = side_env(tree)
    common = ["--repeats", str(opts["repeats"]), "--warmups", str(opts["warmups"]),
              "--threads", str(opts["threads"])]
    cmd = [sys.executable, str(tree / "benchmarks" / "score_sequences.py"), "--batch-sizes",
           *map(str, batch_sizes), "--methods", "floor", "ghost", "--model", opts["model"],
           *common, "--out", str(out), *extra]
    res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"the {tree} side's score_sequences.py failed:\n{res.stderr[-3000:]}")
    doc = json.loads((out / "score_sequences.json").read_text())
    rows = []
    for b in batch_sizes:
        by = {r["method"]: r for r in doc["rows"] if r["batch"] == b}
        res = subprocess.run([sys.executable, str(HERE / "hf_floor.py"), "--model-dir",
                              opts["hf_dir"], "--pairs", opts["pairs"], "--batch", str(b),
                              *common], cwd=ROOT, env=env, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"hf_floor.py failed at batch {b}:\n{res.stderr[-3000:]}")
        hf = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append({"batch": b, "tokens_padded": by["ghost"]["tokens_padded"],
                     "hf_tokens_padded": hf["tokens_padded"],
                     "seconds_per_answer": {"ghost": by["ghost"]["seconds_per_answer"],
                                            "floor": by["floor"]["seconds_per_answer"],
                                            "hf_floor": hf["seconds_per_answer"]},
                     "times": {"hf_floor": hf["times"]},
                     "score_sequences_rows": [by["floor"], by["ghost"]]})
    return rows


def child(o: dict) -> dict:
    """Ghost, the library's floor and the independent floor of one batch, alternately in this
    process: seconds per answer of each call and their medians; first a check that the
    independent floor computes isouq's p̄ on this batch (else it would not measure the same
    work)."""
    import torch

    import isouq
    from floor import floor_and_ghost
    from hf_floor import hf_floor, load, mean_answer_probs
    from isouq.models import load_model
    from isouq.sequences import summarize, token_probs

    torch.set_num_threads(o["threads"])
    batch = o["batch"]
    pairs = json.loads(Path(o["pairs"]).read_text())[:batch]
    prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
    model, tok, _ = load_model(o["model"])
    fns, b = floor_and_ghost(model, tok, prompts, answers)
    hf_model, hf_tok = load(o["hf_dir"])
    fns["hf_floor"], hb = hf_floor(hf_model, hf_tok, prompts, answers)
    with torch.no_grad():
        gap = float((summarize(*token_probs(model, b))[0]
                     - mean_answer_probs(hf_model, hb)).abs().max())
    if tuple(b.input_ids.shape) != tuple(hb.input_ids.shape) or not gap <= SAME_P_BAR:
        raise SystemExit(f"batch {batch}: the independent floor's batch {tuple(hb.input_ids.shape)}"
                         f" and p̄ (largest difference {gap:.3g}) are not isouq's "
                         f"{tuple(b.input_ids.shape)}: it would not measure the same work; "
                         "pass the folder of the model --model loads as --hf-model")
    for _ in range(o["warmups"]):
        for f in fns.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in METHODS}
    for r in range(o["repeats"]):
        for k in METHODS[r % 3:] + METHODS[:r % 3]:  # each in each place of the order
            t = time.perf_counter()
            fns[k]()
            times[k].append((time.perf_counter() - t) / batch)
    return {"batch": batch, "tokens_padded": int(b.input_ids.shape[1]), "src": isouq.__file__,
            "p_bar_largest_difference": gap,
            "seconds_per_answer": {k: statistics.median(v) for k, v in times.items()},
            "times": times}


def summarize(runs: list[dict], batch_sizes: list[int]) -> list[dict]:
    """Per batch size: each side's seconds per answer of ghost and both floors and the ratios,
    each as median and min–max over rounds; the noise (the independent floor's spread over
    rounds: each side's, and both sides' together); after / before of each, with the noise
    beside it and whether it is inside."""
    out = []
    for b in batch_sizes:
        rows = {s: [next(r for r in run["rows"] if r["batch"] == b) for run in runs
                    if run["side"] == s] for s in SIDES}
        secs = {s: {m: stats([r["seconds_per_answer"][m] for r in rows[s]]) for m in METHODS}
                for s in SIDES}
        ratios = {s: {f"{n}/{d}": stats([r["seconds_per_answer"][n] / r["seconds_per_answer"][d]
                                         for r in rows[s]]) for n, d in RATIOS} for s in SIDES}
        hf = {s: secs[s]["hf_floor"]["by_round"] for s in SIDES}
        noise = {"before": spread(hf["before"]), "after": spread(hf["after"]),
                 "both": spread(hf["before"] + hf["after"])}
        ab = {}
        for name, side in [*((m, secs) for m in METHODS),
                           *((f"{n}/{d}", ratios) for n, d in RATIOS)]:
            ratio = side["after"][name]["median"] / side["before"][name]["median"]
            ab[name] = {"ratio": ratio, "noise": noise["both"],
                        "inside_noise": abs(ratio - 1) <= noise["both"]}
        out.append({"batch": b, "seconds_per_answer": secs, "ratios": ratios, "noise": noise,
                    "after/before": ab})
    return out


#: how the report names what is measured
LABELS = {"ghost": "ghost, s/answer", "floor": "floor (isouq), s/answer",
          "hf_floor": "floor (transformers only), s/answer",
          "ghost/floor": "ghost / floor (isouq)", "ghost/hf_floor": "ghost / floor (transformers only)"}


def report(summary: list[dict], before: str, after: str) -> list[dict]:
    """The summary as rows of text: per batch size and thing measured, each side's median
    (min–max over rounds), the noise beside each ratio, after / before with the noise and
    whether it is inside."""
    def cell(s: dict, noise: float | None = None) -> str:
        text = f"{s['median']:.3g} ({s['min']:.3g}–{s['max']:.3g})"
        return text + (f"; noise {noise:.0%}" if noise is not None else "")

    rows = []
    for r in summary:
        for name, label in LABELS.items():
            ratio = "/" in name
            src = r["ratios"] if ratio else r["seconds_per_answer"]
            ab = r["after/before"][name]
            rows.append({"batch": r["batch"], "measured": label,
                         f"before ({before})": cell(src["before"][name],
                                                    r["noise"]["before"] if ratio else None),
                         f"after ({after})": cell(src["after"][name],
                                                  r["noise"]["after"] if ratio else None),
                         "after / before": f"{ab['ratio']:.3g}; noise {ab['noise']:.0%}, "
                                           + ("inside" if ab["inside_noise"] else "beyond")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REV", help="the earlier commit (required)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--mode", default="interleaved", choices=["interleaved", "processes"])
    ap.add_argument("--repeats", type=int, default=10, help="timed calls of each per process")
    ap.add_argument("--warmups", type=int, default=1, help="untimed calls of each first")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model", default="smollm2", help="the model scored")
    ap.add_argument("--hf-model", default=None, metavar="DIR",
                    help="the folder transformers loads for the independent floor (default: "
                         "--model if a folder, else the folder of the config.json it loads)")
    ap.add_argument("--tag", default=None, help="suffix of the result files' names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="after --: more arguments for both sides' "
                    "score_sequences.py (processes mode)")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    if a.before is None:
        ap.error("--before REV is required: the earlier commit to run beside this checkout")
    if a.extra and a.mode != "processes":
        ap.error("arguments after -- go to score_sequences.py: use them with --mode processes")
    if a.rounds < 2:
        ap.error(f"--rounds {a.rounds}: the noise is the spread over rounds; give 2 or more")
    try:
        before = git("rev-parse", "--short", f"{a.before}^{{commit}}")
    except subprocess.CalledProcessError:
        ap.error(f"--before {a.before}: not a commit of this repository (git rev-parse)")
    after = git("rev-parse", "--short", "HEAD")
    # what the after side runs: src/ and the benchmark scripts, as they are in the working tree
    uncommitted = git("status", "--porcelain", "--", "src", "benchmarks/*.py").splitlines()
    load_start = load_avg()
    hf_dir = a.hf_model or hf_model_dir(a.model)
    # killed (SIGTERM): the finally blocks still remove the temporary worktree
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="isouq-ab-") as tmp:
        from score_sequences import load_pairs  # the same texts for both sides

        prompts, answers = load_pairs(max(a.batch_sizes))
        pairs = Path(tmp) / "pairs.json"
        pairs.write_text(json.dumps([[p, s] for p, s in zip(prompts, answers, strict=True)]))
        opts = {"repeats": a.repeats, "warmups": a.warmups, "threads": a.threads,
                "model": a.model, "hf_dir": hf_dir, "pairs": str(pairs)}
        now = snapshot(Path(tmp) / "after")
        tree = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(tree), before)
        try:
            for rnd in range(1, a.rounds + 1):
                for side in SIDES:
                    where = tree if side == "before" else now
                    start = load_avg()[0]
                    rows = (run_interleaved(where, a.batch_sizes, opts) if a.mode == "interleaved"
                            else run_processes(where, Path(tmp) / f"{side}{rnd}", a.batch_sizes,
                                               opts, a.extra))
                    runs.append({"side": side, "round": rnd, "load_1min": [start, load_avg()[0]],
                                 "rows": rows})
                    print(f"round {rnd} {side:>6}: " + "; ".join(
                        f"batch {r['batch']} " + ", ".join(
                            f"{m} {r['seconds_per_answer'][m]:.4f}" for m in METHODS)
                        for r in rows) + " s/answer", flush=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
    summary = summarize(runs, a.batch_sizes)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "threads": a.threads},
           "load_average": {"start": load_start, "end": load_avg()},
           "before": before, "after": after + ("+uncommitted" if uncommitted else ""),
           "after_uncommitted": uncommitted,
           "mode": a.mode, "batch_sizes": a.batch_sizes, "rounds": a.rounds,
           "repeats": a.repeats, "warmups": a.warmups, "model": a.model, "hf_model": hf_dir,
           "extra": a.extra, "noise": "the independent floor's (max − min) / median over rounds",
           "summary": summary, "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "score_sequences_ab" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    from isouq.runio import markdown_table

    table = markdown_table(report(summary, before, doc["after"]))
    md = (f"# ghost and its floors, {before} (before) against {doc['after']} (after), in turn\n\n"
          f"{doc['date']}, {doc['machine']}; {a.mode}, {a.rounds} rounds; load average "
          f"{load_start} at the start, {doc['load_average']['end']} at the end. Seconds per "
          "answer, median (min–max over rounds); noise: the independent floor's "
          "(max − min) / median over rounds\n\n" + table)
    (out / f"{stem}.md").write_text(md)
    print(table)


if __name__ == "__main__":
    main()
