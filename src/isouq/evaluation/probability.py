"""How good is a predicted P(correct)? Reliability bins, ECE, Brier, log-loss, AUROC, AURAC.

* reliability bins: ``n_bins`` equal-width bins of P(correct) on [0, 1], assigned as
  scikit-learn's ``calibration_curve(strategy="uniform")`` does (bin ``b`` holds
  ``edges[b] < p ≤ edges[b+1]``, the first also ``p = 0``); per bin the count, mean P(correct)
  and the share of correct answers;
* ECE (expected calibration error, Naeini et al. 2015; Guo et al. 2017): the count-weighted
  mean over non-empty bins of ``|share correct − mean P(correct)|``;
* Brier score and log-loss (scikit-learn ``brier_score_loss``, ``log_loss``);
* AUROC of P(correct) for correctness (:func:`isouq.evaluation.auroc.auroc`) and Farquhar et
  al.'s AURAC with ``1 − P(correct)`` as the uncertainty (:func:`isouq.evaluation.aurac`).

Labels are 0/1, or fractional: a quality in [0, 1] per answer (a ROUGE-L, a judge's
probability). With fractional labels the bins' "share correct" is their mean quality, Brier
and log-loss are those of the quality (``evaluation.fractional.soft_log_loss``), and AUROC and
AURAC read an answer as correct when its quality is ≥ 0.5.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .auroc import auroc
from .fractional import is_soft, soft_log_loss
from .rejection import aurac
from .rows import to_float


def _check(p_correct, correct) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p_correct, dtype=float).reshape(-1)
    y = np.asarray(correct).reshape(-1)
    if p.size == 0 or p.shape != y.shape:
        raise InputError(f"p_correct {p.shape} and correct {y.shape} must be non-empty and of "
                         "equal length")
    if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
        raise InputError("p_correct must be probabilities in [0, 1] (no NaN)")
    y = y.astype(float)
    if not (np.isfinite(y).all() and (y >= 0).all() and (y <= 1).all()):
        raise InputError("correct must be 0/1, booleans or a quality in [0, 1]")
    return p, (y if is_soft(y) else y.astype(int))


def reliability_bins(p_correct: np.ndarray, correct: np.ndarray,
                     n_bins: int = 10) -> list[dict]:
    """One dict per non-empty bin: lo, hi (edges), n, mean_p, accuracy.

    p_correct: (n,) in [0, 1]; correct: (n,) 0/1.
    """
    p, y = _check(p_correct, correct)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    ids = np.searchsorted(edges[1:-1], p)  # as sklearn.calibration.calibration_curve
    out = []
    for b in range(n_bins):
        m = ids == b
        if m.any():
            out.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "n": int(m.sum()),
                        "mean_p": float(p[m].mean()), "accuracy": float(y[m].mean())})
    return out


def ece(p_correct: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error over ``n_bins`` equal-width bins (see the module docstring).

    p_correct: (n,) in [0, 1]; correct: (n,) 0/1 -> float in [0, 1].
    """
    bins = reliability_bins(p_correct, correct, n_bins)
    n = sum(b["n"] for b in bins)
    return float(sum(b["n"] * abs(b["accuracy"] - b["mean_p"]) for b in bins) / n)


def probability_metrics(p_correct: np.ndarray, correct: np.ndarray,
                        n_bins: int = 10) -> dict[str, float | int | None]:
    """n, accuracy, mean P(correct), ECE, Brier, log-loss, AUROC, AURAC of one predictor.

    p_correct: (n,) in [0, 1]; correct: (n,) 0/1 or fractional (see the module docstring).
    AUROC is None with one class only.
    """
    from sklearn.metrics import brier_score_loss, log_loss

    p, y = _check(p_correct, correct)
    soft = is_soft(y)
    right = (y >= 0.5).astype(int)
    return {
        "n": int(p.size), "accuracy": float(y.mean()), "mean_p": float(p.mean()),
        "ece": ece(p, y, n_bins),
        "brier": float(np.mean((p - y) ** 2)) if soft
        else float(brier_score_loss(y, p, labels=[0, 1])),
        "log_loss": soft_log_loss(y, p) if soft else float(log_loss(y, p, labels=[0, 1])),
        "auroc": to_float(auroc(right, p)), "aurac": float(aurac(1.0 - p, right)),
    }
