"""Fitting a probability to labels that are 0/1 or fractional (a quality in [0, 1] such as
ROUGE-L): fractional labels as weighted 0/1 rows, their log-loss, and the fewest answers of a
class a fit needs. Shared by the calibration maps (``isouq.calibration``) and the hidden-state
probe (``isouq.probe``)."""

from __future__ import annotations

import numpy as np

#: the fewest answers of each class (a fractional label counts as its share) a map is fitted on
MIN_PER_CLASS = 5


def enough_of_each(y: np.ndarray) -> bool:
    """Whether labels ``y`` hold ≥ :data:`MIN_PER_CLASS` answers right and wrong (a fractional
    label counts as its share): enough of both sides to fit."""
    return min(float(y.sum()), float(y.size - y.sum())) >= MIN_PER_CLASS


def is_soft(y: np.ndarray) -> bool:
    """Whether the labels are fractional (a quality in [0, 1] such as ROUGE-L) rather than 0/1."""
    y = np.asarray(y, dtype=float)
    return bool(((y > 0) & (y < 1)).any())


def soft_rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fractional labels q as weighted 0/1 rows: each row twice, labelled 1 with weight q and 0
    with weight 1 − q (rows of weight 0 dropped); a logistic model fitted on them by weighted
    log-loss estimates E[q | x] (the fractional logit)."""
    y = np.asarray(y, dtype=float)
    X2 = np.concatenate([X, X])
    y2 = np.r_[np.ones(len(y)), np.zeros(len(y))]
    w = np.r_[y, 1.0 - y]
    keep = w > 0
    return X2[keep], y2[keep].astype(int), w[keep]


def soft_log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean −[q log p + (1 − q) log(1 − p)] over rows (the log-loss of fractional labels; equal
    to scikit-learn's log_loss for 0/1 labels)."""
    p = np.clip(np.asarray(p, dtype=float), 1e-15, 1 - 1e-15)
    y = np.asarray(y, dtype=float)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def fit_labels(est, X: np.ndarray, y: np.ndarray):
    """``est.fit`` (a scikit-learn pipeline) on 0/1 labels, or on fractional ones through
    :func:`soft_rows` (weights to the pipeline's last step); returns ``est``."""
    if not is_soft(y):
        return est.fit(X, y)
    X2, y2, w = soft_rows(X, y)
    return est.fit(X2, y2, **{f"{est.steps[-1][0]}__sample_weight": w})


__all__ = ["MIN_PER_CLASS", "enough_of_each", "fit_labels", "is_soft", "soft_log_loss", "soft_rows"]
