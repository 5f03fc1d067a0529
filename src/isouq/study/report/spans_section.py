"""Report section of answers scored span by span: "Long answers, sentence by sentence".

Input: JSONL files of answer rows (:mod:`isouq.answer_row`) with a ``spans`` list, as
``isouq score --spans sentences`` (or ``lines``) and ``isouq ask --spans --json`` write them:
one entry per span with its ``text``, character range ``start``/``end`` and ``scores``
(``mean_prob``, ``aleatoric``, ``epistemic``, ``epistemic_log``), and optionally a label
``correct`` (1 right, 0 wrong; ``isouq qa long`` labels its sentences so). Error rows (an
``error`` instead of scores) are counted, not shown.

The section shows, per file: answers, spans, the median span epistemic_log, and how often the
least-trusted span (:func:`isouq.defaults.least_trusted`: the highest ``defaults.SPAN_SCORE`` of an answer
with two spans or more) is not the answer's first span, a sign that the score singles out a
sentence inside the answer rather than its start. Where spans carry ``correct``: the AUROC of
each span score for the wrong spans with a 95% bootstrap interval over answers
(:func:`isouq.study.analysis.long_spans.long_tables`, the tables of ``isouq qa long``; scores
read as uncertainties fixed in advance, probabilities as 1 − p̄). Then at most ``max_answers``
answers (in file order) shaded span by span (:func:`isouq.study.report.spans.answer_html`, the
page of ``isouq score --html``), the rest counted.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import InputError
from ...runio import latest_by_key
from ..analysis.long_spans import SCORES, long_tables
from .document import Block, Section, unique_slug
from .long_section import interval_cell
from .span_rows import is_span_row
from .spans import LEGEND, answer_html
from .tables import make_table

TITLE = "Long answers, sentence by sentence"
#: the section's id (before ``unique_slug``'s suffix)
SECTION_ID = "long-answers-sentence-by-sentence"
#: answers shaded in the report unless ``isouq report --max-span-answers`` says otherwise
MAX_ANSWERS = 50
#: the scores evaluated against span labels: the span's own (qa long's span scores and p̄)
SPAN_SCORES = tuple(s for s in SCORES if s.source == "span")
#: beside ``OUT``, ``isouq score`` records its settings (the model) in ``OUT.meta.json``
#: (``score_run.meta_path``; the application layer is above this one)
META_SUFFIX = ".meta.json"


# --------------------------------------------------------------------------- rows
def model_of(path: Path, rows: Sequence[Mapping]) -> str:
    """The model of a file's rows: their ``model`` field, else the ``settings.model`` that
    ``isouq score`` recorded beside the file, else ``–``."""
    named = {str(r["model"]) for r in rows if r.get("model")}
    if named:
        return ", ".join(sorted(named))
    try:
        meta = json.loads(Path(str(path) + META_SUFFIX).read_text(encoding="utf-8"))
        return str(meta["settings"]["model"])
    except (OSError, ValueError, KeyError, TypeError):
        return "–"


def _first(spans: Sequence[Mapping]) -> int:
    """The place of the span that begins first in the answer."""
    return min(range(len(spans)), key=lambda k: spans[k]["start"])


# --------------------------------------------------------------------------- tables
def file_row(path: Path, rows: Sequence[Mapping], rendered: int) -> dict:
    """One file's summary: answers, error rows, spans, the median span epistemic_log, answers
    with a least-trusted span (two spans or more) and the share whose least-trusted span is
    not the first, labelled and wrong spans, answers shaded in the report."""
    from ...defaults import least_trusted

    ok = [r for r in rows if is_span_row(r)]
    spans = [s for r in ok for s in r["spans"]]
    logs = [v for s in spans if math.isfinite(v := float(s["scores"]["epistemic_log"]))]
    worst = [(least_trusted(r["spans"]), r["spans"]) for r in ok]
    worst = [(w, sp) for w, sp in worst if w is not None]
    labelled = [s for s in spans if s.get("correct") is not None]
    return {
        "file": str(path), "model": model_of(path, ok), "answers": len(ok),
        "error rows": len(rows) - len(ok), "spans": len(spans),
        "median span epistemic_log": statistics.median(logs) if logs else None,
        "answers with ≥ 2 spans": len(worst),
        "least trusted not the first (share)": (
            sum(w != _first(sp) for w, sp in worst) / len(worst) if worst else None),
        "labelled spans": len(labelled),
        "wrong spans": sum(not s["correct"] for s in labelled),
        "shaded below": rendered,
    }


def labelled_rows(path: Path, rows: Sequence[Mapping], model: str) -> list[dict]:
    """The labelled spans of a file as ``long_spans`` sentence rows (``setting``: the file)."""
    return [{"setting": str(path), "model": model, "answer": str(r.get("key")), "index": k,
             "wrong": 1 - int(s["correct"]), "span": s["scores"], "whole": r.get("scores") or {}}
            for r in rows if is_span_row(r) for k, s in enumerate(r["spans"])
            if s.get("correct") is not None]


def span_tables(found: Sequence[tuple[Path, Sequence[Mapping]]], *,
                max_answers: int = MAX_ANSWERS, n_bootstrap: int = 300,
                seed: int = 0) -> dict[str, list[dict]]:
    """The section's tables as plain rows: ``files`` (:func:`file_row` per file) and, where
    spans carry labels, ``counts`` and ``auroc`` (``long_spans.long_tables`` over the span
    scores, ``setting`` = the file)."""
    files, labelled, left = [], [], max_answers
    for path, rows in found:
        n = sum(map(is_span_row, rows))
        row = file_row(path, rows, min(n, left))
        left -= row["shaded below"]
        files.append(row)
        labelled += labelled_rows(path, rows, row["model"])
    out: dict[str, list[dict]] = {"files": files}
    if labelled:
        t = long_tables(labelled, n_bootstrap=n_bootstrap, seed=seed, scores=SPAN_SCORES)
        out["counts"] = t["counts"]
        out["auroc"] = t["auroc"]
    return out


# --------------------------------------------------------------------------- section
def check_max_answers(n: int) -> None:
    """InputError unless ``n`` (answers to shade) is a whole number ≥ 0."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"max_span_answers={n!r}: give a whole number of answers to shade, "
                         "0 or more (0 shows the tables only)")


