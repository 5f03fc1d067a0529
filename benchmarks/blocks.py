"""Benchmark: what the block profile costs (``score_sequences(..., blocks=True)``) against the
summed ghost path it rides on, side by side in one process.

For a batch of B TruthfulQA (question, best answer) pairs on a model (default: the embedded
SmolLM2-135M-Instruct), each round calls both, in alternating order (A B, then B A), so both
see the same state of the machine:

- ``ghost``: ``score_sequences(method="ghost")``, the total ‖∇θ p̄‖² of every answer from one
  backward (the shared groups' summed form);
- ``ghost_blocks``: the same call with ``blocks=True``: ‖∇θ_b p̄‖² per block from that backward.

Reports, per batch size, the median seconds per answer of each, the ratio blocks/ghost of
every round and its median, min and max, and the spread of the ghost calls themselves over the
rounds ((max − min)/median: the noise a ratio is read against); writes JSON and Markdown:

    python benchmarks/blocks.py --batch-sizes 16 32 --rounds 8 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def measure(model, tok, prompts, answers, batch: int, rounds: int) -> dict:
    """Per method the seconds of each round (one call per method per round, the order
    alternating), after one untimed call of each."""
    from isouq.sequences import score_sequences

    calls = {
        "ghost": lambda: score_sequences(model, tok, prompts, answers, batch_size=batch),
        "ghost_blocks": lambda: score_sequences(model, tok, prompts, answers, batch_size=batch,
                                                blocks=True),
    }
    for fn in calls.values():
        fn()
    seconds: dict[str, list[float]] = {m: [] for m in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(calls))
        for m in order:
            t0 = time.perf_counter()
            calls[m]()
            seconds[m].append(time.perf_counter() - t0)
    return seconds


def summary(batch: int, seconds: dict[str, list[float]]) -> dict:
    """The row of one batch size: medians per answer, the round-by-round ratio and the noise."""
    g, b = seconds["ghost"], seconds["ghost_blocks"]
    ratios = [y / x for x, y in zip(g, b, strict=True)]
    med = statistics.median(g)
    return {"batch": batch, "rounds": len(g),
            "ghost_s_per_answer": med / batch,
            "ghost_blocks_s_per_answer": statistics.median(b) / batch,
            "blocks_over_ghost": statistics.median(ratios),
            "blocks_over_ghost_min": min(ratios), "blocks_over_ghost_max": max(ratios),
            "ghost_spread": (max(g) - min(g)) / med,
            "seconds": {"ghost": g, "ghost_blocks": b}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default=None,
                    help="a saved config and tokenizer: random weights (benchmarks/random_weights.py)")
    ap.add_argument("--out", default=None, help="folder for blocks.json and blocks.md")
    a = ap.parse_args(argv)
    import os

    import torch

    from isouq.runtime import tune_allocator
    from record import machine  # benchmarks/record.py
    from score_sequences import load_pairs  # benchmarks/score_sequences.py

    tune_allocator()
    torch.set_num_threads(a.threads)
    if a.config:
        from random_weights import random_model

        model, tok, name, _ = random_model(a.config)
    else:
        from isouq.models import load_model

        model, tok, info = load_model(a.model)
        name = info.name
    load = os.getloadavg()
    rows = []
    for batch in a.batch_sizes:
        prompts, answers = load_pairs(batch, tok)
        row = summary(batch, measure(model, tok, prompts, answers, batch, a.rounds))
        rows.append(row)
        print(f"batch {batch}: ghost {row['ghost_s_per_answer']:.3f} s/answer, with blocks "
              f"{row['ghost_blocks_s_per_answer']:.3f}; blocks/ghost "
              f"{row['blocks_over_ghost']:.3f} [{row['blocks_over_ghost_min']:.3f}, "
              f"{row['blocks_over_ghost_max']:.3f}] over {row['rounds']} rounds; ghost's own "
              f"spread {row['ghost_spread']:.1%}", flush=True)
    doc = {"model": name, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average": {"start": load, "end": os.getloadavg()}, "rows": rows}
    if a.out:
        from isouq.runio import markdown_table

        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "blocks.json").write_text(json.dumps(doc, indent=1))
        (out / "blocks.md").write_text(markdown_table(
            [{k: v for k, v in r.items() if k != "seconds"} for r in rows]))


if __name__ == "__main__":
    main()
