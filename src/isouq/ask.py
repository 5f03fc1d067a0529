"""Answer questions with a causal LM and say how far to trust each answer (``isouq ask``).

Each question is wrapped in the documented QA prompt (``llm.prompts.qa_prompt``: the chat
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

With ``spans`` (``isouq ask --spans``), each answer is also scored sentence by sentence
(``isouq.spans``): ``print_spans`` prints each sentence with its scores and marks the least
trusted one (by ``isouq.defaults.SPAN_SCORE``, chosen from the kept evidence), and
``spans_html`` shades each sentence by it.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import DataError, InputError
from .methods import BASELINES, SCORES, check_methods, check_sampling

CAUTION = (
    "Caution: none of these is a probability of being right, and which direction predicts "
    "errors depends on the model and the data (docs: What the scores mean); pass "
    "--calibration FILE for P(correct)."
)
#: the scores ``print_table`` shows (when the rows carry them), in this order
TABLE_SCORES: tuple[str, ...] = ("mean_prob", "aleatoric", "epistemic", "epistemic_log",
                                 "naive_entropy", "semantic_entropy", "p_true")


def check_questions(questions: Sequence[str]) -> list[str]:
    """The questions, stripped; an InputError for none or an empty one."""
    out = [str(q).strip() for q in questions]
    if not out:
        raise InputError("no questions given; pass them as arguments or with --file")
    empty = [i for i, q in enumerate(out) if not q]
    if empty:
        raise InputError(f"question {empty[0]} is empty; remove it or write the question")
    return out


def check_baselines(methods: Sequence[str], *, k: int, k_p_true: int,
                    temperature: float = 1.0) -> list[str]:
    """The baselines asked for, in registry order; an InputError for an unknown one or
    settings they cannot run with (the rule of ``isouq qa run``: ``methods.check_sampling``)."""
    methods = check_methods(methods, among=BASELINES)
    check_sampling(methods, k=k, k_p_true=k_p_true, temperature=temperature)
    return methods


def answer_and_score(model, tokenizer, questions: Sequence[str], *,
                     baselines: Sequence[str] = (), judge=None, k: int = 10,
                     k_p_true: int = 5, temperature: float = 1.0, seed: int = 0,
                     max_new_tokens: int = 50, batch_size: int = 16,
                     spans: str | None = None, params=None, blocks: bool = False,
                     hidden: bool = False) -> list[dict]:
    """Greedy answer and its uncertainty for each question.

    The gradient scores come from one backward pass per batch; each baseline of ``baselines``
    (``isouq.methods.BASELINES``) is computed from K answers per question, sampled once (seeded
    by ``seed`` and the question text) and shared: P(True) shows the first ``k_p_true``, and
    semantic entropy clusters them with ``judge`` (an ``EntailmentJudge``).

    Args:
        model, tokenizer: a causal LM and its tokenizer.
        questions: (N,) questions, wrapped in the QA prompt (``llm.prompts.qa_prompt``).
        baselines: sampling baselines to add.
        judge: semantic entropy's entailment judge.
        k, k_p_true, temperature, seed: sampling settings (as ``isouq qa run``).
        max_new_tokens: answer length cap (tokens).
        batch_size: answers per pass.
        spans: ``"sentences"`` or ``"lines"``: each row also gets ``spans``, its sentences (or
            lines) with their scores (``isouq.spans``; one more batched backward).
        params: the parameters the gradient scores cover (``isouq.params``; None: all).
        blocks: each row also gets its block profile (``blocks``: ‖∇θ_b p̄‖² per block of
            the model, from the same backward).
        hidden: each row also gets its mean hidden states (``hidden``, ``isouq.hidden``: what
            a calibration's hidden-state probe reads), from the scores' own forward.

    Returns:
        N answer rows (``isouq.answer_row``): key (the question's place), question, answer,
        scores (epistemic ‖∇θ p̄‖², epistemic_log, aleatoric, normalized_epistemic, mean_prob,
        and the baselines': naive_entropy in nats/token, semantic_entropy in nats, p_true in
        [0, 1]), seconds per step (each row's share of its batch; a baseline's includes the
        sampling), passes, n_answer_tokens; with baselines also ``samples`` (the K texts) and,
        with semantic entropy, ``semantic_clusters`` (one id per sample). An empty answer gets
        NaN gradient scores.
    """
    from .llm.generation import generate_greedy, sample_completions
    from .llm.prompts import qa_prompts
    from .study.qa.methods import AnswerBatch, run_methods

    questions = check_questions(questions)
    baselines = check_baselines(baselines, k=k, k_p_true=k_p_true, temperature=temperature)
    if "semantic_entropy" in baselines and judge is None:
        raise InputError("semantic entropy needs an entailment judge (--entailment-model)")
    prompts = qa_prompts(tokenizer, questions)
    gens = generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                           batch_size=batch_size)

    def sample():
        return sample_completions(model, tokenizer, prompts, k=k, temperature=temperature,
                                  seed=seed, keys=questions, max_new_tokens=max_new_tokens,
                                  batch_size=min(batch_size * k, 128))

    batch = AnswerBatch(model, tokenizer, questions, prompts, [g.text for g in gens],
                        [g.token_ids for g in gens], sample=sample, entailment=judge,
                        k_p_true=k_p_true, seed=seed, batch_size=batch_size, params=params,
                        blocks=blocks, hidden=hidden)
    got = run_methods(batch, ["gradient", *baselines])
    rows = []
    for i, (q, g, m) in enumerate(zip(questions, gens, got, strict=True)):
        row = {"key": str(i), "question": q, "answer": g.text, "scores": m["scores"],
               "seconds": {"generation": g.seconds, **m["seconds"]}, "passes": m["passes"],
               "n_answer_tokens": len(g.token_ids), **m["extra"]}
        if baselines:
            row["samples"] = batch.sampled()[i].texts
        rows.append(row)
    if spans is not None:
        add_spans(model, tokenizer, prompts, [g.token_ids for g in gens], rows, spans,
                  batch_size=batch_size)
    return rows


def add_spans(model, tokenizer, prompts: Sequence, answer_ids: Sequence,
              rows: Sequence[dict], spans: str, *, batch_size: int = 16) -> None:
    """Give each answer row a ``spans`` list (``SpanSequenceScores.row_spans``) and
    ``seconds["spans"]`` (its share of the span scoring); an answer with no token or no span
    (blank text) gets an empty list."""
    import time

    from .sequences import score_sequences
    from .spans import resolve_spans

    ok = []
    for i, ids in enumerate(answer_ids):
        rows[i]["spans"] = []
        if len(ids) == 0:
            continue
        try:
            resolve_spans(tokenizer, [ids], spans)
        except InputError:
            continue
        ok.append(i)
    if not ok:
        return
    t0 = time.perf_counter()
    res = score_sequences(model, tokenizer, [prompts[i] for i in ok],
                          [list(answer_ids[i]) for i in ok], batch_size=batch_size, spans=spans)
    share = (time.perf_counter() - t0) / len(ok)
    for j, i in enumerate(ok):
        rows[i]["spans"] = res.row_spans(j)
        rows[i].setdefault("seconds", {})["spans"] = share


@dataclass
class Asked:
    """What ``isouq ask`` shows: the answer rows, and what they were read against.

    Attributes:
        rows: the answer rows (``answer_and_score``), with percentiles and P(correct) when
            asked for.
        reference: the rows of a QA run the percentiles are taken in (or None).
        calibration: the calibrator that gave P(correct) (or None).
    """

    rows: list[dict]
    reference: list[dict] | None
    calibration: object


def ask(questions: Sequence[str], *, model: str, load: dict | None = None,
        baselines: Sequence[str] = (), entailment_model: str | None = None,
        entailment_load: dict | None = None, reference: str | None = None,
        calibration=None, params=None, on_rows: Callable[[list[dict]], None] | None = None,
        progress: bool = False, **options) -> Asked:
    """``isouq ask``: every check a user can fail first, then load, answer and score.

    The questions are answered and scored a batch at a time (``batch_size`` of ``options``), so
    a long list (``isouq ask --file``) shows its progress and hands out its rows as they are
    done.

    Args:
        questions: the questions (checked before any model loads).
        model: what ``isouq.models.load_model`` loads; ``load`` its options.
        baselines: sampling baselines (``isouq.methods.BASELINES``).
        entailment_model, entailment_load: semantic entropy's judge and its load options.
        reference: a QA run's rows (JSONL) to give each score its percentile in.
        calibration: a ``Calibrator`` giving P(correct) (checked against the model's files).
        params: the parameters the gradient scores cover (``isouq.params``; None: all).
        on_rows: called with each batch's finished rows, in order (e.g. to print them).
        progress: a progress bar (on stderr) when there is more than one batch.
        **options: ``answer_and_score``'s settings (k, k_p_true, temperature, seed,
            max_new_tokens, batch_size, spans).

    Returns:
        Asked: the rows and what they were read against.
    """
    from .models import check_loadable, load_classifier_or_lm, load_model

    questions = check_questions(questions)
    baselines = check_baselines(baselines, k=options.get("k", 10),
                                k_p_true=options.get("k_p_true", 5),
                                temperature=options.get("temperature", 1.0))
    ref = None if reference is None else reference_rows(reference, model)
    check_loadable(model)
    if "semantic_entropy" in baselines:
        check_loadable(entailment_model)
    lm, tok, info = load_model(model, **(load or {}))
    if calibration is not None:
        calibration.check_model(model, getattr(info, "files", None))
        if calibration.needs_blocks:  # the blocks the head reads: this model's?
            from .blocks import block_map
            from .params import select_params

            calibration.check_blocks(block_map(lm, tuple(select_params(lm, params))).names)
        if calibration.needs_hidden:  # the states the probe reads: this model's?
            from .hidden import model_states

            calibration.check_hidden(model_states(lm))
    judge = None
    if "semantic_entropy" in baselines:
        from .study.qa.baselines.semantic_entropy import entailment_judge

        jm, jt, _ = load_classifier_or_lm(entailment_model, **(entailment_load or {}))
        judge = entailment_judge(jm, jt, name=entailment_model,
                                 batch_size=options.get("batch_size", 16))
    step = options.get("batch_size", 16)
    bar = None
    if progress and len(questions) > step:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(questions), unit="answer", desc="ask")
    rows: list[dict] = []
    for start in range(0, len(questions), step):
        part = answer_and_score(lm, tok, questions[start:start + step], baselines=baselines,
                                judge=judge, params=params, blocks=calibration is not None
                                and calibration.needs_blocks, hidden=calibration is not None
                                and calibration.needs_hidden, **options)
        for i, r in enumerate(part, start):
            r["key"] = str(i)
        if ref is not None:
            add_percentiles(part, ref)
        if calibration is not None:
            calibration.annotate(part)
            for r in part:  # what the probe read, not an answer's score: not shown
                r.pop("hidden", None)
        rows += part
        if on_rows is not None:
            on_rows(part)
        if bar is not None:
            bar.update(len(part))
    if bar is not None:
        bar.close()
    return Asked(rows, ref, calibration)


def reference_rows(path, model: str) -> list[dict]:
    """The QA study rows of ``model`` (its name as ``isouq qa run --model`` had it) in ``path``,
    a rows file or a folder of them, that carry the gradient scores."""
    from .study.report.inputs import collect

    rows = collect([path]).qa_rows
    mine = [r for r in rows if r["model"] == model and "epistemic" in r["scores"]]
    if not mine:
        have = ", ".join(sorted({str(r["model"]) for r in rows})) or "none"
        raise DataError(f"{path} has no QA rows of model {model!r} (models there: {have}); "
                        "pass the rows of an `isouq qa run` with the same --model")
    return mine


def add_percentiles(rows: Sequence[dict], reference: Sequence[dict]) -> None:
    """Add ``percentiles`` {score: %} to each row for p̄, epistemic, epistemic_log, aleatoric and
    each baseline the rows carry: the share (in %) of the reference answers, among those that
    have the score, whose score is ≤ the row's (NaN for an unscored answer). Reference rows
    written before ``epistemic_log`` was recorded get it as epistemic / p̄²."""
    import numpy as np

    from .answer_row import scores_of

    def score_of(r: dict, name: str):
        sc = scores_of(r)
        if name == "epistemic_log" and name not in sc and sc.get("mean_prob"):
            if "epistemic" in sc:
                return sc["epistemic"] / sc["mean_prob"] ** 2
        return sc.get(name)

    for row in rows:
        row.setdefault("percentiles", {})
    for name in ("mean_prob", "epistemic", "epistemic_log", "aleatoric", *BASELINES):
        have = [v for r in reference if (v := score_of(r, name)) is not None]
        if not rows or name not in rows[0]["scores"] or not have:
            continue
        ref = np.sort(np.array(have, dtype=float))
        for row in rows:
            v = row["scores"][name]
            row["percentiles"][name] = (
                float("nan") if v != v
                else 100.0 * np.searchsorted(ref, v, side="right") / len(ref))


def legend(rows: Sequence[dict]) -> str:
    """What the table's columns mean: a line per score shown (``methods.SCORES``), the
    percentiles when there are any, and, unless the rows carry a calibrated ``p_correct``,
    the caution that no score is a probability."""
    shown = [SCORES[s].help for s in TABLE_SCORES if rows and s in rows[0]["scores"]]
    if rows and rows[0].get("percentiles"):
        shown.append("pct = percentile of the score among the reference answers of this model")
    calibrated = bool(rows) and "p_correct" in rows[0]
    width = min(shutil.get_terminal_size((100, 20)).columns, 100)
    return "\n".join(textwrap.fill(line, width, subsequent_indent="    ")
                     for line in [*shown, *([] if calibrated else [CAUTION])])


def _columns(rows: Sequence[dict]) -> list[tuple[str, object, int, str]]:
    """(header, value of a row, width, format) of each column the rows fill."""
    if not rows:
        return []
    first = rows[0]
    cols = [(sc.header, lambda r, s=s: r["scores"][s],
             9 if sc.fmt == ".3g" else max(6, len(sc.header)), sc.fmt)  # .3g needs 9 places
            for s in TABLE_SCORES if s in first["scores"] for sc in [SCORES[s]]]
    cols += [(f"{SCORES[s].header} pct", lambda r, s=s: r["percentiles"][s],
              len(SCORES[s].header) + 4, ".0f") for s in first.get("percentiles", {})]
    cols += [(h, lambda r, f=f: r[f], w, fmt) for h, f, w, fmt in
             (("P(ok)", "p_correct", 6, ".2f"), ("withheld", "withheld", 8, "")) if f in first]
    return cols


def print_table(rows: Sequence[dict]) -> None:
    """Question, answer and every score the rows carry (``TABLE_SCORES``), their percentiles
    and calibrated P(correct), wrapped to the terminal's width."""
    width = shutil.get_terminal_size((120, 20)).columns
    cols = _columns(rows)
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
                line += "".join(f" {_cell(get(r), w, fmt)}" for _, get, w, fmt in cols)
            print(line.rstrip())


def _cell(v, width: int, fmt: str) -> str:
    """A table cell: a number formatted with ``fmt``, a boolean as yes/no (``withheld``)."""
    return ("yes" if v else "no").rjust(width) if isinstance(v, bool) else f"{v:{width}{fmt}}"


def print_spans(rows: Sequence[dict]) -> None:
    """Each answer sentence by sentence (its ``spans``): p̄, aleatoric, epistemic and
    epistemic_log of each, the least trusted (by ``defaults.SPAN_SCORE``, named) marked."""
    from .defaults import SPAN_SCORE, least_trusted

    names = ("mean_prob", "aleatoric", "epistemic", "epistemic_log")
    width = shutil.get_terminal_size((120, 20)).columns
    head = "".join(f"{SCORES[s].header:>10}" for s in names)
    tw = max(30, width - len(head) - 4)
    for r in rows:
        spans = r.get("spans") or []
        print(f"\n{r['key']}: {r['question']}")
        if not spans:
            print("  (no sentence to score)")
            continue
        print(f"{head}   sentence")
        worst = least_trusted(spans)
        for k, sp in enumerate(spans):
            cells = "".join(f"{sp['scores'][s]:>10{SCORES[s].fmt}}" for s in names)
            lines = textwrap.wrap(sp["text"], tw) or [""]
            mark = f"  <- least trusted (by {SPAN_SCORE})" if k == worst else ""
            print(f"{cells}   {lines[0]}{mark if len(lines) == 1 else ''}")
            for j, line in enumerate(lines[1:], 2):
                print(f"{'':{len(cells)}}   {line}{mark if j == len(lines) else ''}")

