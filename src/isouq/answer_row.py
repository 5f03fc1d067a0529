"""The answer row: the one JSON shape of a scored answer, as ``isouq score``, ``isouq ask --json``
and ``isouq qa run`` write it (one JSON object per line).

Every row has::

    {"key": str,                 # the row's identity (the input's key, or derived from content)
     "question": str | None,     # the question, when the prompt was one
     "answer": str,              # the answer scored
     "scores": {score: float},   # keys of ``isouq.methods.SCORES`` (NaN/null: not scored)
     "seconds": {step: float},   # wall seconds per step, each row's share of its batch
     "n_answer_tokens": int}     # tokens of the answer scored

and each command adds its own fields beside them: ``isouq score`` the ``prompt``, ``method``,
``n_params``, ``input_sha`` and ``settings_sha`` (resume); ``isouq ask`` the ``samples``,
``semantic_clusters``, ``percentiles`` ({score: %} among reference answers), ``p_correct`` and
``withheld`` (calibration); ``isouq qa run`` the ``model``, ``dataset``, ``references``,
``correct``, the judge's verdict, ``passes`` and ``revision``. A row that could not be scored
has an ``error`` (its reason) instead of scores.

Rows written before the scores moved into ``scores`` (flat: ``{"epistemic": ..., ...}``) are
read alike by :func:`scores_of`.
"""

from __future__ import annotations

from collections.abc import Mapping

#: fields every answer row has
FIELDS: tuple[str, ...] = ("key", "question", "answer", "scores", "seconds", "n_answer_tokens")


def scores_of(row: Mapping) -> Mapping:
    """The scores of an answer row: its ``scores`` object, or for a row of the older flat
    shape the row itself."""
    sc = row.get("scores")
    return sc if isinstance(sc, Mapping) else row


__all__ = ["FIELDS", "scores_of"]
