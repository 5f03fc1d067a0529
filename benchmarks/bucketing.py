"""Benchmark: length-bucketed batching vs input order for ``isouq score``, side by side.

Scores the same N (question, answer) rows (TruthfulQA best + incorrect answers, so lengths
vary) with the runner in input order and sorted by length, alternating ``--repeats`` times,
and reports answers per second, the padded-token share and the speed-up.

    python benchmarks/bucketing.py --n 64 --batch-size 16 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def rows(n: int):
    from isouq.data.pairs import PairRow
    from isouq.data.qa import load_dataset

    out = []
    for it in load_dataset("truthfulqa"):
        for j, a in enumerate([*it.answers[:1], *it.incorrect_answers[:2]]):
            out.append(PairRow(key=f"{it.key}-{j}", answer=" " + a, question=it.question))
            if len(out) == n:
                return out
    return out


def padding_share(tok, rs, batch: int, bucket: bool) -> float:
    from isouq.prepare import plan_batches, prompt_for
    from isouq.sequences import encode

    enc = encode(tok, [prompt_for(tok, r.prompt, r.question) for r in rs], [r.answer for r in rs])
    lengths = [len(e.prompt) + len(e.answer) for e in enc]
    padded = sum(max(lengths[i] for i in b) * len(b) for b in plan_batches(lengths, batch, None,
                                                                           bucket))
    return 1 - sum(lengths) / padded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, ... (where the model runs)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import torch

    from isouq.models import load_model
    from isouq.runtime import tune_allocator
    from isouq.score_run import score_rows

    tune_allocator()  # as the isouq command does
    torch.set_num_threads(a.threads)
    model, tok, info = load_model(a.model, device=a.device)
    rs = rows(a.n)
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(a.repeats):
            for bucket in (False, True):
                out = Path(d) / f"{bucket}-{rep}.jsonl"
                t = time.perf_counter()
                score_rows(model, tok, rs, out, batch_size=a.batch_size, bucket=bucket,
                           progress=False)
                times[bucket].append(time.perf_counter() - t)
    res = {
        "model": info.name, "n": len(rs), "batch": a.batch_size, "threads": a.threads,
        "device": a.device if a.device == "cpu" else torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "input_order_s": statistics.median(times[False]),
        "bucketed_s": statistics.median(times[True]),
        "padding_share_input_order": padding_share(tok, rs, a.batch_size, False),
        "padding_share_bucketed": padding_share(tok, rs, a.batch_size, True),
    }
    res["answers_per_s_input_order"] = res["n"] / res["input_order_s"]
    res["answers_per_s_bucketed"] = res["n"] / res["bucketed_s"]
    res["speedup"] = res["input_order_s"] / res["bucketed_s"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bucketing_{a.device.split(':')[0]}.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
