"""The answer row: the one JSON shape of a scored answer, as ``isouq score``, ``isouq ask --json``
and ``isouq qa run`` write it (one JSON object per line).

Every row has::

    {"key": str,                 # the row's identity (the input's key, or derived from content)
     "question": str | None,     # the question, when the prompt was one
     "answer": str,              # the answer scored
     "scores": {score: float},   # keys of ``isouq.methods.SCORES`` (NaN/null: not scored)
     "seconds": {step: float},   # wall seconds per step, each row's share of its batch
     "n_answer_tokens": int}     # tokens of the answer scored

and each command adds its own fields beside them: ``isouq score`` the ``prompt``, ``model`` (as
the user named it), ``method``, ``n_params``, ``input_sha`` and ``settings_sha`` (resume), and
every other field of the input row as it was (a label travels to ``isouq calibrate``);
``isouq ask`` the ``samples``, ``semantic_clusters``, ``percentiles`` ({score: %} among
reference answers), ``p_correct`` and ``withheld`` (calibration); ``isouq qa run`` the
``model``, ``dataset``, ``references``, ``correct``, the judge's verdict, ``passes`` and
``revision``. A row that could not be scored
has an ``error`` (its reason) instead of scores.

Rows written before the scores moved into ``scores`` (flat: ``{"epistemic": ..., ...}``) are
read alike by :func:`scores_of`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import DataError

#: fields every answer row has
FIELDS: tuple[str, ...] = ("key", "question", "answer", "scores", "seconds", "n_answer_tokens")


def scores_of(row: Mapping) -> Mapping:
    """The scores of an answer row: its ``scores`` object, or for a row of the older flat
    shape the row itself."""
    sc = row.get("scores")
    return sc if isinstance(sc, Mapping) else row


def answer_id(row: Mapping) -> str:
    """A short, stable identity of one answer: 16 hex digits of the SHA-256 of its key, its
    question (or prompt) and its answer, so the same answer read from another file (or scored
    again) has the same id and two answers sharing a key (e.g. ``isouq ask``'s "0") differ."""
    what = [str(row.get("key")), row.get("question") or row.get("prompt"), row.get("answer")]
    return hashlib.sha256(json.dumps(what, ensure_ascii=False).encode()).hexdigest()[:16]


__all__ = ["FIELDS", "answer_id", "scores_of"]


# ------------------------------------------------ the short-answer study's rows (``qa short``)
#: the ``label_source`` of a row labelled by alias match (``isouq qa short``)
LABEL = "alias_match"
#: before a row's key: the open study (``qa run``) asks the same TriviaQA questions
KEY_PREFIX = "short-"
#: what a user with rows written before ``KEY_PREFIX`` runs once (``{folder}``: their folder)
MIGRATE = "python scripts/migrate_qa_short.py {folder}"


def short_key(key: str) -> str:
    """The key of a TriviaQA question's row in this study: ``tqa-val-00051`` ->
    ``short-tqa-val-00051``."""
    return KEY_PREFIX + str(key)


def source_key(key: str) -> str:
    """The question's TriviaQA key of a row key of this study (``short_key`` undone)."""
    return str(key).removeprefix(KEY_PREFIX)


def is_short_row(row: Mapping) -> bool:
    """Whether ``row`` is a row of this study (labelled by alias match)."""
    return row.get("label_source") == LABEL


def check_keys(rows: Iterable[Mapping], where: str | Path, *, error: type = DataError) -> None:
    """``error`` (one line naming the fix) when a row of this study in ``rows`` (read from the
    file ``where``) has a key without ``KEY_PREFIX``: written before the prefix, its key and
    hand labels would collide with the open study's rows of the same question."""
    bad = next((r for r in rows if is_short_row(r)
                and not str(r.get("key", "")).startswith(KEY_PREFIX)), None)
    if bad is not None:
        fix = MIGRATE.format(folder=Path(where).parent)
        raise error(f"{where}: `qa short` rows keyed as the open QA study's questions "
                    f"({bad.get('key')!r}, written before keys had the prefix {KEY_PREFIX!r}); "
                    f"run `{fix}` once")
