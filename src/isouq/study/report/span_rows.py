"""Answer rows scored span by span (``isouq score --spans``, ``isouq ask --spans --json``):
how to recognize them and check them before a report reads them.

A span row is an answer row (:mod:`isouq.answer_row`) with a ``spans`` list, one entry per span
with its ``text``, character range ``start``/``end``, ``scores`` (:data:`SPAN_KEYS`) and
optionally a label ``correct`` (1 right, 0 wrong)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import DataError

#: the scores every span entry has
SPAN_KEYS: tuple[str, ...] = ("mean_prob", "aleatoric", "epistemic", "epistemic_log")
FIX = "write the file with `isouq score INPUT --out FILE --spans sentences`"


def is_span_row(row: Mapping) -> bool:
    """Whether ``row`` is an answer row scored span by span: an ``answer``, its ``scores`` and
    a ``spans`` list of span entries (objects). An input row of ``isouq score`` naming its own
    ranges (``"spans": [[start, end], ...]``, no scores) is not one."""
    spans = row.get("spans")
    return ("answer" in row and isinstance(row.get("scores"), Mapping)
            and isinstance(spans, list) and all(isinstance(s, Mapping) for s in spans))


def is_span_file(rows: Sequence[Mapping]) -> bool:
    """Whether ``rows`` (one file's) are answers scored span by span: one such row at least,
    every other an error row."""
    return any(is_span_row(r) for r in rows) and all(is_span_row(r) or "error" in r
                                                     for r in rows)


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_span_rows(rows: Sequence[Mapping], where: str | Path) -> None:
    """DataError (one line: the row, the span, what is missing, the fix) unless every span of
    every row of ``rows`` (read from ``where``) has its text, range and :data:`SPAN_KEYS`
    scores, and a ``correct`` that is 0, 1 or absent."""
    for r in rows:
        if not is_span_row(r):
            continue
        for k, s in enumerate(r["spans"]):
            at = f"{where}: row {r.get('key')!r}, span {k}"
            if not isinstance(s, Mapping) or not isinstance(s.get("scores"), Mapping):
                raise DataError(f"{at} has no scores; {FIX}")
            missing = [c for c in SPAN_KEYS if not _number(s["scores"].get(c))]
            bad = [c for c in ("text", "start", "end") if c not in s]
            if missing or bad:
                raise DataError(f"{at} lacks {missing + bad}; {FIX}")
            if s.get("correct") not in (None, 0, 1, True, False):
                raise DataError(f"{at}: 'correct' is {s['correct']!r}; label a span 1 (right) "
                                "or 0 (wrong), or leave the label out")


__all__ = ["FIX", "SPAN_KEYS", "check_span_rows", "is_span_file", "is_span_row"]
