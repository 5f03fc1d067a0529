"""Answer questions with a causal LM and say how far to trust each answer (``isouq ask``).

Each question is wrapped in the documented QA prompt (``qa.prompts.qa_prompt``: the chat
template when the model has one), answered greedily, and the answer's tokens are scored with
``score_sequences``: p̄ (mean token probability), aleatoric (1/T) Σₜ pₜ(1 − pₜ) and epistemic
‖∇θ p̄‖², every answer of the batch from one backward pass.

A raw ‖∇θ p̄‖² means little alone: it is comparable between answers of one model. With a
reference (the rows of an ``isouq qa run`` of the same model, e.g. the kept ``results/qa``),
each answer also gets the percentile of its epistemic and aleatoric scores among that model's
answers to the study's questions.

With ``baselines``, the QA study's sampling-based scores are added for comparison (same
defaults as ``isouq qa run``): naive entropy over K = 10 answers sampled at T = 1, semantic
entropy over the same samples clustered by an entailment judge, and P(True) with K = 5
brainstormed answers. They cost K generations (plus the judge's calls) per question, where the
gradient scores cost one backward pass.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

from .errors import DataError, InputError

COLUMNS = (
    "p̄ = mean probability of the answer's tokens (the model's own confidence)\n"
    "aleatoric = mean of p(1-p) over the tokens: how spread the model's token choices are\n"
    "epistemic = ‖∇θ p̄‖²: how far p̄ moves when the weights move; = p̄²·‖∇θ log p̄‖², so it\n"
    "            also carries p̄ (a low-confidence answer gets a small value)\n"
    "epi. log = ‖∇θ log p̄‖²: the same sensitivity without p̄'s scale"
)
CAUTION = (
    "Caution: none of these is a probability of being right, and which direction predicts "
    "errors depends on the model and the data (docs: What the scores mean); pass "
    "--calibration FILE for P(correct)."
)
BASELINES = ("naive_entropy", "semantic_entropy", "p_true")
"""The QA study's sampling-based baselines, in the order ``add_baselines`` computes them."""
BASELINE_COLUMNS = {
    "naive_entropy": "naive H = entropy of K sampled answers (nats/token; higher = less certain)",
    "semantic_entropy": "SE = entropy over the meanings of the K samples (nats; higher = less "
                        "certain)",
    "p_true": "P(True) = the model's own probability that its answer is true (higher = more "
              "certain)",
}
NUMERIC = (  # table columns: (header, row field, width, format)
    ("p̄", "mean_prob", 6, ".3f"), ("alea.", "aleatoric", 6, ".3f"),
    ("epist.", "epistemic", 9, ".3g"), ("epi. log", "epistemic_log", 9, ".3g"),
    ("naive H", "naive_entropy", 7, ".3f"),
    ("SE", "semantic_entropy", 6, ".3f"), ("P(True)", "p_true", 7, ".3f"),
    ("p̄ pct", "mean_prob_percentile", 6, ".0f"),
    ("epi. pct", "epistemic_percentile", 8, ".0f"),
    ("log pct", "epistemic_log_percentile", 7, ".0f"),
    ("alea. pct", "aleatoric_percentile", 9, ".0f"),
    ("P(ok)", "p_correct", 6, ".2f"), ("withheld", "withheld", 8, ""),
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

    Returns N dicts: question, answer, mean_prob, aleatoric, epistemic (‖∇θ p̄‖²), epistemic_log
    (‖∇θ log p̄‖² = epistemic / p̄²),
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
             "aleatoric": float("nan"), "epistemic": float("nan"), "epistemic_log": float("nan"),
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
                           epistemic_log=float(s.epistemic_log[j]),
                           normalized_epistemic=float(s.normalized_epistemic[j]),
                           n_tokens=int(s.n_tokens[j]))
            rows[i]["seconds"]["scoring"] = (time.perf_counter() - t0) / len(scored)
    return rows


def check_baselines(methods: Sequence[str], *, k: int, k_p_true: int,
                    temperature: float = 1.0) -> list[str]:
    """The baselines asked for, in ``BASELINES`` order; an InputError for an unknown one or
    settings they cannot run with (the rule ``isouq qa run`` applies: ``check_sampling``)."""
    from .qa.baselines import check_sampling

    unknown = sorted(set(methods) - set(BASELINES))
    if unknown:
        raise InputError(f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)}")
    methods = [m for m in BASELINES if m in methods]
    check_sampling(methods, k=k, k_p_true=k_p_true, temperature=temperature)
    return methods


