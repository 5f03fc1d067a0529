"""The LM-Polygraph side of isouq's plugin: a stat calculator and the estimators, plain
subclasses of LM-Polygraph's ``StatCalculator`` and ``Estimator`` (``isouq.integrations.polygraph``
imports this module on first use; it needs ``isouq[polygraph]``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import InputError, require
from .polygraph_stats import (
    BLOCK_STATS,
    CALCULATOR,
    EXTRA,
    HIDDEN_STATS,
    METHOD_STAT,
    STATS,
    WHAT,
    polygraph_stats,
    stats_rows,
)

require("lm_polygraph", extra=EXTRA, what=WHAT)

from lm_polygraph.estimators.estimator import Estimator  # noqa: E402
from lm_polygraph.stat_calculators.stat_calculator import StatCalculator  # noqa: E402


class IsouqScoresCalculator(StatCalculator):
    """isouq's scores of the greedy generations: every answer of the batch from one backward
    pass (``batch_size``: answers per backward; default the whole batch); with ``blocks``,
    also each answer's block profile (``isouq_blocks``, ``isouq_block_names``); with ``hidden``,
    each answer's mean hidden states (``isouq_hidden``, from the same forward)."""

    @staticmethod
    def meta_info():
        return [*STATS, *BLOCK_STATS, *HIDDEN_STATS, METHOD_STAT], ["greedy_tokens"]

    def __init__(self, batch_size: int | None = None, blocks: bool = False,
                 hidden: bool = False, method: str = "ghost"):
        super().__init__()
        if method not in ("ghost", "forward"):
            raise InputError(f"IsouqScoresCalculator method={method!r}: use 'ghost' or "
                             "'forward' (no backward: for a calibration that reads no gradient)")
        self.batch_size, self.blocks, self.hidden = batch_size, bool(blocks), bool(hidden)
        self.method = method

    def __call__(self, dependencies, texts, model, max_new_tokens: int = 100, **kwargs):
        return polygraph_stats(model, texts, dependencies["greedy_tokens"], self.batch_size,
                               blocks=self.blocks, hidden=self.hidden, method=self.method)

    def __repr__(self):
        return CALCULATOR


class IsouqEstimator(Estimator):
    """Base of isouq's estimators (use a subclass: :class:`IsouqEpistemic`, …). ``calculator``:
    read the scores from IsouqScoresCalculator's stats (it must be registered, as in a
    polygraph_eval config); False (default): compute them on the first call of a batch from the
    batch's model, inputs and greedy tokens, and leave them in its stats for the other isouq
    estimators."""

    #: the score key (``isouq.SequenceScores.KEYS``) the estimator gives; set by each subclass
    score = ""
    #: whether it needs the block profiles in the batch's stats
    needs_blocks = False
    #: whether it needs the answers' hidden states in the batch's stats
    needs_hidden = False
    #: whether its score needs the backward pass (a gradient score)
    needs_backward = True

    def __init__(self, calculator: bool = False, batch_size: int | None = None):
        if not self.score:
            raise TypeError(f"{type(self).__name__} is the base of isouq's estimators; use one "
                            "of them: IsouqEpistemic, IsouqEpistemicLog, IsouqAleatoric, "
                            "IsouqNormalizedEpistemic, IsouqPCorrect")
        reads = ([f"isouq_{self.score}"] if self.score != "p_correct" else
                 ["isouq_epistemic" if self.needs_backward else "isouq_mean_prob"])
        reads += ["isouq_blocks"] if self.needs_blocks else []
        reads += ["isouq_hidden"] if self.needs_hidden else []
        deps = reads if calculator else ["greedy_tokens"]
        super().__init__(deps, "sequence")
        self.calculator, self.batch_size = bool(calculator), batch_size

    def __str__(self):
        return type(self).__name__

    def _stats(self, stats: Mapping) -> Mapping:
        """The batch's stats with isouq's in them (computed once per batch when missing)."""
        backward = self.needs_backward or self.needs_blocks
        missing = ("isouq_mean_prob" not in stats
                   or (backward and stats.get(METHOD_STAT) == "forward")
                   or (self.needs_blocks and "isouq_blocks" not in stats)
                   or (self.needs_hidden and "isouq_hidden" not in stats))
        if missing:
            for k in ("model", "input_texts", "greedy_tokens"):
                if k not in stats:
                    raise InputError(f"{self}: the batch's stats have no {k!r}; run it "
                                     "through LM-Polygraph's UEManager")
            stats.update(polygraph_stats(stats["model"], stats["input_texts"],
                                         stats["greedy_tokens"], self.batch_size,
                                         blocks=self.needs_blocks, hidden=self.needs_hidden,
                                         method="ghost" if backward else "forward"))
        return stats

    def __call__(self, stats: Mapping) -> np.ndarray:
        return np.asarray(self._stats(stats)[f"isouq_{self.score}"], dtype=float)


class IsouqEpistemic(IsouqEstimator):
    """isouq's epistemic score of the greedy answer: ‖∇θ p̄‖²."""

    score = "epistemic"


class IsouqEpistemicLog(IsouqEstimator):
    """isouq's epistemic_log score of the greedy answer: ‖∇θ log p̄‖²."""

    score = "epistemic_log"


class IsouqAleatoric(IsouqEstimator):
    """isouq's aleatoric score of the greedy answer: (1/T) Σₜ pₜ(1 − pₜ) (the forward pass
    alone gives it)."""

    score = "aleatoric"
    needs_backward = False


class IsouqNormalizedEpistemic(IsouqEstimator):
    """isouq's normalized_epistemic score of the greedy answer: ‖∇θ p̄‖² / ‖θ*‖²."""

    score = "normalized_epistemic"


class IsouqPCorrect(IsouqEstimator):
    """1 − P(correct) of the greedy answer, P(correct) from a calibration of ``isouq calibrate``
    for this model (``calibration``: its file; a map on the block profile makes the stats carry
    the profiles, one with a hidden-state probe the hidden states; one that reads no gradient
    score is computed without a backward pass)."""

    score = "p_correct"

    def __init__(self, calibration: str, calculator: bool = False,
                 batch_size: int | None = None):
        from ..calibration import Calibrator

        self.calibration = Calibrator.load(calibration)
        self.needs_blocks = self.calibration.needs_blocks
        self.needs_hidden = self.calibration.needs_hidden
        self.needs_backward = self.calibration.needs_backward
        super().__init__(calculator=calculator, batch_size=batch_size)

    def __str__(self):
        return f"IsouqPCorrect ({self.calibration.map.kind} on {self.calibration.map.name})"

    def __call__(self, stats: Mapping) -> np.ndarray:
        stats = self._stats(stats)
        if self.needs_blocks and "isouq_blocks" not in stats:
            raise InputError(f"{self} reads the block profile; register IsouqScoresCalculator "
                             "with cfg {blocks: true}, or use calculator: false")
        if self.needs_hidden and "isouq_hidden" not in stats:
            raise InputError(f"{self} reads the hidden states; register IsouqScoresCalculator "
                             "with cfg {hidden: true}, or use calculator: false")
        n = len(stats["isouq_mean_prob"])
        return 1.0 - self.calibration.predict(stats_rows(stats, n))


__all__ = ["IsouqAleatoric", "IsouqEpistemic", "IsouqEpistemicLog", "IsouqEstimator",
           "IsouqNormalizedEpistemic", "IsouqPCorrect", "IsouqScoresCalculator"]
