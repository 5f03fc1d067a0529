"""Withhold answers at a chosen error rate, with a finite-sample guarantee (Learn then Test).

An answer is kept when its P(correct) is at least a threshold λ. The risk of λ is the error rate
among the answers it keeps, ``R(λ) = P(wrong | P(correct) ≥ λ)`` over the population the
calibration rows are drawn from. Given ``n`` labelled calibration rows drawn i.i.d. from that
population (and not used to fit the map that gives P(correct)), choose λ̂ so that

    P( R(λ̂) ≤ α ) ≥ 1 − δ        (over the draw of the calibration rows).

Method: Learn then Test (Angelopoulos, Bates, Candès, Jordan and Lei, 2021, "Learn then Test:
Calibrating Predictive Algorithms to Achieve Risk Control", arXiv:2110.01052), with the
selective-classification p-value of Angelopoulos and Bates, "A Gentle Introduction to
Conformal Prediction and Distribution-Free Uncertainty Quantification" (2021, arXiv:2107.07511):

* for each threshold λⱼ of a grid fixed before the calibration labels are seen, test the null
  ``Hⱼ: R(λⱼ) > α``. Given the number ``nⱼ`` of calibration rows it keeps, their errors ``eⱼ``
  are Binomial(nⱼ, R(λⱼ)), so ``pⱼ = P(Binomial(nⱼ, α) ≤ eⱼ)`` (``scipy.stats.binom.cdf``) is a
  valid p-value (``pⱼ = 1`` when it keeps none);
* fixed-sequence testing from the highest threshold down: reject ``H₁, H₂, …`` while
  ``pⱼ ≤ δ``, stop at the first that is not rejected; λ̂ is the lowest threshold rejected. This
  controls the family-wise error rate at δ, so ``R(λ̂) > α`` (a true null rejected) has
  probability at most δ. When even the first null stands, no threshold is certified: every
  answer is withheld (λ̂ = +∞, coverage 0).

The guarantee is marginal over calibration sets and conditional on the fitted map; it assumes
the answers to come are exchangeable with the calibration rows (same model, same kind of
questions, same labelling).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import beta, binom

from ..errors import InputError


@dataclass(frozen=True)
class RiskControl:
    """The threshold Learn then Test chose and what it keeps on the calibration rows.

    threshold: λ̂ on P(correct) (keep an answer when P(correct) ≥ λ̂); ``math.inf`` when no
    threshold is certified (withhold everything). alpha, delta: the target. n: calibration rows.
    kept: rows with P(correct) ≥ λ̂; coverage = kept / n; errors: wrong answers among them;
    error_rate = errors / kept (NaN when none kept); risk_upper: the one-sided (1 − δ)
    Clopper–Pearson upper bound on the error rate among kept (1 when none kept); p_value: the
    binomial p-value at λ̂ (1 when none certified); tested: thresholds tested before stopping.
    """

    threshold: float
    alpha: float
    delta: float
    n: int
    kept: int
    coverage: float
    errors: int
    error_rate: float
    risk_upper: float
    p_value: float
    tested: int

    @property
    def certified(self) -> bool:
        """Whether some threshold was certified (else every answer is withheld)."""
        return math.isfinite(self.threshold)

    def to_dict(self) -> dict:
        """JSON-ready: an uncertified threshold is None."""
        d = asdict(self)
        d["threshold"] = self.threshold if self.certified else None
        d["error_rate"] = self.error_rate if math.isfinite(self.error_rate) else None
        return d


def check_target(alpha: float, delta: float) -> None:
    """InputError unless 0 < α < 1 and 0 < δ < 1."""
    for name, v in (("max risk α", alpha), ("δ", delta)):
        if not (isinstance(v, (int, float)) and 0 < v < 1):
            raise InputError(f"{name} = {v!r}: give a number strictly between 0 and 1 "
                             "(e.g. --max-risk 0.3 --delta 0.1)")


def binomial_p_values(errors: np.ndarray, kept: np.ndarray, alpha: float) -> np.ndarray:
    """p-values of ``H: error rate among kept > α``: ``P(Binomial(kept, α) ≤ errors)``.

    errors, kept: (m,) integer counts per threshold -> (m,), 1 where ``kept == 0``.
    """
    e = np.asarray(errors, dtype=int)
    k = np.asarray(kept, dtype=int)
    return np.where(k > 0, binom.cdf(e, np.maximum(k, 1), alpha), 1.0)


def fixed_sequence(p_values: np.ndarray, delta: float) -> int:
    """How many leading hypotheses fixed-sequence testing rejects at level δ: the length of the
    run of ``p ≤ δ`` at the start of (m,) ``p_values`` (tested in order)."""
    ok = np.asarray(p_values, dtype=float) <= delta
    return int(ok.size if ok.all() else np.argmin(ok))


def kept_counts(p_correct: np.ndarray, correct: np.ndarray,
                thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, errors), each (m,): rows with ``p_correct ≥ λⱼ`` and the wrong ones among them.

    p_correct, correct: (n,); thresholds: (m,).
    """
    p = np.asarray(p_correct, dtype=float)
    wrong = 1 - np.asarray(correct, dtype=int)
    order = np.argsort(-p, kind="stable")
    p_desc = p[order]
    cum_wrong = np.r_[0, np.cumsum(wrong[order])]
    kept = np.searchsorted(-p_desc, -np.asarray(thresholds, dtype=float), side="right")
    return kept, cum_wrong[kept]


