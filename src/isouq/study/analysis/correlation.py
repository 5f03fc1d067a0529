"""Do two scores rank the answers alike? Spearman ρ with n and p (``scipy.stats.spearmanr``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from scipy.stats import spearmanr

from ...evaluation.rows import datasets, group_rows, models_of, to_float


def spearman(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Spearman ρ of x and y, both (n,); pairs with a NaN/inf are dropped.

    Returns {"n": pairs used, "rho", "p" (two-sided)}; ρ and p are NaN with fewer than 3 pairs
    or a constant input.
    """
    x = np.asarray(x, dtype=float).reshape(-1)
    y = np.asarray(y, dtype=float).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"n": int(x.size), "rho": float("nan"), "p": float("nan")}
    res = spearmanr(x, y)
    return {"n": int(x.size), "rho": float(res.statistic), "p": float(res.pvalue)}


def correlation_table(
    rows: Iterable[Mapping], x: str = "epistemic", y: str = "p_true"
) -> list[dict]:
    """Row-level wrapper: Spearman ρ between scores ``x`` and ``y`` on the raw per-answer values,
    one row per (model, dataset) and one "Pooled" row per dataset (all models' rows together).

    Columns: model, dataset, n, rho, p. Judged rows only (``correct`` not null).
    """
    groups = group_rows(rows)
    table = []
    for ds in datasets(groups):
        xs, ys = [], []
        for model in models_of(groups, ds):
            g = groups[(ds, model)]
            xs.append(g.score(x))
            ys.append(g.score(y))
            r = spearman(xs[-1], ys[-1])
            table.append({"model": model, "dataset": ds, "n": r["n"],
                          "rho": to_float(r["rho"]), "p": to_float(r["p"])})
        r = spearman(np.concatenate(xs), np.concatenate(ys))
        table.append({"model": "Pooled", "dataset": ds, "n": r["n"],
                      "rho": to_float(r["rho"]), "p": to_float(r["p"])})
    return table
