"""Benchmark: span scores (``score_sequences(..., spans="sentences")``) against the whole-answer
score and against a loop of one backward per span.

16 TruthfulQA questions, each answered with five of its reference sentences (correct and
incorrect answers, each ending with a period), on a model (default: the embedded SmolLM2-135M-
Instruct, float32, CPU). Measured in one process after one untimed whole-answer call, median of
``--repeats`` (default 1):

- ``whole``: ``score_sequences`` without spans (ghost, one forward + one backward per batch);
- ``spans_retain``: ``score_sequences(..., spans="sentences")``, the library's default: one
  forward of the 16 answers, then one ghost backward for the whole answers and one per sentence
  index over the retained graph (6 backwards, the memory of the whole-answer score);
- ``spans_rows``: ``score_sequences(..., span_strategy="rows")``: per sentence, the row truncated at its
  end, the 1 + 5 rows of ``--rows-batch`` answers (default 4: 24 rows) in one ghost forward +
  backward; all 16 × 6 = 96 rows in one batch (``--rows-batch 16``) needs about 6× the memory
  of the whole-answer score;
- ``spans_loop``: ``score_sequences(..., spans="sentences", method="per_example")``: one
  backward per row (16 × 5 sentences + 16 whole answers = 96 backwards), the reference.

Wall and process CPU seconds are both recorded: on a shared machine the CPU seconds of this
process are the steadier measure. Every span score of ``spans_rows`` and ``spans_retain`` is
checked against ``spans_loop`` (largest relative difference printed). Writes ``--out`` JSON.

    .venv/bin/python benchmarks/spans.py --threads 2 --out benchmarks/results/spans_cpu.json

On a GPU, or where the weights cannot travel: ``--config DIR`` builds the model with random
weights from a saved config and tokenizer (``benchmarks/random_weights.py``; the same
architecture costs the same), ``--device cuda`` and ``--dtype bfloat16`` place it; times are
then taken after a device synchronize and the peak is the GPU's ``max_memory_allocated``:

    python benchmarks/spans.py --config DIR --device cuda --out spans_cuda.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def five_sentence_answers(n: int) -> tuple[list[str], list[str]]:
    """(questions, answers): the first ``n`` TruthfulQA questions with ≥ 5 reference answers,
    each answered with five of them (correct ones first) as five sentences."""
    from isouq.data.qa import load_dataset

    qs, ans = [], []
    for it in load_dataset("truthfulqa", limit=None):
        pool = [a.strip().rstrip(".") + "." for a in [*it.answers, *it.incorrect_answers]
                if a.strip()]
        if len(pool) >= 5:
            qs.append(it.question)
            ans.append(" ".join(pool[:5]))
        if len(qs) == n:
            break
    return qs, ans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=16, help="answers (one batch)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--loop-repeats", type=int, default=1)
    ap.add_argument("--rows-batch", type=int, default=4, help="answers per pass of spans_rows")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="run only these (whole, spans_retain, spans_rows, spans_loop, "
                         "whole_loop); alone in a process, its peak RSS is its own")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--config", default=None, metavar="DIR",
                    help="random weights from this saved config and tokenizer instead of --model")
    ap.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="with --config: the tokenizer's folder, when the config's has none")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from isouq.llm.prompts import qa_prompts
    from isouq.models import load_model
    from isouq.runtime import configure
    from isouq.sequences import encode, score_sequences
    from record import save_json

    configure()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.config:
        from random_weights import random_model  # benchmarks/random_weights.py

        model, tok, args.model, _ = random_model(args.config, device=args.device,
                                                 dtype=args.dtype, tokenizer=args.tokenizer)
    else:
        model, tok, _ = load_model(args.model)
        model.to(device=args.device, dtype=getattr(torch, args.dtype))
    cuda = torch.device(args.device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
    questions, answers = five_sentence_answers(args.n)
    prompts = qa_prompts(tok, questions)
    n = len(answers)

    runs = {
        "whole": lambda: score_sequences(model, tok, prompts, answers, batch_size=n),
        "spans_retain": lambda: score_sequences(model, tok, prompts, answers, batch_size=n,
                                                spans="sentences"),
        "spans_rows": lambda: score_sequences(model, tok, prompts, answers,
                                              batch_size=args.rows_batch, spans="sentences",
                                              span_strategy="rows"),
        "spans_loop": lambda: score_sequences(model, tok, prompts, answers, batch_size=n,
                                              spans="sentences", method="per_example"),
        # the whole answers' own loop, for the loop/ghost ratio of this machine
        "whole_loop": lambda: score_sequences(model, tok, prompts, answers, batch_size=n,
                                              method="per_example"),
    }
    if args.methods:
        runs = {k: v for k, v in runs.items() if k in args.methods}
    else:
        runs.pop("whole_loop")
    seconds, cpu, results = {}, {}, {}
    for name, fn in runs.items():
        reps = args.loop_repeats if name == "spans_loop" else args.repeats
        if name == next(iter(runs)):
            fn()  # warm-up (first calls of a process are slower)
        times, cpus = [], []
        for _ in range(reps):
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            sync()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        seconds[name], cpu[name] = statistics.median(times), statistics.median(cpus)
        print(f"{name:13s} {seconds[name]:8.3f} s wall, {cpu[name]:8.3f} s CPU", flush=True)

    import resource

    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak GPU memory allocated: {peak:.2f} GiB")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GiB (Linux: KiB)
        print(f"peak RSS of the process: {peak:.2f} GiB")
    meta = {"model": args.model, "benchmark": "spans", "rows_batch": args.rows_batch,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": args.dtype}
    if args.methods:
        save_json(args.out, meta | {"methods": args.methods},
                  seconds=seconds, cpu_seconds=cpu, peak_rss_gib=peak)
        return 0

    def epi(name):
        return [[s.epistemic for s in sp] for sp in results[name].spans]

    loop, rows, kept = epi("spans_loop"), epi("spans_rows"), epi("spans_retain")

    def worst(a, b):
        return max(abs(x - y) / abs(y) for u, v in zip(a, b, strict=True)
                   for x, y in zip(u, v, strict=True))

    n_spans = sum(len(sp) for sp in loop)
    whole_diff = float(((results["spans_retain"].epistemic - results["whole"].epistemic).abs()
                        / results["whole"].epistemic).max())
    summary = {
        "answers": n, "spans": n_spans,
        "answer_tokens_mean": float(results["whole"].n_tokens.float().mean()),
        "prompt_plus_answer_tokens_max": max(
            len(e.prompt) + len(e.answer) for e in encode(tok, prompts, answers)),
        "seconds": seconds, "cpu_seconds": cpu,
        **{f"{a}_over_{b}{tag}": t[f"spans_{a}" if a != "whole" else a]
           / t[f"spans_{b}" if b != "whole" else b]
           for tag, t in (("", seconds), ("_cpu", cpu))
           for a, b in (("loop", "rows"), ("loop", "retain"), ("rows", "whole"),
                        ("retain", "whole"))},
        "max_rel_diff_rows_vs_loop": worst(rows, loop),
        "max_rel_diff_retain_vs_loop": worst(kept, loop),
        "max_rel_diff_whole_with_spans_vs_without": whole_diff,
    }
    for k, v in summary.items():
        if k not in ("seconds", "cpu_seconds"):
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    save_json(args.out, meta, **summary, peak_gib=peak)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
