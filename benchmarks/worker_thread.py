"""Benchmark: one answer scored on the main thread, on a second thread after the main thread has
run torch (the old ``isouq serve``: model warmed up on the main thread, batches on a worker
thread), and on a thread that is the process's only torch thread (``isouq serve`` now:
``serve.model_thread.ModelThread`` loads, warms up and scores).

The pairs are those of ``benchmarks/serve_load.py`` (TriviaQA questions in the QA prompt, short
answers), SmolLM2 on the CPU, batch 1; each call repeated ``--repeats`` times after a warm-up.
``main`` and ``second thread`` run in one process (main first, then a new thread while the main
thread waits in ``join``); ``model thread`` runs in a fresh process whose main thread never runs
torch. Wall and process CPU seconds per call (median) are written to ``--out``:

    python benchmarks/worker_thread.py --out benchmarks/results/worker_thread.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(case: str, model_name: str, repeats: int) -> dict:
    """{where: {wall_s, cpu_s}} for ``case`` ``main`` (main, then second thread) or ``model``."""
    from isouq.llm.prompts import qa_prompt
    from isouq.models import load_model
    from isouq.runtime import configure
    from isouq.sequences import score_sequences
    from isouq.serve.model_thread import ModelThread
    from serve_load import questions

    configure()

    def setup():
        model, tok, _ = load_model(model_name)
        (q, a), = questions(1)
        return model, tok, qa_prompt(tok, q), a

    def timed(model, tok, prompt, a) -> dict:
        score_sequences(model, tok, [prompt], [a], batch_size=1)  # warm-up
        wall, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            score_sequences(model, tok, [prompt], [a], batch_size=1)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}

    if case == "model":
        owner = ModelThread()
        return {"model thread": owner.call(lambda: timed(*setup()))}
    loaded = setup()
    out = {"main": timed(*loaded)}
    box: dict = {}
    th = threading.Thread(target=lambda: box.update({"second thread": timed(*loaded)}))
    th.start()
    th.join()
    return out | box


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--case", choices=("main", "model"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.case:  # one case in this process: its JSON on stdout's last line
        print(json.dumps(measure(args.case, args.model, args.repeats)))
        return 0

    from record import save_json

    out: dict = {}
    for case in ("main", "model"):
        run = subprocess.run([sys.executable, __file__, "--case", case, "--model", args.model,
                              "--repeats", str(args.repeats)], capture_output=True, text=True,
                             check=True)
        out |= json.loads(run.stdout.strip().splitlines()[-1])
    for where, r in out.items():
        print(f"{where:14s} {r['wall_s']:.3f} s wall, {r['cpu_s']:.3f} s CPU per call")
    main_s = out["main"]["wall_s"]
    save_json(args.out, {"benchmark": "worker_thread", "model": args.model, "batch": 1,
                         "repeats": args.repeats}, **out,
              second_thread_over_main=out["second thread"]["wall_s"] / main_s,
              model_thread_over_main=out["model thread"]["wall_s"] / main_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
