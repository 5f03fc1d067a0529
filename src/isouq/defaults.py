"""The scores isouq shows first, chosen from the kept evidence by one written rule.

Without a calibration, a user sees one score first: the headline of a whole answer (``isouq
ask``'s first column, the server's and its page's headline) and the score that picks an
answer's least-trusted sentence (``isouq ask --spans``, ``--html``, the server's
``least_trusted_span`` and its page's shading). Each is chosen by :func:`choose` from the kept
evidence, and a test (``tests/test_defaults.py``) applies the rule to the kept files again, so a
default cannot drift from what the data show:

- **the rule** (:data:`RULE`): among the candidate scores, those that never point the wrong way
  beyond noise in any kept cell (model × dataset or setting: the 95% bootstrap interval of the
  AUROC, oriented the way the default reads the score, never lies wholly below 0.5), the one
  with the highest AUROC pooled over the cells (weighted by the cell's answers or sentences);
- **whole answers** (:data:`ANSWER_SCORE`): candidates p̄ and isouq's three scores, judged on
  the kept QA study (``results/report/report.json``, raw AUROC of each score as a confidence,
  judge labels);
- **sentences** (:data:`SPAN_SCORE`): candidates the span scores ``isouq.spans`` computes,
  judged on the kept long answers labelled sentence by sentence (``results/qa_long``, AUROC of
  each span score for the wrong sentences).

With a calibration (``--calibration``), ``p_correct`` is the headline instead, and the
least-trusted sentence stays the one :data:`SPAN_SCORE` picks (a span head would need span
labels of the user's model).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

RULE = ("among the candidate scores that never point the wrong way beyond noise in a kept cell "
        "(95% bootstrap interval of the AUROC, oriented as the default reads the score, wholly "
        "below 0.5), the one with the highest AUROC pooled over the cells (weighted by their "
        "size)")

#: the headline of a whole answer without a calibration (higher = more trusted)
ANSWER_SCORE = "mean_prob"
#: what picks an answer's least-trusted sentence: its highest value (a span score where
#: higher = less trusted)
SPAN_SCORE = "aleatoric"
#: whether a higher value of a score means less trust (the others: more trust)
HIGHER_IS_LESS_TRUSTED = {"mean_prob": False, "seq_logprob": False, "aleatoric": True,
                          "epistemic": True, "epistemic_log": True,
                          "normalized_epistemic": True}
#: the scores that span orders of magnitude, compared (and shaded) on a log scale
LOG_SCALE = frozenset({"epistemic", "epistemic_log", "normalized_epistemic"})


@dataclass(frozen=True)
class Cell:
    """One kept cell of the evidence for one score: its size ``n``, and its AUROC with the 95%
    interval, oriented as the default reads the score (above 0.5: the right way)."""

    score: str
    n: int
    auroc: float
    ci_low: float
    ci_high: float


def choose(cells: Iterable[Cell], candidates: Sequence[str]) -> str:
    """The score :data:`RULE` picks among ``candidates`` (ties: the earlier candidate).

    Raises:
        ValueError: no candidate has a cell, or every one points the wrong way somewhere.
    """
    cells = list(cells)
    scored = {}
    for c in candidates:
        mine = [x for x in cells if x.score == c]
        if not mine or any(x.ci_high < 0.5 for x in mine):
            continue
        scored[c] = sum(x.n * x.auroc for x in mine) / sum(x.n for x in mine)
    if not scored:
        raise ValueError("no candidate score stands in the evidence: every one points the wrong "
                         "way in some cell, or none has a cell")
    best = max(scored.values())
    return next(c for c in candidates if scored.get(c) == best)


def least_trusted(spans: Sequence[Mapping], score: str = SPAN_SCORE) -> int | None:
    """The place of the span to check first in an answer row's ``spans`` list: the one
    ``score`` trusts least (its highest value, or lowest for a confidence such as p̄); None with
    fewer than two spans or no finite value."""
    sign = 1.0 if HIGHER_IS_LESS_TRUSTED[score] else -1.0
    vals = [(sign * float(s["scores"][score]), k) for k, s in enumerate(spans)]
    vals = [(v, k) for v, k in vals if v == v and abs(v) != float("inf")]
    return max(vals)[1] if len(spans) > 1 and vals else None


__all__ = ["ANSWER_SCORE", "HIGHER_IS_LESS_TRUSTED", "LOG_SCALE", "RULE", "SPAN_SCORE", "Cell",
           "choose", "least_trusted"]
