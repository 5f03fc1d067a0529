"""Benchmark: span scores (``score_sequences(..., spans="sentences")``) against the whole-answer
score and against a loop of one backward per span.

16 TruthfulQA questions, each answered with five of its reference sentences (correct and
incorrect answers, each ending with a period), on a model (default: the embedded SmolLM2-135M-
Instruct, float32, CPU). Measured in one process after one untimed whole-answer call, median of
``--repeats`` (default 1):

- ``whole``: ``score_sequences`` without spans (ghost, one forward + one backward per batch);
- ``spans_rows``: ``score_sequences(..., spans="sentences")``: the whole answers and, per
  sentence, the row truncated at its end, all 16 × (1 + 5) rows in one ghost forward + backward
  (the library's way);
- ``spans_retain``: the other exact option, measured here only: one forward of the 16 whole
  answers, then one ghost backward per sentence index over the retained graph (6 backwards);
- ``spans_loop``: ``score_sequences(..., spans="sentences", method="loop")``: one backward per
  row (16 × 5 sentences + 16 whole answers = 96 backwards), the reference.

Wall and process CPU seconds are both recorded: on a shared machine the CPU seconds of this
process are the steadier measure. Every span score of ``spans_rows`` and ``spans_retain`` is
checked against ``spans_loop`` (largest relative difference printed). Writes ``--out`` JSON.

    .venv/bin/python benchmarks/spans.py --threads 2 --out benchmarks/results/spans_cpu.json
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


def retain(model, tok, prompts, answers) -> list[list[float]]:
    """Span epistemic scores from one forward and one ghost backward per sentence index."""
    import torch

    from isouq.estimators import eval_mode
    from isouq.ghost.engine import GhostNorms
    from isouq.sequences import collate, encode, pad_id, summarize, token_probs
    from isouq.spans import resolve_spans

    enc = encode(tok, prompts, answers)
    spans = resolve_spans(tok, answers, "sentences", enc)
    batch = collate(enc, pad_id(tok), "left")
    S = max(len(s.tokens) for s in spans)
    masks = torch.zeros((S, *batch.answer_mask.shape), dtype=torch.bool)
    for i, sp in enumerate(spans):
        cols = batch.answer_mask[i].nonzero()[:, 0]
        for k, toks in enumerate(sp.tokens):
            masks[k, i, cols[list(toks)]] = True
    out = torch.zeros(S + 1, len(enc))
    params = dict(model.named_parameters())
    with eval_mode(model), GhostNorms(model, params) as ghost, torch.enable_grad():
        ghost.seq_len = batch.input_ids.shape[1]
        p, mask = token_probs(model, batch)
        for k in range(-1, S):
            m, _, t = summarize(p, mask if k < 0 else masks[k])
            m = torch.where(t > 0, m, torch.zeros_like(m))
            out[k + 1] = ghost.backward(m, retain_graph=k < S - 1).detach()
    return [[float(out[k + 1, i]) for k in range(len(sp.tokens))] for i, sp in enumerate(spans)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=16, help="answers (one batch)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--loop-repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from isouq.models import load_model
    from isouq.qa.prompts import qa_prompts
    from isouq.runtime import configure
    from isouq.sequences import encode, score_sequences
    from record import save_json

    configure()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, _ = load_model(args.model)
    questions, answers = five_sentence_answers(args.n)
    prompts = qa_prompts(tok, questions)
    n = len(answers)

    runs = {
        "whole": lambda: score_sequences(model, tok, prompts, answers, batch_size=n),
        "spans_rows": lambda: score_sequences(model, tok, prompts, answers, batch_size=n,
                                              spans="sentences"),
        "spans_retain": lambda: retain(model, tok, prompts, answers),
        "spans_loop": lambda: score_sequences(model, tok, prompts, answers, batch_size=n,
                                              spans="sentences", method="loop"),
    }
    seconds, cpu, results = {}, {}, {}
    for name, fn in runs.items():
        reps = args.loop_repeats if name == "spans_loop" else args.repeats
        if name == "whole":
            fn()  # warm-up (first calls of a process are slower)
        times, cpus = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        seconds[name], cpu[name] = statistics.median(times), statistics.median(cpus)
        print(f"{name:13s} {seconds[name]:8.3f} s wall, {cpu[name]:8.3f} s CPU", flush=True)

    loop = [[s.epistemic for s in sp] for sp in results["spans_loop"].spans]
    rows = [[s.epistemic for s in sp] for sp in results["spans_rows"].spans]

    def worst(a, b):
        return max(abs(x - y) / abs(y) for u, v in zip(a, b, strict=True)
                   for x, y in zip(u, v, strict=True))

    n_spans = sum(len(sp) for sp in loop)
    whole_diff = float(((results["spans_rows"].epistemic - results["whole"].epistemic).abs()
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
        "max_rel_diff_retain_vs_loop": worst(results["spans_retain"], loop),
        "max_rel_diff_whole_with_spans_vs_without": whole_diff,
    }
    for k, v in summary.items():
        if k not in ("seconds", "cpu_seconds"):
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    save_json(args.out, {"model": args.model, "benchmark": "spans"}, **summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
