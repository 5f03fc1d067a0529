"""Memory over repeated calls: the same answers scored again and again must not grow RSS.

Scores the same N TruthfulQA answers ``--calls`` times with ``score_sequences`` and records the
process's resident memory and live tensor count after each call.

    python benchmarks/memory_repeat.py --calls 20 --method ghost --out benchmarks/results
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--method", default="ghost", choices=["ghost", "loop"])
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import psutil
    import torch

    from answers import truthfulqa_answers  # benchmarks/answers.py, beside this script
    from isouq import score_sequences
    from isouq.models import load_model
    from isouq.runtime import configure

    configure()
    model, tok, _ = load_model(a.model)
    prompts, answers = truthfulqa_answers(tok, a.n)
    proc = psutil.Process()
    trace = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"memory_repeat_{a.method}.json"
    doc = {}
    for i in range(a.calls):
        score_sequences(model, tok, prompts, answers, method=a.method, batch_size=a.n)
        gc.collect()
        live = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
        trace.append({"call": i + 1, "rss_gib": round(proc.memory_info().rss / 2**30, 3),
                      "live_tensors": live})
        print(trace[-1], flush=True)
        first = trace[min(1, len(trace) - 1)]  # call 1 builds caches once
        doc = {"benchmark": "memory_repeat", "model": a.model, "n": a.n, "method": a.method,
               "calls": len(trace), "rss_growth_gib": round(trace[-1]["rss_gib"] - first["rss_gib"], 3),
               "live_tensor_growth": trace[-1]["live_tensors"] - first["live_tensors"],
               "trace": trace}
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")  # a stopped run keeps its record
    print(f"growth after call 2: {doc['rss_growth_gib']} GiB, {doc['live_tensor_growth']} "
          f"tensors -> {path}")


if __name__ == "__main__":
    main()