def _check(p_correct, correct, thresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(p_correct, dtype=float).reshape(-1)
    y = np.asarray(correct).reshape(-1)
    lam = np.asarray(thresholds, dtype=float).reshape(-1)
    if p.size == 0 or p.shape != y.shape:
        raise InputError(f"p_correct {p.shape} and correct {y.shape} must be non-empty and of "
                         "equal length: one of each per calibration row")
    if not np.isfinite(p).all():
        raise InputError("p_correct holds NaN or inf; drop those rows first")
    if not np.isin(y, (0, 1)).all():
        raise InputError("correct must be 0/1 (or booleans), one per calibration row")
    if lam.size == 0 or not np.isfinite(lam).all() or (np.diff(lam) >= 0).any():
        raise InputError("thresholds must be finite and strictly decreasing (tested from the "
                         "highest down)")
    return p, y.astype(int), lam


def learn_then_test(
    p_correct: np.ndarray, correct: np.ndarray, thresholds: np.ndarray, *,
    alpha: float, delta: float,
) -> RiskControl:
    """Learn then Test with fixed-sequence testing (see the module docstring).

    Args:
        p_correct: (n,) P(correct) of the calibration rows, from a map not fitted on them.
        correct: (n,) 0/1 labels of those rows.
        thresholds: (m,) strictly decreasing grid on P(correct), fixed without the labels.
        alpha: the largest acceptable error rate among kept answers, in (0, 1).
        delta: the allowed probability that the chosen threshold misses α, in (0, 1).

    Returns:
        :class:`RiskControl`: λ̂ (``inf`` when none is certified) and what it keeps here.
    """
    check_target(alpha, delta)
    p, y, lam = _check(p_correct, correct, thresholds)
    kept, errors = kept_counts(p, y, lam)
    pv = binomial_p_values(errors, kept, alpha)
    j = fixed_sequence(pv, delta)
    if j == 0:
        return RiskControl(threshold=math.inf, alpha=alpha, delta=delta, n=int(p.size), kept=0,
                           coverage=0.0, errors=0, error_rate=math.nan, risk_upper=1.0,
                           p_value=float(pv[0]), tested=1)
    k, e = int(kept[j - 1]), int(errors[j - 1])
    return RiskControl(
        threshold=float(lam[j - 1]), alpha=alpha, delta=delta, n=int(p.size), kept=k,
        coverage=k / p.size, errors=e, error_rate=e / k if k else math.nan,
        risk_upper=clopper_pearson_upper(e, k, delta), p_value=float(pv[j - 1]),
        tested=min(j + 1, lam.size))


def clopper_pearson_upper(errors: int, n: int, delta: float) -> float:
    """One-sided (1 − δ) Clopper–Pearson upper bound on a rate from ``errors`` of ``n``
    (``scipy.stats.beta.ppf(1 − δ, e + 1, n − e)``; 1 when ``e == n`` or ``n == 0``)."""
    if n == 0 or errors >= n:
        return 1.0
    return float(beta.ppf(1 - delta, errors + 1, n - errors))


def min_kept(alpha: float, delta: float) -> int:
    """The fewest kept rows that can certify α at level δ: with no error among ``m`` kept the
    p-value is (1 − α)^m, ≤ δ from ``m = ⌈log δ / log(1 − α)⌉`` on."""
    check_target(alpha, delta)
    return math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-12)


def threshold_grid(p_fit: np.ndarray, n_test: int, *, alpha: float, delta: float,
                   max_points: int = 100) -> np.ndarray:
    """A decreasing grid of thresholds for :func:`learn_then_test`, fixed without the labels
    of the calibration rows, from ``p_fit``: P(correct) of rows independent of them (those the
    map was fitted on).

    Candidates are the quantiles of ``p_fit`` at retained fractions from the smallest that
    keeps :func:`min_kept` of ``n_test`` rows up to 1, then 0 (keep everything). Fixed-sequence
    testing stops at the first threshold it cannot certify, so the grid starts where the test
    is most likely to certify: at the candidate of highest predicted power, taking the map's
    own P(correct) at face value (error rate among kept = mean of 1 − p over the ``p_fit`` it
    keeps, kept count scaled to ``n_test`` rows; power = the binomial probability of at most
    the most errors that still certify α); higher thresholds are left out. This uses
    no calibration label, so the guarantee of :func:`learn_then_test` holds for any ``p_fit``;
    a poorly calibrated ``p_fit`` only costs power.

    Args:
        p_fit: (n_fit,) P(correct) values.
        n_test: number of calibration rows the grid will be tested on.
        alpha, delta: the target.
        max_points: at most this many candidate thresholds.

    Returns:
        (m,) strictly decreasing thresholds in [0, 1].
    """
    p = np.asarray(p_fit, dtype=float).reshape(-1)
    if p.size == 0 or not np.isfinite(p).all():
        raise InputError("p_fit must be a non-empty array of finite P(correct) values")
    if n_test < 1:
        raise InputError(f"n_test = {n_test}: need at least one calibration row")
    start = min(1.0, min_kept(alpha, delta) / n_test)
    levels = np.linspace(start, 1.0, max(2, max_points - 1))
    lam = np.r_[np.quantile(p, 1.0 - levels, method="lower"), 0.0]
    lam = np.unique(np.clip(lam, 0.0, 1.0))[::-1]
    kept = kept_counts(p, np.ones(p.size, dtype=int), lam)[0]
    expected_wrong = np.r_[0.0, np.cumsum(1.0 - np.sort(p)[::-1])][kept]  # Σ (1 − p) over kept
    m = np.rint(kept / p.size * n_test).astype(int)
    risk = np.where(kept > 0, expected_wrong / np.maximum(kept, 1), 1.0)
    k = binom.ppf(delta, m, alpha)  # the most errors among m kept that still certify α
    e_max = np.where(binom.cdf(k, m, alpha) <= delta, k, k - 1)
    power = np.where((m > 0) & (e_max >= 0), binom.cdf(e_max, m, risk), 0.0)
    return lam[int(np.argmax(power)):]
