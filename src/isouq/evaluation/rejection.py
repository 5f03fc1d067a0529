"""Rejection metrics: how much the answers you keep improve as you reject the most uncertain.

Two definitions from the literature, re-implemented here:

* **PRR**, the prediction-rejection ratio as LM-Polygraph defines it. Sort rows by uncertainty
  (least uncertain first); the *rejection curve* at rejection rate ``r = 1 - k/n`` is the mean
  quality of the ``k`` least-uncertain rows, for ``k = n, n-1, ..., 1``; its area is the mean of
  those ``n`` points (a left Riemann sum over ``r`` in ``[0, 1)``, step ``1/n``). Then
  ``PRR = (AUC_unc - AUC_rnd) / (AUC_oracle - AUC_rnd)``, where the oracle sorts by the
  quality itself (``uncertainty = -quality``) and the random baseline is the expected area
  under a uniformly random order, which equals ``mean(quality)`` exactly (LM-Polygraph
  estimates it from 1,000 random permutations). PRR is 1 for a perfect ranking, about 0 for a
  random one and negative for an inverted one. Ties in the uncertainty are resolved in
  expectation over random tie-breaking (tied rows share their mean quality), so a constant
  score gets PRR 0 exactly.
* **AURAC**, the area under the rejection-accuracy curve of Farquhar et al. (2024), as in their
  ``semantic_uncertainty`` code: for each retained fraction ``q`` on
  ``linspace(0.1, 1, 20)``, keep the rows whose uncertainty is ``<= np.quantile(u, q)`` and take
  their accuracy; the area is ``sum(accuracies) * (q[1] - q[0])``. Note this convention: a
  curve that is 1 everywhere has area ``20 * 0.9 / 19 = 0.947``, not 1; keep it to compare
  with published numbers.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

FARQUHAR_QUANTILES: np.ndarray = np.linspace(0.1, 1.0, 20)


def _check_pair(uncertainty: np.ndarray, quality: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(uncertainty, dtype=float).reshape(-1)
    q = np.asarray(quality, dtype=float).reshape(-1)
    if u.shape != q.shape or u.size == 0:
        raise InputError(
            f"uncertainty {u.shape} and quality {q.shape} must be non-empty and of the same "
            "length; pass one value of each per answer"
        )
    if not (np.isfinite(u).all() and np.isfinite(q).all()):
        raise InputError("uncertainty/quality contain NaN or inf; drop those rows first")
    return u, q


def rejection_curve(uncertainty: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Mean quality of the ``k`` least-uncertain rows, for ``k = 1..n``.

    uncertainty, quality: (n,) -> (n,), entry ``k-1`` for ``k`` kept rows (rejection rate
    ``1 - k/n``). Ties in ``uncertainty`` are averaged (expectation over random tie-breaking).
    """
    u, q = _check_pair(uncertainty, quality)
    order = np.argsort(u, kind="stable")
    u_s, q_s = u[order], q[order]
    # replace each run of tied uncertainties by its mean quality
    starts = np.flatnonzero(np.r_[True, u_s[1:] != u_s[:-1]])
    sums = np.add.reduceat(q_s, starts)
    counts = np.diff(np.r_[starts, u_s.size])
    q_s = np.repeat(sums / counts, counts)
    return np.cumsum(q_s) / np.arange(1, u_s.size + 1)


def rejection_area(uncertainty: np.ndarray, quality: np.ndarray) -> float:
    """Area under the rejection curve: mean of :func:`rejection_curve`. (n,), (n,) -> float."""
    return float(np.mean(rejection_curve(uncertainty, quality)))


def prr(uncertainty: np.ndarray, quality: np.ndarray) -> float:
    """Prediction-rejection ratio ``(AUC_unc - AUC_rnd) / (AUC_oracle - AUC_rnd)``.

    uncertainty: (n,), higher = less trustworthy; quality: (n,), higher = better (0/1
    correctness here). NaN when all qualities are equal (oracle = random).
    """
    u, q = _check_pair(uncertainty, quality)
    auc_rnd = float(np.mean(q))
    auc_orc = rejection_area(-q, q)
    if np.isclose(auc_orc, auc_rnd):
        return float("nan")
    return (rejection_area(u, q) - auc_rnd) / (auc_orc - auc_rnd)


def aurac(
    uncertainty: np.ndarray,
    correct: np.ndarray,
    quantiles: np.ndarray = FARQUHAR_QUANTILES,
) -> float:
    """Farquhar et al.'s area under the rejection-accuracy curve.

    uncertainty: (n,); correct: (n,) 0/1 (or any accuracy in [0, 1]); quantiles: (m,)
    increasing retained fractions with equal spacing. Returns ``sum_j acc(q_j) * (q_1 - q_0)``
    where ``acc(q)`` is the mean of ``correct`` over rows with ``u <= np.quantile(u, q)``.
    """
    u, c = _check_pair(uncertainty, correct)
    qs = np.asarray(quantiles, dtype=float)
    if qs.ndim != 1 or qs.size < 2:
        raise InputError("quantiles must be a 1-D grid of at least two retained fractions")
    cutoffs = np.quantile(u, qs)
    accs = np.array([c[u <= t].mean() for t in cutoffs])
    return float(accs.sum() * (qs[1] - qs[0]))


def _normalize(target: np.ndarray) -> np.ndarray:
    lo, hi = np.min(target), np.max(target)
    if np.isclose(lo, hi):
        lo, hi = lo - 1, hi + 1
    return (target - lo) / (hi - lo)


def prediction_rejection_area(ue, target, max_rejection: float = 1.0) -> float:
    """LM-Polygraph's PRR: the area under the prediction-rejection curve, exactly as
    LM-Polygraph 0.7's ``PredictionRejectionArea`` after ``UEManager``'s NaN handling
    (uncertainties clipped, questions without a quality value dropped): higher uncertainty
    rejected first; quality min-max normalized. Tied uncertainties keep the input order (a
    stable sort: LM-Polygraph's default sort orders ties differently on different CPUs).
    (n,) uncertainty, (n,) quality -> float."""
    ue = np.nan_to_num(np.asarray(ue, dtype=float), nan=-1e7, neginf=-1e7, posinf=1e7)
    target = np.asarray(target, dtype=float)
    keep = ~np.isnan(target)
    ue, target = ue[keep], _normalize(target[keep])
    n = len(ue)
    k = int(max_rejection * n)
    if k == 0:
        return float("nan")
    sorted_t = target[np.argsort(ue, kind="stable")]  # ties in input order, on every CPU
    cumsum = np.cumsum(sorted_t)[-k:]
    scores = (cumsum / np.arange(n - k + 1, n + 1))[::-1]
    return float(np.sum(scores) / k)