def add_baselines(model, tokenizer, rows: Sequence[dict], methods: Sequence[str], *,
                  judge=None, k: int = 10, k_p_true: int = 5, temperature: float = 1.0,
                  seed: int = 0, max_new_tokens: int = 50, batch_size: int = 16) -> None:
    """Add the sampling baselines to each row of ``answer_and_score`` (in place).

    K answers per question are sampled once (seeded by ``seed`` and the question text) and
    shared: ``naive_entropy`` (nats/token), ``semantic_entropy`` (nats; with ``judge``, an
    ``EntailmentJudge``) and its ``semantic_clusters`` (one id per sample), ``p_true`` (in
    [0, 1]) from the first ``k_p_true`` samples. Rows also get ``samples`` (the K texts) and
    each method's seconds, sampling included.
    """
    from .qa.generation import sample_completions
    from .qa.prompts import qa_prompts

    methods = check_baselines(methods, k=k, k_p_true=k_p_true, temperature=temperature)
    if "semantic_entropy" in methods and judge is None:
        raise InputError("semantic entropy needs an entailment judge (--entailment-model)")
    if not methods or not rows:
        return
    questions = [r["question"] for r in rows]
    sampled = sample_completions(model, tokenizer, qa_prompts(tokenizer, questions), k=k,
                                 temperature=temperature, seed=seed, keys=questions,
                                 max_new_tokens=max_new_tokens,
                                 batch_size=min(batch_size * k, 128))
    for r, s in zip(rows, sampled, strict=True):
        r["samples"] = s.texts
    if "naive_entropy" in methods:
        from .qa.baselines.naive_entropy import naive_entropy

        for r, v in zip(rows, naive_entropy(sampled), strict=True):
            r["naive_entropy"], r["seconds"]["naive_entropy"] = v.value, v.seconds
    if "semantic_entropy" in methods:
        from .qa.baselines.semantic_entropy import semantic_entropy

        for r, v in zip(rows, semantic_entropy(questions, sampled, judge), strict=True):
            r["semantic_entropy"], r["semantic_clusters"] = v.value, v.cluster_ids
            r["seconds"]["semantic_entropy"] = v.seconds
    if "p_true" in methods:
        from .qa.baselines.p_true import p_true

        got = p_true(model, tokenizer, questions, [r["answer"] for r in rows],
                     brainstormed=sampled, k=k_p_true, batch_size=batch_size)
        for r, v in zip(rows, got, strict=True):
            r["p_true"], r["seconds"]["p_true"] = v.value, v.seconds


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
    """Add ``{score}_percentile`` to each row for p̄, epistemic, epistemic_log, aleatoric and
    each baseline the rows carry: the share (in %) of the reference answers, among those that
    have the score, whose score is ≤ the row's (NaN for an unscored answer). Reference rows
    written before ``epistemic_log`` was recorded get it as epistemic / p̄²."""
    import numpy as np

    def score_of(r: dict, name: str):
        sc = r["scores"]
        if name == "epistemic_log" and name not in sc and sc.get("mean_prob"):
            if "epistemic" in sc:
                return sc["epistemic"] / sc["mean_prob"] ** 2
        return sc.get(name)

    for name in ("mean_prob", "epistemic", "epistemic_log", "aleatoric", *BASELINES):
        have = [v for r in reference if (v := score_of(r, name)) is not None]
        if not rows or name not in rows[0] or not have:
            continue
        ref = np.sort(np.array(have, dtype=float))
        for row in rows:
            v = row[name]
            row[f"{name}_percentile"] = (float("nan") if v != v else
                                         100.0 * np.searchsorted(ref, v, side="right") / len(ref))


def legend(rows: Sequence[dict]) -> str:
    """What the table's columns mean: ``COLUMNS``, a line per baseline shown, and, unless the
    rows carry a calibrated ``p_correct``, the caution that no score is a probability."""
    extra = [BASELINE_COLUMNS[m] for m in BASELINES if rows and m in rows[0]]
    if rows and any("_percentile" in k for k in rows[0]):
        extra.append("pct = percentile of the score among the reference answers of this model")
    calibrated = bool(rows) and "p_correct" in rows[0]
    return "\n".join([COLUMNS, *extra, *([] if calibrated else [CAUTION])])


def print_table(rows: Sequence[dict]) -> None:
    """Question, answer and every score the rows carry (``NUMERIC``), wrapped to the
    terminal's width."""
    width = shutil.get_terminal_size((120, 20)).columns
    cols = [c for c in NUMERIC if rows and c[1] in rows[0]]
    rest = width - sum(w + 1 for _, _, w, _ in cols) - 1
    qw = max(20, min(44, rest // 2))
    aw = max(16, rest - qw)
    print("\n" + f"{'question':<{qw}} {'answer':<{aw}}"
          + "".join(f" {h:>{w}}" for h, _, w, _ in cols))
    print("-" * (qw + aw + 1 + sum(w + 1 for _, _, w, _ in cols)))
    for r in rows:
        q = textwrap.wrap(r["question"], qw) or [""]
        a = textwrap.wrap(r["answer"], aw) or ["(empty)"]
        for i in range(max(len(q), len(a))):
            line = f"{q[i] if i < len(q) else '':<{qw}} {a[i] if i < len(a) else '':<{aw}}"
            if i == 0:
                line += "".join(f" {_cell(r[f], w, fmt)}" for _, f, w, fmt in cols)
            print(line.rstrip())


def _cell(v, width: int, fmt: str) -> str:
    """A table cell: a number formatted with ``fmt``, a boolean as yes/no (``withheld``)."""
    return ("yes" if v else "no").rjust(width) if isinstance(v, bool) else f"{v:{width}{fmt}}"
