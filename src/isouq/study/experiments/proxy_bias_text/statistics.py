"""Correlations, per-domain ratios, CV and row normalization of the epistemic scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from ....data.newsgroups import GROUPS


def correlations(u: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Spearman ρ and Pearson r of u (n,) against ref (n,)."""
    return {"spearman": float(stats.spearmanr(u, ref).statistic),
            "pearson": float(stats.pearsonr(u, ref).statistic)}


def domain_ratios(u: np.ndarray, ref: np.ndarray, domains: np.ndarray,
                  names: Sequence[str] = GROUPS) -> dict[str, float]:
    """mean over domain D of u / mean over D of ref, for each D in ``names`` (unnormalized)."""
    return {d: float(u[domains == d].mean() / ref[domains == d].mean()) for d in names}


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation SD/mean, population SD (ddof 0) — the paper's convention."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.std(ddof=0) / v.mean())


def row_normalize(ratios: dict[str, float]) -> dict[str, float]:
    """Divide each ratio by the row mean (1.0 everywhere = a pure global scale factor)."""
    m = float(np.mean(list(ratios.values())))
    return {k: v / m for k, v in ratios.items()}
