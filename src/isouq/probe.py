"""A logistic probe on an answer's hidden state: P(correct) read from the model's internal
representation (SAPLMA, Azaria & Mitchell 2023, trains one on a layer's state; a middle layer
tells most), the way isouq stacks it under a learned head.

The probe: L2-regularised logistic regression on the answer's mean hidden state
(``evaluation.classifier.correctness_model``: standardized, then logistic), at the state (one of
a few layers) and inverse strength C (:data:`PROBE_C`) with the smallest log-loss over seeded
inner folds (:func:`select_probe`). Stacked under a head (``isouq calibrate --features ...
hidden``; ``evaluation.features.feature_sets``), its logit is one more column,
:data:`PROBE_COLUMN`: out of fold on the answers the head is fitted on, from the probe refitted
on all of them for any other answer (:func:`stack_logits`), the way scikit-learn's
``StackingClassifier`` fits. Labels are 0/1 or fractional (``evaluation.fractional``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import DataError, InputError
from .evaluation.classifier import correctness_model
from .evaluation.features import PROBE_COLUMN
from .evaluation.fractional import enough_of_each, fit_labels, soft_log_loss

#: the probe's candidate inverse L2 strengths, chosen by inner cross-validated log-loss
PROBE_C: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: inner folds of the probe's choice of state and C (and of its out-of-fold logits)
INNER_FOLDS = 3


def logit(p: np.ndarray) -> np.ndarray:
    """log(p / (1 − p)), p clipped to [1e-6, 1 − 1e-6]."""
    p = np.clip(np.asarray(p, dtype=float), 1e-6, 1.0 - 1e-6)
    return np.log(p / (1.0 - p))


@dataclass(frozen=True)
class FittedProbe:
    """A fitted probe as numbers (JSON-ready): the state it reads, its C, the standardization
    (mean, scale: (d,)) and the logistic weights (coef: (d,), intercept)."""

    state: str
    C: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    def logit(self, X: np.ndarray) -> np.ndarray:
        """(n,) logit P(correct) of (n, d) states (scikit-learn's ``decision_function``)."""
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(self.coef):
            raise InputError(f"the probe reads {self.state} of width {len(self.coef)}, got "
                             f"states of shape {X.shape}: score the answers with the model the "
                             "calibration was made for")
        return ((X - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(
            self.coef) + self.intercept

    def to_dict(self) -> dict:
        return {"state": self.state, "C": self.C, "mean": list(self.mean),
                "scale": list(self.scale), "coef": list(self.coef),
                "intercept": self.intercept}

    @classmethod
    def from_dict(cls, d: Mapping) -> FittedProbe:
        """The probe of a calibration file; DataError when its parts do not fit together."""
        if not len(d["coef"]) == len(d["mean"]) == len(d["scale"]) > 0:
            raise DataError(f"the probe on {d.get('state')!r} is incomplete; re-create the "
                            "calibration file with isouq calibrate")
        return cls(state=str(d["state"]), C=float(d["C"]), mean=tuple(map(float, d["mean"])),
                   scale=tuple(map(float, d["scale"])), coef=tuple(map(float, d["coef"])),
                   intercept=float(d["intercept"]))


def fit_probe(state: str, X: np.ndarray, y: np.ndarray, C: float) -> FittedProbe:
    """The probe with inverse strength ``C`` fitted on (n, d) states ``X`` and (n,) labels."""
    est = fit_labels(correctness_model(C), np.asarray(X, dtype=float), y)
    scaler, lr = est.named_steps["scale"], est.named_steps["logistic"]
    return FittedProbe(state=state, C=float(C), mean=tuple(map(float, scaler.mean_)),
                       scale=tuple(map(float, scaler.scale_)),
                       coef=tuple(map(float, lr.coef_[0])), intercept=float(lr.intercept_[0]))


def select_probe(states: Mapping[str, np.ndarray], y: np.ndarray, part: np.ndarray
                 ) -> tuple[str, float, np.ndarray]:
    """The state and C with the smallest log-loss over the inner folds ``part``, and their
    out-of-fold P(correct).

    Args:
        states: candidate name (a layer) -> (n, d) states of the answers.
        y: (n,) labels, 0/1 or fractional, none NaN.
        part: (n,) inner fold of each answer.

    Returns:
        (state, C, (n,) out-of-fold P(correct) of that choice).
    """
    loss, oof = {}, {}
    for name, X in states.items():
        for C in PROBE_C:
            p = np.empty(len(y))
            for j in np.unique(part):
                fit_on = part != j
                if not enough_of_each(y[fit_on]):
                    p[part == j] = y[fit_on].mean()
                    continue
                m = fit_labels(correctness_model(C), X[fit_on], y[fit_on])
                p[part == j] = m.predict_proba(X[part == j])[:, 1]
            loss[name, C], oof[name, C] = soft_log_loss(y, p), p
    name, C = min(loss, key=loss.get)
    return name, C, oof[name, C]


def stack_logits(states: Mapping[str, np.ndarray], y: np.ndarray, *, seed: int = 0,
                 rng: np.random.Generator | None = None,
                 inner: int = INNER_FOLDS) -> tuple[np.ndarray, FittedProbe]:
    """The probe's logits for stacking, and the probe refitted on every answer.

    Args:
        states: candidate name -> (n, d) states of the labelled answers.
        y: (n,) their labels (0/1 or fractional).
        seed: the inner folds' seed (ignored with ``rng``).
        rng: draws the inner folds (a caller's stream, for several calls in turn).
        inner: inner folds.

    Returns:
        ((n,) out-of-fold logit of each answer, of the chosen state and C; the probe with that
        choice fitted on all n).
    """
    rng = np.random.default_rng(seed) if rng is None else rng
    states = {k: np.asarray(v, dtype=float) for k, v in states.items()}
    part = rng.permutation(len(y)) % inner
    name, C, p = select_probe(states, y, part)
    return logit(p), fit_probe(name, states[name], y, C)


__all__ = ["INNER_FOLDS", "PROBE_C", "PROBE_COLUMN", "FittedProbe", "fit_probe", "logit",
           "select_probe", "stack_logits"]
