"""AUROC (with PRR and AURAC beside it) of each method, over out-of-bag bootstrap runs.

Protocol (per dataset, model and method): each run draws ``n`` row indices with replacement
from the model's ``n`` judged rows of that dataset; the drawn rows (with repeats) train the
method's logistic regression and the rows never drawn (out-of-bag, about 37% of them) are
scored by it. AUROC (correct vs incorrect on P(correct)), PRR and AURAC (on the uncertainty
``1 - P(correct)``) are computed on the out-of-bag rows. A run whose training or out-of-bag set
lacks a class is redrawn. The draws depend only on ``seed``, the dataset and the model, so all
methods of one model see the same runs (paired); a method uses the rows of a run that have all
its features. Reported: mean and std over the runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy.stats import rankdata

from ..errors import DataError
from .classifier import complete_rows, fit_predict
from .rejection import aurac, prr
from .rows import (
    LOG_FEATURES,
    METHODS,
    QAGroup,
    check_classes,
    datasets,
    feature_matrix,
    group_rng,
    group_rows,
    models_of,
    to_float,
)

Split = tuple[np.ndarray, np.ndarray]
METRICS: tuple[str, ...] = ("auroc", "prr", "aurac")


def auroc(correct: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for ``correct`` (Mann-Whitney, ties count 1/2).

    correct: (n,) 0/1; score: (n,) higher = more likely correct. NaN if one class only.
    """
    y = np.asarray(correct).astype(bool).reshape(-1)
    s = np.asarray(score, dtype=float).reshape(-1)
    n1 = int(y.sum())
    n0 = y.size - n1
    if n0 == 0 or n1 == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n0 * n1))


def bootstrap_splits(
    correct: np.ndarray, n_bootstrap: int, rng: np.random.Generator, max_tries: int = 1000
) -> list[Split]:
    """``n_bootstrap`` (train, out-of-bag) index pairs over ``n = len(correct)`` rows.

    train: (n,) indices drawn with replacement; oob: the indices never drawn. Draws whose train
    or oob lacks a class are redrawn (DataError after ``max_tries`` failures in a row).
    """
    y = np.asarray(correct).astype(int)
    n = y.size
    out: list[Split] = []
    while len(out) < n_bootstrap:
        for _ in range(max_tries):
            train = rng.integers(0, n, size=n)
            drawn = np.zeros(n, dtype=bool)
            drawn[train] = True
            oob = np.flatnonzero(~drawn)
            if np.unique(y[train]).size == 2 and np.unique(y[oob]).size == 2:
                out.append((train, oob))
                break
        else:
            raise DataError(
                f"could not draw a bootstrap run with both classes in training and out-of-bag "
                f"rows ({n} rows, {int(y.sum())} correct); add questions"
            )
    return out


