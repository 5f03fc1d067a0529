"""Does a score's mapping to correctness transfer across models? Leave-one-model-out AUROC.

For each held-out model, the logistic regression is fitted on the pooled rows of all the other
models of the dataset (features standardized on those rows) and its AUROC taken on the held-out
model's rows. Feature sets: the raw ‖g‖² and the parameter-norm-normalized ‖g‖²/‖θ*‖², each
alone and with the aleatoric score; both epistemic variants are log-transformed per model when
``log_epistemic`` (then raw and normalized differ by a per-model shift, log ‖θ*‖²).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...evaluation.auroc import auroc
from ...evaluation.classifier import complete_rows, fit_predict
from ...evaluation.rows import (
    LOG_FEATURES,
    QAGroup,
    check_classes,
    datasets,
    feature_matrix,
    group_rows,
    models_of,
    to_float,
)

#: LOMO column -> features.
TRANSFER_FEATURES: dict[str, tuple[str, ...]] = {
    "Raw": ("epistemic",),
    "Normalized": ("normalized_epistemic",),
    "Raw & Alea.": ("epistemic", "aleatoric"),
    "Norm & Alea.": ("normalized_epistemic", "aleatoric"),
}


def leave_one_model_out(
    Xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *, C: float = 1.0
) -> np.ndarray:
    """Held-out AUROC per model.

    Xs: M arrays (n_m, d) of features; ys: M arrays (n_m,) of 0/1 correctness -> (M,): entry m
    is the AUROC on model m of the regression fitted on all other models. Rows with a NaN
    feature are left out; NaN where a side lacks a class.
    """
    out = np.full(len(Xs), np.nan)
    for m in range(len(Xs)):
        tr_X = np.concatenate([X for j, X in enumerate(Xs) if j != m])
        tr_y = np.concatenate([y for j, y in enumerate(ys) if j != m])
        ok_tr, ok_te = complete_rows(tr_X), complete_rows(Xs[m])
        te_y = np.asarray(ys[m])[ok_te]
        if np.unique(tr_y[ok_tr]).size < 2 or np.unique(te_y).size < 2:
            continue
        p = fit_predict(tr_X[ok_tr], tr_y[ok_tr], np.asarray(Xs[m])[ok_te], C=C)
        out[m] = auroc(te_y, p)
    return out


def lomo_from_groups(
    groups: Mapping[tuple[str, str], QAGroup],
    *,
    log_epistemic: bool = True,
    min_models: int = 3,
    features: Mapping[str, Sequence[str]] = TRANSFER_FEATURES,
) -> list[dict]:
    """Rows (dataset, held_out, one AUROC column per feature set) plus a "Mean" and a "Std"
    (over held-out models) row per dataset; datasets with fewer than ``min_models`` models
    are skipped."""
    log = LOG_FEATURES if log_epistemic else ()
    table = []
    for ds in datasets(groups):
        models = models_of(groups, ds)
        if len(models) < min_models:
            continue
        cols: dict[str, np.ndarray] = {}
        for name, feats in features.items():
            Xs = [feature_matrix(groups[(ds, m)], feats, log) for m in models]
            ys = [groups[(ds, m)].correct for m in models]
            cols[name] = leave_one_model_out(Xs, ys)
        for i, m in enumerate(models):
            table.append({"dataset": ds, "held_out": m,
                          **{k: to_float(v[i]) for k, v in cols.items()}})
        for label, fn in (("Mean", np.mean), ("Std", np.std)):
            row: dict = {"dataset": ds, "held_out": label}
            for k, v in cols.items():
                v = v[np.isfinite(v)]
                row[k] = to_float(fn(v)) if v.size else None
            table.append(row)
    return table


def lomo_table(
    rows: Iterable[Mapping], *, log_epistemic: bool = True, min_models: int = 3
) -> list[dict]:
    """Row-level wrapper: QA rows -> leave-one-model-out AUROC table (see
    :func:`lomo_from_groups`); empty when no dataset has ``min_models`` models."""
    groups = group_rows(rows)
    check_classes(groups)
    return lomo_from_groups(groups, log_epistemic=log_epistemic, min_models=min_models)
