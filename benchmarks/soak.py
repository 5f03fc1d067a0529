"""Soak benchmark: N short (question, answer) rows through ``isouq score``; peak RSS and rows/s.

Writes N rows (TriviaQA questions with one of their aliases, or another question's, as the answer;
short, as a QA run's answers are), runs ``isouq score`` on them in a child process and samples
its resident memory every ``--every`` seconds against the number of rows written so far, so
the record shows whether memory grows with the rows scored. A run killed part-way can be
resumed by re-running the same command (``isouq score`` resumes).

    python benchmarks/soak.py --rows 20000 --out benchmarks/results

Writes ``OUT/soak_N.json`` (every minute, and at the end): settings, peak RSS, RSS after 10%,
25%, 50%, 75% and 100% of the rows, rows/s, and the (seconds, rows written, RSS) trace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def write_rows(path: Path, n: int) -> int:
    """n rows from TriviaQA (the shipped validation file), cycling through it."""
    from isouq.data.qa import load_dataset

    items = load_dataset("triviaqa")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            it = items[i % len(items)]
            wrong = items[(i * 7 + 3) % len(items)]
            answer = (it if i % 2 == 0 else wrong).answers[0]
            f.write(json.dumps({"key": f"r{i}", "question": it.question,
                                "answer": " " + str(answer)}) + "\n")
    return n


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between RSS samples")
    ap.add_argument("--work", default="runs/soak", help="folder of the input and the scores")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import psutil

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    inp, scores = work / f"rows_{a.rows}.jsonl", work / f"scores_{a.rows}.jsonl"
    if not inp.exists():
        write_rows(inp, a.rows)
    done_before = count_lines(scores)
    cmd = [sys.executable, "-m", "isouq.cli", "score", str(inp), "--out", str(scores),
           "--model", a.model, "--batch-size", str(a.batch_size)]
    env = {**os.environ, "ISOUQ_THREADS": str(a.threads)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    ps = psutil.Process(proc.pid)
    trace: list[tuple[float, int, int]] = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"soak_{a.rows}.json"

    def record(finished: bool, summary: str = "") -> dict:
        """The record so far (written every minute: a stopped run keeps what it measured)."""
        elapsed = time.perf_counter() - t0
        written = trace[-1][1] if trace else done_before
        scored = written - done_before
        first = next((s for s, n, _ in trace if n > done_before), None)

        def rss_at(frac: float) -> float | None:
            hits = [r for _, n, r in trace if n >= done_before + frac * (a.rows - done_before)]
            return round(hits[0] / 2**30, 3) if hits else None

        doc = {
            "benchmark": "soak", "command": " ".join(cmd), "rows": a.rows,
            "finished": finished, "rows_before": done_before, "rows_scored_now": scored,
            "batch_size": a.batch_size, "threads": a.threads, "model": a.model,
            "elapsed_s": round(elapsed, 1), "load_s": first,
            "rows_per_s": round(scored / max(elapsed - (first or 0), 1e-9), 2),
            "peak_rss_gib": round(max(r for _, _, r in trace) / 2**30, 3) if trace else None,
            "rss_gib_at": {f"{p}% of the rows": rss_at(p / 100) for p in (10, 25, 50, 75, 100)},
            "summary": summary, "trace": trace,
        }
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        return doc

    last = time.perf_counter()
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss
        except psutil.NoSuchProcess:
            break
        trace.append((round(time.perf_counter() - t0, 1), count_lines(scores), rss))
        if time.perf_counter() - last > 60:
            record(False)
            last = time.perf_counter()
        time.sleep(a.every)
    out_text = proc.communicate()[0]
    doc = record(proc.returncode == 0,
                 out_text.strip().splitlines()[-1] if out_text.strip() else "")
    print(json.dumps({k: v for k, v in doc.items() if k != "trace"}, indent=1))
    print(f"-> {path}")
    if proc.returncode != 0:
        sys.exit(f"isouq score stopped (exit {proc.returncode}); re-run to resume")


if __name__ == "__main__":
    main()