def evaluate_splits(
    X: np.ndarray, correct: np.ndarray, splits: Iterable[Split], *, C: float = 1.0
) -> dict[str, np.ndarray]:
    """Fit on each split's train rows, score its test rows.

    X: (n, d) features (rows with NaN are left out of both sides); correct: (n,) 0/1;
    splits: (train_idx, test_idx) pairs. Returns {"auroc", "prr", "aurac"} -> (n_splits,),
    NaN for a split whose usable train or test rows hold one class.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(correct).astype(int)
    ok = complete_rows(X)
    res: dict[str, list[float]] = {m: [] for m in METRICS}
    for train, test in splits:
        tr, te = train[ok[train]], test[ok[test]]
        if np.unique(y[tr]).size < 2 or np.unique(y[te]).size < 2:
            for m in METRICS:
                res[m].append(float("nan"))
            continue
        p = fit_predict(X[tr], y[tr], X[te], C=C)
        res["auroc"].append(auroc(y[te], p))
        res["prr"].append(prr(1.0 - p, y[te]))
        res["aurac"].append(aurac(1.0 - p, y[te]))
    return {m: np.asarray(v, dtype=float) for m, v in res.items()}


def bootstrap_metrics(
    X: np.ndarray, correct: np.ndarray, *, n_bootstrap: int = 300, seed: int = 0, C: float = 1.0
) -> dict[str, np.ndarray]:
    """AUROC, PRR and AURAC over out-of-bag bootstrap runs (see the module docstring).

    X: (n, d) features; correct: (n,) 0/1 -> {"auroc", "prr", "aurac"} -> (n_bootstrap,).
    """
    y = np.asarray(correct).astype(int)
    splits = bootstrap_splits(y, n_bootstrap, np.random.default_rng(seed))
    return evaluate_splits(X, y, splits, C=C)


def method_runs(
    groups: Mapping[tuple[str, str], QAGroup],
    *,
    n_bootstrap: int = 300,
    seed: int = 0,
    log_epistemic: bool = True,
    methods: Mapping[str, Sequence[str]] = METHODS,
) -> dict[tuple[str, str, str], dict[str, np.ndarray]]:
    """Bootstrap runs of every method on every group: (dataset, model, method) -> metric ->
    (n_bootstrap,), plus "n" -> rows with the method's features (0-d). Methods with no usable
    rows in a group are left out."""
    log = LOG_FEATURES if log_epistemic else ()
    out: dict[tuple[str, str, str], dict[str, np.ndarray]] = {}
    for (ds, model), g in groups.items():
        splits = bootstrap_splits(g.correct, n_bootstrap, group_rng(seed, "bootstrap", ds, model))
        for name, feats in methods.items():
            X = feature_matrix(g, feats, log)
            ok = complete_rows(X)
            if not ok.any():
                continue
            r = evaluate_splits(X, g.correct, splits)
            r["n"] = np.asarray(int(ok.sum()))
            out[(ds, model, name)] = r
    return out


def runs_long_table(runs: Mapping[tuple[str, str, str], Mapping[str, np.ndarray]]) -> list[dict]:
    """One row per (dataset, model, method): n used, and mean/std over runs of each metric."""
    table = []
    for (ds, model, method), r in runs.items():
        row: dict = {"dataset": ds, "model": model, "method": method, "n": int(r["n"])}
        for m in METRICS:
            v = r[m][np.isfinite(r[m])]
            row[f"{m}_mean"] = to_float(v.mean()) if v.size else None
            row[f"{m}_std"] = to_float(v.std()) if v.size else None
        table.append(row)
    return table


def method_by_dataset(
    runs: Mapping[tuple[str, str, str], Mapping[str, np.ndarray]],
    metric: str = "auroc",
    methods: Sequence[str] = tuple(METHODS),
) -> list[dict]:
    """The paper's Table 2 shape: one row per method, per dataset the mean over models and runs
    (``"<dataset>"``) and the std over all (model, run) values pooled (``"<dataset> ±"``).
    A method evaluated on only some of a dataset's models gets no mean there (null): a mean
    over other models than the rest of the column would not compare."""
    dss = list(dict.fromkeys(ds for ds, _, _ in runs))
    models = {ds: {m for d, m, _ in runs if d == ds} for ds in dss}
    table = []
    for method in methods:
        row: dict = {"method": method}
        for ds in dss:
            vals = [r[metric] for (d, _, mth), r in runs.items() if d == ds and mth == method]
            if len(vals) < len(models[ds]):
                vals = []
            v = np.concatenate(vals) if vals else np.array([])
            v = v[np.isfinite(v)]
            row[ds] = to_float(v.mean()) if v.size else None
            row[f"{ds} ±"] = to_float(v.std()) if v.size else None
        table.append(row)
    return table


def model_by_method(
    runs: Mapping[tuple[str, str, str], Mapping[str, np.ndarray]],
    groups: Mapping[tuple[str, str], QAGroup],
    metric: str = "auroc",
    methods: Sequence[str] = tuple(METHODS),
) -> list[dict]:
    """The per-model table: one row per (dataset, model), one column per method (run mean)."""
    table = []
    for ds in datasets(groups):
        for model in models_of(groups, ds):
            row: dict = {"dataset": ds, "model": model}
            for method in methods:
                r = runs.get((ds, model, method))
                v = r[metric][np.isfinite(r[metric])] if r is not None else np.array([])
                row[method] = to_float(v.mean()) if v.size else None
            table.append(row)
    return table


def auroc_table(
    rows: Iterable[Mapping],
    *,
    n_bootstrap: int = 300,
    seed: int = 0,
    log_epistemic: bool = True,
) -> list[dict]:
    """Row-level wrapper: QA rows -> one row per (dataset, model, method) with n and the
    mean/std over ``n_bootstrap`` out-of-bag runs of AUROC, PRR and AURAC."""
    groups = group_rows(rows)
    check_classes(groups)
    runs = method_runs(groups, n_bootstrap=n_bootstrap, seed=seed, log_epistemic=log_epistemic)
    return runs_long_table(runs)
