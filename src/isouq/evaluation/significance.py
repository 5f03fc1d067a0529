"""Is a gradient method's AUROC different from a baseline's? Paired tests over random splits.

Protocol: for each (dataset, model), ``n_splits`` random stratified train/test splits (80/20 by
default; the same splits for every method of that model, drawn from ``seed``, the dataset and
the model). Each method's logistic regression is fitted on the train rows and its AUROC taken on
the test rows (rows lacking the method's features left out). Per dataset and split the AUROC is
averaged over models, so the splits are the paired observations of a paired t-test
(``scipy.stats.ttest_rel``) for each gradient method vs each baseline; the p-values of all
tests (every dataset) are corrected together with Benjamini-Hochberg
(``statsmodels.stats.multitest.multipletests(method="fdr_bh")``). Arrows: ``↑`` the gradient
method has the higher mean AUROC, ``↓`` the lower.

The lift of one method over another (Epi. & Alea. vs Alea.) is tested with a paired bootstrap
over the (model, split) cells: the per-cell AUROC differences are resampled with replacement.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
from scipy.stats import ttest_rel
from statsmodels.stats.multitest import multipletests

from ..errors import InputError
from .auroc import Split, evaluate_splits
from .classifier import complete_rows
from .rows import (
    BASELINES,
    GRADIENT_METHODS,
    LOG_FEATURES,
    METHODS,
    QAGroup,
    check_classes,
    feature_matrix,
    group_rng,
    group_rows,
    to_float,
)


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence RuntimeWarnings (empty-slice means, zero-variance t-tests) inside a block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def random_splits(
    correct: np.ndarray, n_splits: int, rng: np.random.Generator, test_size: float = 0.2
) -> list[Split]:
    """``n_splits`` stratified (train, test) index pairs over ``n = len(correct)`` rows.

    Each class contributes ``round(test_size * n_class)`` rows to test (at least 1, at most
    ``n_class - 1``), so both sides hold both classes when each class has 2+ rows.
    """
    if not 0.0 < test_size < 1.0:
        raise InputError(f"test_size must be in (0, 1), got {test_size}")
    y = np.asarray(correct).astype(int)
    out: list[Split] = []
    for _ in range(n_splits):
        test_parts = []
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            k = min(max(int(round(test_size * idx.size)), 1), max(idx.size - 1, 1))
            test_parts.append(idx[:k])
        test = np.sort(np.concatenate(test_parts))
        train = np.setdiff1d(np.arange(y.size), test)
        out.append((train, test))
    return out


def split_aurocs(
    groups: Mapping[tuple[str, str], QAGroup],
    *,
    n_splits: int = 10,
    seed: int = 0,
    test_size: float = 0.2,
    log_epistemic: bool = True,
    methods: Mapping[str, Sequence[str]] = METHODS,
) -> dict[tuple[str, str, str], np.ndarray]:
    """Held-out AUROC per split: (dataset, model, method) -> (n_splits,). Methods without usable
    rows in a group are left out."""
    log = LOG_FEATURES if log_epistemic else ()
    out: dict[tuple[str, str, str], np.ndarray] = {}
    for (ds, model), g in groups.items():
        splits = random_splits(g.correct, n_splits, group_rng(seed, "splits", ds, model), test_size)
        for name, feats in methods.items():
            X = feature_matrix(g, feats, log)
            if complete_rows(X).any():
                out[(ds, model, name)] = evaluate_splits(X, g.correct, splits)["auroc"]
    return out


def _cells(
    split_auc: Mapping[tuple[str, str, str], np.ndarray], dataset: str, method: str
) -> dict[str, np.ndarray]:
    return {m: v for (d, m, mth), v in split_auc.items() if d == dataset and mth == method}


def mean_over_models(
    split_auc: Mapping[tuple[str, str, str], np.ndarray], dataset: str, method: str,
    models: Collection[str] | None = None,
) -> np.ndarray | None:
    """(n_splits,) AUROC of ``method`` on ``dataset`` averaged over models (all, or those in
    ``models``; NaN-aware)."""
    cells = {m: v for m, v in _cells(split_auc, dataset, method).items()
             if models is None or m in models}
    if not cells:
        return None
    with _quiet():
        return np.nanmean(np.stack(list(cells.values())), axis=0)


def paired_ttest(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Paired t-test of ``a`` vs ``b``, both (n,); pairs with a NaN are dropped.

    Returns {"n", "mean_a", "mean_b", "diff" (mean of a - b), "t", "p" (two-sided)}.
    """
    a = np.asarray(a, dtype=float).reshape(-1)
    b = np.asarray(b, dtype=float).reshape(-1)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 2:
        return {"n": int(a.size), "mean_a": np.nan, "mean_b": np.nan, "diff": np.nan,
                "t": np.nan, "p": np.nan}
    with _quiet():
        res = ttest_rel(a, b)
    return {"n": int(a.size), "mean_a": float(a.mean()), "mean_b": float(b.mean()),
            "diff": float((a - b).mean()), "t": float(res.statistic), "p": float(res.pvalue)}


