"""Sampled answers with and without a shared prefill, side by side in one process.

K samples of one prompt need its key/value cache once: ``sample_completions`` prefills each
distinct prompt once and copies the cache to its K rows (``share_prefill=True``, the default)
instead of prefilling every row. On N TriviaQA questions with the few-shot prompt of
``isouq qa short`` (K = 5, T = 1, at most 24 new tokens; the run's settings), median seconds per
question of --repeats round-robin runs of each way, and a check that both draw the same samples.

    python benchmarks/sampling_prefill.py --out benchmarks/results/sampling_prefill_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from record import save_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=8, help="questions")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    a = ap.parse_args()
    import torch

    from isouq.data.qa import load_dataset
    from isouq.llm.generation import sample_completions
    from isouq.models import load_model
    from isouq.study.qa.short import STOP, few_shot_prefix, short_prompt

    torch.set_num_threads(a.threads)
    m, tok, _ = load_model(a.model)
    prefix = few_shot_prefix()
    prompts = [short_prompt(it.question, prefix) for it in load_dataset("triviaqa", limit=a.n)]

    def run(share: bool):
        return sample_completions(m, tok, prompts, k=a.k, max_new_tokens=24, stop=STOP, seed=0,
                                  batch_size=32, share_prefill=share)

    ways = {"shared": True, "per_row": False}
    first = {w: run(s) for w, s in ways.items()}  # warm-up, and the samples to compare
    same = all(x.token_ids == y.token_ids for s, t in zip(first["shared"], first["per_row"],
                                                           strict=True)
               for x, y in zip(s.completions, t.completions, strict=True))
    secs: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(a.repeats):
        for w, s in ways.items():
            t = time.perf_counter()
            run(s)
            secs[w].append((time.perf_counter() - t) / a.n)
    row = {w: round(statistics.median(v), 3) for w, v in secs.items()}
    row.update(speedup=round(row["per_row"] / row["shared"], 2), same_samples=same,
               prompt_tokens=len(tok(prompts[0])["input_ids"]))
    print(json.dumps(row))
    save_json(a.out, {"benchmark": "sampling_prefill", "model": a.model, "n": a.n, "k": a.k,
                      "repeats": a.repeats}, seconds_per_question=row)


if __name__ == "__main__":
    main()
