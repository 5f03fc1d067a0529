"""Benchmark: what the learned heads' inputs cost beside the summed ghost path they ride on
(the block profile, ``score_sequences(..., blocks=True)``; the hidden states the probe reads,
``hidden=True``), side by side in one process.

For a batch of B TruthfulQA (question, best answer) pairs on a model (default: the embedded
SmolLM2-135M-Instruct), each round calls each of these once, the order turning by one each
round (A B C D, B C D A, ...), so all see the same state of the machine:

- ``ghost``: ``score_sequences(method="ghost")``, the total ‖∇θ p̄‖² of every answer from one
  backward (the shared groups' summed form);
- ``ghost_blocks``: the same call with ``blocks=True``: ‖∇θ_b p̄‖² per block from that backward;
- ``ghost_hidden``: the same call with ``hidden=True``: each answer's mean hidden states at
  ``isouq.hidden.probe_layers`` from one more forward without gradients (``isouq score
  --hidden``, what the stacked head's probe reads);
- ``ghost_blocks_hidden``: both (``isouq score --blocks --hidden``).

Reports, per batch size, the median seconds per answer of each, the ratio of each to ``ghost``
in every round with its median, min and max (``blocks_over_ghost``, ``hidden_over_ghost``,
``blocks_hidden_over_ghost``), and the spread of the ghost calls themselves over the rounds
((max − min)/median: the noise a ratio is read against); writes JSON and Markdown:

    python benchmarks/blocks.py --batch-sizes 16 32 --rounds 8 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

#: each timed call beside ``ghost``: its name, the ratio's name, and score_sequences' options
EXTRA = {"ghost_blocks": ("blocks", {"blocks": True}),
         "ghost_hidden": ("hidden", {"hidden": True}),
         "ghost_blocks_hidden": ("blocks_hidden", {"blocks": True, "hidden": True})}


def measure(model, tok, prompts, answers, batch: int, rounds: int) -> dict:
    """Per method the seconds of each round (one call per method per round, the order turning
    by one each round), after one untimed call of each."""
    from isouq.sequences import score_sequences

    def call(**kw):
        return lambda: score_sequences(model, tok, prompts, answers, batch_size=batch, **kw)

    calls = {"ghost": call(), **{m: call(**kw) for m, (_, kw) in EXTRA.items()}}
    for fn in calls.values():
        fn()
    names = list(calls)
    seconds: dict[str, list[float]] = {m: [] for m in calls}
    for r in range(rounds):
        for m in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            calls[m]()
            seconds[m].append(time.perf_counter() - t0)
    return seconds


def summary(batch: int, seconds: dict[str, list[float]]) -> dict:
    """The row of one batch size: medians per answer, the round-by-round ratios and the noise."""
    g = seconds["ghost"]
    med = statistics.median(g)
    row = {"batch": batch, "rounds": len(g), "ghost_s_per_answer": med / batch}
    for m, (tag, _) in EXTRA.items():
        ratios = [y / x for x, y in zip(g, seconds[m], strict=True)]
        row |= {f"{m}_s_per_answer": statistics.median(seconds[m]) / batch,
                f"{tag}_over_ghost": statistics.median(ratios),
                f"{tag}_over_ghost_min": min(ratios), f"{tag}_over_ghost_max": max(ratios)}
    return row | {"ghost_spread": (max(g) - min(g)) / med, "seconds": seconds}


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
        print(f"batch {batch}: ghost {row['ghost_s_per_answer']:.3f} s/answer; " + "; ".join(
            f"{tag}/ghost {row[f'{tag}_over_ghost']:.3f} [{row[f'{tag}_over_ghost_min']:.3f}, "
            f"{row[f'{tag}_over_ghost_max']:.3f}]" for tag, _ in EXTRA.values())
            + f" over {row['rounds']} rounds; ghost's own spread {row['ghost_spread']:.1%}",
            flush=True)
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