def answers_html(found: Sequence[tuple[Path, Sequence[Mapping]]], max_answers: int) -> str:
    """The first ``max_answers`` answers of the files, each shaded span by span under its
    file's name; a line counting the answers left out."""
    parts, left, total = [], max_answers, 0
    for path, rows in found:
        ok = [r for r in rows if is_span_row(r)]
        total += len(ok)
        shown, left = ok[:max(left, 0)], left - len(ok[:max(left, 0)])
        if shown:
            parts.append(f'<h4>{html.escape(str(path))}</h4>')
            parts += [answer_html(r) for r in shown]
    if total > max_answers:
        parts.append(f'<p class="muted">{total - max_answers} more answer(s) not shown '
                     f"(counted in the tables above); isouq report --max-span-answers N shows "
                     "more.</p>")
    return f'<div class="answers"><h3>Answers, span by span</h3>{"".join(parts)}</div>'


def spans_section(found: Sequence[tuple[Path, Sequence[Mapping]]], taken: set[str], *,
                  max_answers: int = MAX_ANSWERS, n_bootstrap: int = 300,
                  seed: int = 0) -> tuple[Section, dict]:
    """The section of ``(shown path, rows)`` pairs of span files and its plain tables.

    Args:
        found: one pair per file (``Inputs.spans``), rows in file order.
        taken: section ids already used (the new id is added).
        max_answers: answers shaded at most, over all files, in order (≥ 0).
        n_bootstrap, seed: resamples of the answers for the AUROC intervals.

    Returns:
        (the Section, ``{"files", ["counts", "auroc"]}``).
    """
    check_max_answers(max_answers)
    found = [(p, latest_by_key(rows, ("key",))) for p, rows in found]
    tables = span_tables(found, max_answers=max_answers, n_bootstrap=n_bootstrap, seed=seed)
    sid = unique_slug(SECTION_ID, taken)
    n = sum(r["answers"] for r in tables["files"])
    notes = [
        "Answers scored span by span (isouq score --spans sentences, or isouq ask --spans "
        "--json): every span's p̄, aleatoric, epistemic and epistemic_log = ‖∇θ log p̄‖² "
        "from the model, the span's tokens conditioned on the prompt and the answer before "
        "them. The least-trusted span of an answer is its highest epistemic_log (answers with "
        "two spans or more); 'not the first' counts those where it is not the opening span.",
        f"Shaded below: {min(n, max_answers)} of {n} answer(s)"
        + (f"; the other {n - max_answers} are counted in the tables only "
           "(isouq report --max-span-answers N)." if n > max_answers else ".")
        + " " + LEGEND,
    ]
    blocks = [Block(ours=make_table(
        "span_files", tables["files"],
        title="Per file: answers, spans and the least-trusted span"))]
    if tables.get("auroc"):
        notes.append("Spans labelled right or wrong ('correct' in a span entry): AUROC of each "
                     "span score for the wrong spans, read as an uncertainty fixed in advance "
                     "(1 − p̄ for the probability); above 0.5 = higher on wrong spans. "
                     f"Intervals: 95% bootstrap over answers ({n_bootstrap} resamples, seed "
                     f"{seed}).")
        counts = [{"file": r["setting"], "model": r["model"], "answers": r["answers"],
                   "spans": r["sentences"], "wrong": r["wrong"], "right": r["correct"]}
                  for r in tables["counts"]]
        blocks.append(Block(ours=make_table("span_counts", counts,
                                            title="Labelled spans per file")))
        auroc = [{"file": r["setting"], "model": r["model"], "score": r["score"],
                  "spans": r["n"], "AUROC [95% interval]": interval_cell(r),
                  "direction": r["direction"]} for r in tables["auroc"]]
        blocks.append(Block(ours=make_table(
            "span_auroc", auroc,
            title="AUROC for the wrong spans [95% interval, bootstrap over answers]")))
    elif any(r["labelled spans"] for r in tables["files"]):
        notes.append("The labelled spans are all right or all wrong: no AUROC.")
    section = Section(id=sid, title=TITLE, source=", ".join(str(p) for p, _ in found),
                      notes=tuple(notes), blocks=tuple(blocks),
                      html=(answers_html(found, max_answers),))
    return section, tables


__all__ = ["MAX_ANSWERS", "SECTION_ID", "TITLE", "answers_html", "check_max_answers",
           "file_row", "labelled_rows", "model_of", "span_tables", "spans_section"]
