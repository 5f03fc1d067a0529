"""Is one predictor of correctness better than another on the same answers? The paired verdict.

One implementation for every place isouq says "ahead of MSP": ``isouq calibrate`` (on a
user's answers), the LM-Polygraph harness and the report.

Two predictors give P(correct) for the same n answers, each cross-fitted R times (R fold seeds:
each answer's value comes from maps that never saw it, and the R repeats differ only in how the
answers were split). Their difference in a metric (:data:`METRICS`: PRR of 1 − P(correct)
against the answers' quality, AUROC of P(correct) for the class quality ≥ a threshold) is
judged by a paired bootstrap over the answers. Each resample draws the answers with replacement
and one of the R fold seeds, so the interval holds both the sampling noise of the answers and
the refit noise of the maps. The point estimate is the mean difference over the R seeds on all
answers. The two-sided p-value counts the resampled differences on either side of 0.

Several comparisons reported together are one family; Holm's step-down correction
(``statsmodels``' ``multipletests(method="holm")``) adjusts their p-values, and the verdict of
each (:data:`VERDICTS`) is read from its adjusted p-value and the sign of its difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from statsmodels.stats.multitest import multipletests

from ..errors import InputError
from .auroc import auroc
from .rejection import prediction_rejection_area

#: the significance level of every verdict, after Holm's correction
ALPHA = 0.05
#: the verdicts of a difference a − b: a ahead of b, within noise, a below b
AHEAD, WITHIN, BELOW = "ahead", "within noise", "below"
VERDICTS: tuple[str, str, str] = (AHEAD, WITHIN, BELOW)
#: the fewest answers of each class (quality ≥ :data:`CLASS_THRESHOLD` and below) a verdict
#: is given on; fewer, and the comparison is reported without one
MIN_PER_CLASS = 30
#: the quality at which a fractional label (ROUGE-L, a judge's probability) counts as correct
CLASS_THRESHOLD = 0.5
#: paired bootstrap resamples of a verdict
N_BOOTSTRAP = 2000


def prr(p_correct: np.ndarray, quality: np.ndarray) -> float:
    """LM-Polygraph's PRR of the uncertainty 1 − P(correct) against the quality (higher is
    better; ``rejection.prediction_rejection_area``). (n,), (n,) -> float."""
    return prediction_rejection_area(1.0 - np.asarray(p_correct, dtype=float), quality)


def auroc_at(p_correct: np.ndarray, quality: np.ndarray,
             threshold: float = CLASS_THRESHOLD) -> float:
    """AUROC of P(correct) for the class quality ≥ ``threshold`` (NaN with one class)."""
    q = np.asarray(quality, dtype=float)
    return auroc(q >= threshold, np.asarray(p_correct, dtype=float))


#: the metrics a verdict may be judged by: name -> f(P(correct) (n,), quality (n,)) -> float
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"PRR": prr, "AUROC": auroc_at}


def class_counts(quality: np.ndarray, threshold: float = CLASS_THRESHOLD) -> tuple[int, int]:
    """(correct, wrong): answers with quality ≥ ``threshold`` and below (NaN left out)."""
    q = np.asarray(quality, dtype=float)
    q = q[~np.isnan(q)]
    right = int((q >= threshold).sum())
    return right, int(q.size - right)


def rankable(quality: np.ndarray, minimum: int = MIN_PER_CLASS,
             threshold: float = CLASS_THRESHOLD) -> bool:
    """Whether the answers hold ≥ ``minimum`` of each class: enough for a verdict."""
    return min(class_counts(quality, threshold)) >= minimum


@dataclass(frozen=True)
class Paired:
    """The difference a − b of one metric on the same answers.

    value_a, value_b: each side's metric (mean over its fold seeds); delta: the mean
    difference; ci_low, ci_high: its percentile interval at ``confidence``; p: two-sided
    bootstrap p-value (unadjusted); n: answers; repeats: fold seeds; n_bootstrap: resamples.
    """

    metric: str
    value_a: float
    value_b: float
    delta: float
    ci_low: float
    ci_high: float
    p: float
    n: int
    repeats: int
    n_bootstrap: int
    confidence: float

    def to_dict(self) -> dict:
        return asdict(self)


def _repeats(x: np.ndarray, n: int, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    x = x[None, :] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[1] != n:
        raise InputError(f"{what} has shape {x.shape}; give (n,) or (repeats, n) values for "
                         f"the {n} answers")
    return x


def paired_difference(a: np.ndarray, b: np.ndarray, quality: np.ndarray, metric: str = "PRR",
                      *, n_bootstrap: int = N_BOOTSTRAP, seed: int = 0,
                      confidence: float = 0.95) -> Paired:
    """The paired bootstrap of metric(a) − metric(b) over the answers and the fold seeds.

    Args:
        a, b: P(correct) of the same answers, (n,) or (repeats, n): one row per fold seed.
            Sides with the same number of repeats are paired by seed (row r of both came from
            the same folds); a side with one row (a fixed score) is paired with every seed.
        quality: (n,) the answers' quality: 0/1, or fractional in [0, 1]; NaN answers are left
            out of both sides.
        metric: a name of :data:`METRICS`.
        n_bootstrap: resamples (each draws the answers with replacement and one fold seed).
        seed: the resamples' seed.
        confidence: of the percentile interval.

    Returns:
        :class:`Paired`.
    """
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    if n_bootstrap < 1 or not 0 < confidence < 1:
        raise InputError(f"n_bootstrap = {n_bootstrap}, confidence = {confidence}: give at "
                         "least one resample and a confidence in (0, 1)")
    q = np.asarray(quality, dtype=float).reshape(-1)
    a, b = _repeats(a, q.size, "a"), _repeats(b, q.size, "b")
    keep = ~np.isnan(q)
    a, b, q = a[:, keep], b[:, keep], q[keep]
    f = METRICS[metric]
    va = np.array([f(r, q) for r in a])
    vb = np.array([f(r, q) for r in b])
    repeats = max(len(a), len(b))
    rng = np.random.default_rng(seed)
    n = q.size
    boot = np.empty(n_bootstrap)
    for i in range(n_bootstrap):
        idx = rng.integers(0, n, n)
        r = int(rng.integers(0, repeats))
        boot[i] = f(a[r % len(a), idx], q[idx]) - f(b[r % len(b), idx], q[idx])
    boot = boot[~np.isnan(boot)]
    tail = (1.0 - confidence) / 2.0
    if boot.size:
        lo, hi = (float(x) for x in np.quantile(boot, [tail, 1.0 - tail]))
        p = min(1.0, 2.0 * (min(int((boot <= 0).sum()), int((boot >= 0).sum())) + 1)
                / (boot.size + 1))
    else:
        lo = hi = p = float("nan")
    return Paired(metric=metric, value_a=float(np.mean(va)), value_b=float(np.mean(vb)),
                  delta=float(np.mean(va) - np.mean(vb)), ci_low=lo, ci_high=hi, p=p, n=int(n),
                  repeats=repeats, n_bootstrap=n_bootstrap, confidence=confidence)


def compare(predictions: Mapping[str, np.ndarray], quality: np.ndarray,
            pairs: Sequence[tuple[str, str]], *, n_bootstrap: int = N_BOOTSTRAP,
            seed: int = 0) -> list[dict]:
    """The paired differences of ``pairs`` (a, b) on the same answers, not yet judged.

    Args:
        predictions: name -> P(correct), (n,) or (repeats, n) (a repeated cross-fit).
        quality: (n,) the labels (0/1 or fractional).
        pairs: (a, b) names of ``predictions``: a judged against b.
        n_bootstrap, seed: the paired bootstrap's.

    Returns:
        One row per pair: predictor, against, PRR and AUROC of a, ``delta`` (Δ PRR, the
        verdict's metric) with ``ci_low``, ``ci_high`` and ``p``, ``delta_auroc`` with its
        interval, ``n``, ``repeats`` and ``rankable`` (:func:`rankable`); :func:`judge` adds
        the verdicts.
    """
    ok = rankable(quality)
    rows = []
    for a, b in pairs:
        d_prr = paired_difference(predictions[a], predictions[b], quality, "PRR",
                                  n_bootstrap=n_bootstrap, seed=seed)
        d_auc = paired_difference(predictions[a], predictions[b], quality, "AUROC",
                                  n_bootstrap=n_bootstrap, seed=seed)
        rows.append({"predictor": a, "against": b, "PRR": d_prr.value_a,
                     "AUROC": d_auc.value_a, "delta": d_prr.delta, "ci_low": d_prr.ci_low,
                     "ci_high": d_prr.ci_high, "p": d_prr.p, "delta_auroc": d_auc.delta,
                     "ci_low_auroc": d_auc.ci_low, "ci_high_auroc": d_auc.ci_high,
                     "n": d_prr.n, "repeats": d_prr.repeats, "rankable": ok})
    return rows


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values of one family; NaN p-values stay NaN and are not counted."""
    p = np.asarray(pvalues, dtype=float).reshape(-1)
    out = np.full(p.size, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def verdict(delta: float, p_adjusted: float, alpha: float = ALPHA) -> str:
    """:data:`AHEAD` or :data:`BELOW` when the adjusted p-value is under ``alpha`` (by the
    sign of the difference), else :data:`WITHIN`."""
    if not np.isfinite(p_adjusted) or p_adjusted >= alpha or delta == 0:
        return WITHIN
    return AHEAD if delta > 0 else BELOW


def judge(rows: Sequence[Mapping], *, alpha: float = ALPHA) -> list[dict]:
    """One family of comparisons judged together: each row (``delta``, ``p``, and
    ``rankable``: False leaves it out of the family, without a verdict) gets ``p_holm``,
    ``verdict`` (:func:`verdict`, None when not rankable) and ``family`` (how many were
    corrected together)."""
    rows = [dict(r) for r in rows]
    judged = [i for i, r in enumerate(rows) if r.get("rankable", True)]
    adjusted = holm([rows[i]["p"] for i in judged])
    for r in rows:
        r.update(p_holm=None, verdict=None, family=len(judged))
    for i, pa in zip(judged, adjusted, strict=True):
        rows[i]["p_holm"] = None if np.isnan(pa) else float(pa)
        rows[i]["verdict"] = verdict(rows[i]["delta"], pa, alpha)
    return rows


def counts(rows: Sequence[Mapping]) -> dict[str, int]:
    """How many judged rows say each verdict: {ahead, within noise, below}."""
    return {v: sum(r.get("verdict") == v for r in rows) for v in VERDICTS}


__all__ = ["AHEAD", "ALPHA", "BELOW", "CLASS_THRESHOLD", "METRICS", "MIN_PER_CLASS",
           "N_BOOTSTRAP", "Paired", "VERDICTS", "WITHIN", "auroc_at", "class_counts", "compare",
           "counts",
           "holm", "judge", "paired_difference", "prr", "rankable", "verdict"]