def bh_adjust(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini-Hochberg: (m,) p-values -> (reject (m,) bool, adjusted p (m,)).

    NaN p-values are left out of the correction and come back as (False, NaN).
    """
    p = np.asarray(pvalues, dtype=float).reshape(-1)
    reject = np.zeros(p.size, dtype=bool)
    p_adj = np.full(p.size, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        r, pa, _, _ = multipletests(p[ok], alpha=alpha, method="fdr_bh")
        reject[ok], p_adj[ok] = r, pa
    return reject, p_adj


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, float]:
    """Paired bootstrap of the mean difference ``a - b`` over paired units.

    a, b: (n_units,) (here one unit per (model, split)); pairs with a NaN are dropped. Each
    resample draws ``n_units`` units with replacement and takes the mean difference. Returns
    {"n", "delta" (observed mean difference), "ci_low", "ci_high" (percentile interval),
    "p"}: two-sided, ``2 * min(#{d* <= 0} + 1, #{d* >= 0} + 1) / (n_resamples + 1)``, capped at 1.
    """
    a = np.asarray(a, dtype=float).reshape(-1)
    b = np.asarray(b, dtype=float).reshape(-1)
    ok = np.isfinite(a) & np.isfinite(b)
    d = a[ok] - b[ok]
    if d.size < 2:
        return {"n": int(d.size), "delta": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                "p": np.nan}
    rng = np.random.default_rng(seed)
    boot = np.empty(n_resamples)
    for s in range(0, n_resamples, 1000):  # chunks keep memory flat for many units
        k = min(1000, n_resamples - s)
        boot[s : s + k] = d[rng.integers(0, d.size, size=(k, d.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    n_le, n_ge = int((boot <= 0).sum()), int((boot >= 0).sum())
    p = min(1.0, 2.0 * (min(n_le, n_ge) + 1) / (n_resamples + 1))
    return {"n": int(d.size), "delta": float(d.mean()), "ci_low": float(lo),
            "ci_high": float(hi), "p": p}


def ttests_from_splits(
    split_auc: Mapping[tuple[str, str, str], np.ndarray],
    *,
    methods: Sequence[str] = GRADIENT_METHODS,
    baselines: Sequence[str] = BASELINES,
    alpha: float = 0.05,
) -> list[dict]:
    """One row per (dataset, method, baseline): mean AUROCs over splits, diff, t, raw p,
    BH-adjusted p over all rows, significant, direction (↑ method better, ↓ worse).
    Both sides are averaged over the models that have both (``n_models``), so a baseline
    computed for fewer models is compared on those models only."""
    table = []
    for ds in dict.fromkeys(d for d, _, _ in split_auc):
        for m in methods:
            for bl in baselines:
                common = set(_cells(split_auc, ds, m)) & set(_cells(split_auc, ds, bl))
                if not common:
                    continue
                t = paired_ttest(mean_over_models(split_auc, ds, m, common),
                                 mean_over_models(split_auc, ds, bl, common))
                table.append({"dataset": ds, "method": m, "baseline": bl,
                              "n_models": len(common), "n_splits": t["n"],
                              "auroc_method": t["mean_a"], "auroc_baseline": t["mean_b"],
                              "diff": t["diff"], "t": t["t"], "p": t["p"]})
    reject, p_adj = bh_adjust([r["p"] for r in table], alpha)
    for r, rej, pa in zip(table, reject, p_adj, strict=True):
        r["p_bh"] = pa
        r["significant"] = bool(rej)
        r["direction"] = "↑" if r["diff"] > 0 else "↓" if r["diff"] < 0 else "="
        for k in ("auroc_method", "auroc_baseline", "diff", "t", "p", "p_bh"):
            r[k] = to_float(r[k])
    return table


def format_p(p) -> str:
    """'<0.001', '0.005', '' for a missing p-value; text (a p-value already written as the
    paper wrote it, '<.001') as it is."""
    if isinstance(p, str):
        return p
    if p is None or isinstance(p, bool) or not np.isfinite(p):
        return ""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def significance_wide(long: Iterable[Mapping]) -> list[dict]:
    """The paper's significance table: one row per (dataset, method), one column per baseline
    holding the BH-adjusted p and, when significant, the arrow (e.g. '<0.001 ↑'); a test on
    fewer models than the dataset's others says so (e.g. '0.210 (1 of 3 models)')."""
    long = list(long)
    most: dict[str, int] = {}
    for r in long:
        most[r["dataset"]] = max(most.get(r["dataset"], 0), int(r.get("n_models") or 0))
    out: dict[tuple[str, str], dict] = {}
    for r in long:
        row = out.setdefault((r["dataset"], r["method"]),
                             {"dataset": r["dataset"], "method": r["method"]})
        cell = format_p(r["p_bh"])
        if r["significant"]:
            cell += f" {r['direction']}"
        if int(r.get("n_models") or 0) < most[r["dataset"]]:
            cell += f" ({r['n_models']} of {most[r['dataset']]} models)"
        row[f"vs {r['baseline']}"] = cell
    return list(out.values())


def lift_from_splits(
    split_auc: Mapping[tuple[str, str, str], np.ndarray],
    *,
    method: str = "Epi. & Alea.",
    reference: str = "Alea.",
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[dict]:
    """Per dataset, the paired bootstrap of ``method`` vs ``reference`` over (model, split)
    cells: ΔAUROC, CI, p and the number of cells."""
    table = []
    for ds in dict.fromkeys(d for d, _, _ in split_auc):
        ca, cb = _cells(split_auc, ds, method), _cells(split_auc, ds, reference)
        models = [m for m in ca if m in cb]
        if not models:
            continue
        a = np.concatenate([ca[m] for m in models])
        b = np.concatenate([cb[m] for m in models])
        r = paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed, confidence=confidence)
        table.append({"dataset": ds, "method": method, "reference": reference,
                      "n_cells": r["n"], "delta_auroc": to_float(r["delta"]),
                      "ci_low": to_float(r["ci_low"]), "ci_high": to_float(r["ci_high"]),
                      "confidence": confidence, "p": to_float(r["p"])})
    return table


def significance_table(
    rows: Iterable[Mapping],
    *,
    n_splits: int = 10,
    seed: int = 0,
    alpha: float = 0.05,
    log_epistemic: bool = True,
) -> list[dict]:
    """Row-level wrapper: QA rows -> paired t-tests (BH-corrected) of each gradient method vs
    each baseline per dataset; see :func:`ttests_from_splits` for the columns."""
    groups = group_rows(rows)
    check_classes(groups)
    sa = split_aurocs(groups, n_splits=n_splits, seed=seed, log_epistemic=log_epistemic)
    return ttests_from_splits(sa, alpha=alpha)


def paired_bootstrap_table(
    rows: Iterable[Mapping],
    *,
    n_splits: int = 10,
    n_resamples: int = 10_000,
    seed: int = 0,
    log_epistemic: bool = True,
) -> list[dict]:
    """Row-level wrapper: QA rows -> paired bootstrap of Epi. & Alea. vs Alea. per dataset."""
    groups = group_rows(rows)
    check_classes(groups)
    sa = split_aurocs(groups, n_splits=n_splits, seed=seed, log_epistemic=log_epistemic)
    return lift_from_splits(sa, n_resamples=n_resamples, seed=seed)
