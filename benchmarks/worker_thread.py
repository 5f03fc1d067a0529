"""Benchmark: one answer scored on the process's main thread against the same call on another
thread (where ``isouq serve`` runs the model: its batch worker is a ``threading.Thread``).

The pairs are those of ``benchmarks/serve_load.py`` (TriviaQA questions in the QA prompt, short
answers), SmolLM2 on the CPU, batch 1; each call repeated ``--repeats`` times after a warm-up, on
the main thread first, then on a new thread (the main thread waiting in ``join``). Wall and
process CPU seconds per call (median) are written to ``--out``:

    python benchmarks/worker_thread.py --out benchmarks/results/worker_thread.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from isouq.llm.prompts import qa_prompt
    from isouq.models import load_model
    from isouq.runtime import configure
    from isouq.sequences import score_sequences
    from record import save_json
    from serve_load import questions

    configure()
    model, tok, _ = load_model(args.model)
    (q, a), = questions(1)
    prompt = qa_prompt(tok, q)

    def timed() -> dict:
        score_sequences(model, tok, [prompt], [a], batch_size=1)  # warm-up
        wall, cpu = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            score_sequences(model, tok, [prompt], [a], batch_size=1)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}

    out = {"main": timed()}
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(thread=timed()))
    th.start()
    th.join()
    out |= box
    for where, r in out.items():
        print(f"{where:6s} {r['wall_s']:.3f} s wall, {r['cpu_s']:.3f} s CPU per call")
    save_json(args.out, {"benchmark": "worker_thread", "model": args.model, "batch": 1,
                         "repeats": args.repeats}, **out,
              thread_over_main=out["thread"]["wall_s"] / out["main"]["wall_s"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
