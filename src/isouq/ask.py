"""Answer questions with a causal LM and say how far to trust each answer (``isouq ask``).

Each question is wrapped in the documented QA prompt (``qa.prompts.qa_prompt``: the chat
template when the model has one), answered greedily, and the answer's tokens are scored with
``score_sequences``: p̄ (mean token probability), aleatoric (1/T) Σₜ pₜ(1 − pₜ) and epistemic
‖∇θ p̄‖², every answer of the batch from one backward pass.

A raw ‖∇θ p̄‖² means little alone: it is comparable between answers of one model. With a
reference (the rows of an ``isouq qa run`` of the same model, e.g. the kept ``results/qa``),
each answer also gets the percentile of its epistemic and aleatoric scores among that model's
answers to the study's questions.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

from .errors import DataError, InputError

COLUMNS = (
    "p̄ = mean probability of the answer's tokens (the model's confidence)\n"
    "aleatoric = mean of p(1-p) over the tokens: ambiguity the model sees in the data\n"
    "epistemic = ‖∇θ p̄‖²: how much p̄ would move if the weights moved (lack of knowledge);\n"
    "            relative to the other rows, higher = trust the answer less"
)


def check_questions(questions: Sequence[str]) -> list[str]:
    """The questions, stripped; an InputError for none or an empty one."""
    out = [str(q).strip() for q in questions]
    if not out:
        raise InputError("no questions given; pass them as arguments or with --file")
    empty = [i for i, q in enumerate(out) if not q]
    if empty:
        raise InputError(f"question {empty[0]} is empty; remove it or write the question")
    return out


def answer_and_score(model, tokenizer, questions: Sequence[str], *, max_new_tokens: int = 50,
                     batch_size: int = 16) -> list[dict]:
    """Greedy answer and its uncertainty for each question.

    Returns N dicts: question, answer, mean_prob, aleatoric, epistemic (‖∇θ p̄‖²),
    normalized_epistemic (‖∇θ p̄‖² / ‖θ*‖²), n_tokens, and seconds {"generation", "scoring"}
    (each row's share of its batch). An empty answer gets NaN scores.
    """
    import time

    from .qa.generation import generate_greedy
    from .qa.prompts import qa_prompts
    from .sequences import score_sequences

    questions = check_questions(questions)
    prompts = qa_prompts(tokenizer, questions)
    gens = generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                           batch_size=batch_size)
    rows = [{"question": q, "answer": g.text, "mean_prob": float("nan"),
             "aleatoric": float("nan"), "epistemic": float("nan"),
             "normalized_epistemic": float("nan"), "n_tokens": 0,
             "seconds": {"generation": g.seconds, "scoring": 0.0}}
            for q, g in zip(questions, gens, strict=True)]
    scored = [i for i, g in enumerate(gens) if len(g.token_ids) > 0]
    if scored:
        t0 = time.perf_counter()
        s = score_sequences(model, tokenizer, [prompts[i] for i in scored],
                            [gens[i].token_ids for i in scored], batch_size=batch_size)
        for j, i in enumerate(scored):
            rows[i].update(mean_prob=float(s.mean_prob[j]), aleatoric=float(s.aleatoric[j]),
                           epistemic=float(s.epistemic[j]),
                           normalized_epistemic=float(s.normalized_epistemic[j]),
                           n_tokens=int(s.n_tokens[j]))
            rows[i]["seconds"]["scoring"] = (time.perf_counter() - t0) / len(scored)
    return rows


def reference_rows(path, model: str) -> list[dict]:
    """The QA study rows of ``model`` (its name as ``isouq qa run --model`` had it) in ``path``,
    a rows file or a folder of them, that carry the gradient scores."""
    from .report.inputs import collect

    rows = collect([path]).qa_rows
    mine = [r for r in rows if r["model"] == model and "epistemic" in r["scores"]]
    if not mine:
        have = ", ".join(sorted({str(r["model"]) for r in rows})) or "none"
        raise DataError(f"{path} has no QA rows of model {model!r} (models there: {have}); "
                        "pass the rows of an `isouq qa run` with the same --model")
    return mine


def add_percentiles(rows: Sequence[dict], reference: Sequence[dict]) -> None:
    """Add ``epistemic_percentile`` and ``aleatoric_percentile`` to each row: the share (in %)
    of the reference answers whose score is ≤ the row's (NaN for an unscored answer)."""
    import numpy as np

    for name in ("epistemic", "aleatoric"):
        ref = np.sort(np.array([r["scores"][name] for r in reference], dtype=float))
        for row in rows:
            v = row[name]
            row[f"{name}_percentile"] = (float("nan") if v != v else
                                         100.0 * np.searchsorted(ref, v, side="right") / len(ref))


def print_table(rows: Sequence[dict]) -> None:
    """Question, answer, p̄, aleatoric and epistemic per row, wrapped to the terminal's width."""
    width = shutil.get_terminal_size((120, 20)).columns
    qw = max(20, min(44, (width - 40) // 2))
    aw = max(16, width - qw - 36)
    pct = bool(rows) and "epistemic_percentile" in rows[0]
    head = f"{'question':<{qw}} {'answer':<{aw}} {'p̄':>7} {'alea.':>6} {'epist.':>9}"
    print("\n" + head + (f" {'epi. pct':>8} {'alea. pct':>9}" if pct else ""))
    print("-" * (qw + aw + 30 + (19 if pct else 0)))
    for r in rows:
        q = textwrap.wrap(r["question"], qw) or [""]
        a = textwrap.wrap(r["answer"], aw) or ["(empty)"]
        for i in range(max(len(q), len(a))):
            line = f"{q[i] if i < len(q) else '':<{qw}} {a[i] if i < len(a) else '':<{aw}}"
            if i == 0:
                line += f" {r['mean_prob']:6.3f} {r['aleatoric']:6.3f} {r['epistemic']:9.3g}"
                if pct:
                    line += (f" {r['epistemic_percentile']:8.0f}"
                             f" {r['aleatoric_percentile']:9.0f}")
            print(line.rstrip())
