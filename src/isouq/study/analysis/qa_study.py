"""Every table of the QA study (paper §4.2, App. H) from the QA pipeline's result rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...evaluation.auroc import method_by_dataset, method_runs, model_by_method, runs_long_table
from ...evaluation.rows import check_classes, group_rows, rows_scored_by_all
from ...evaluation.significance import lift_from_splits, significance_wide, split_aurocs, ttests_from_splits
from .correlation import correlation_table
from .cost import cost_table
from .evidence import raw_auroc_rows
from .transfer import lomo_from_groups


def study_tables(
    rows: Iterable[Mapping],
    *,
    n_bootstrap: int = 300,
    n_splits: int = 10,
    n_paired_bootstrap: int = 10_000,
    seed: int = 0,
    log_epistemic: bool = True,
    alpha: float = 0.05,
) -> dict[str, list[dict]]:
    """QA rows (one per question; see :mod:`isouq.evaluation.rows`) -> {table name: dict rows}.

    Tables (each a list of dict rows for ``runio.markdown_table``):
      ``auroc``, ``prr``, ``aurac``: rows = methods, per dataset the mean over models and
        ``n_bootstrap`` out-of-bag runs and "<dataset> ±" the std (paper Table 2);
      ``auroc_per_model``: rows = (dataset, model), columns = methods (run means);
      ``metrics_per_model``: rows = (dataset, model, method) with n and mean/std of all three;
      ``significance``: paired t-tests over ``n_splits`` 80/20 splits, gradient method vs
        baseline, BH-corrected over all tests; ``significance_wide``: the paper's layout;
      ``paired_bootstrap``: Epi. & Alea. vs Alea., ΔAUROC, 95% CI, p per dataset;
      ``correlation``: Spearman ρ(epistemic, p_true) per model/dataset and pooled, n, p;
      ``lomo``: leave-one-model-out AUROC (datasets with 3+ models; else empty);
      ``cost``: passes, mean/std seconds per sample and speed-up of the gradient method;
      ``raw_auroc``: each score as it is (no fit), oriented as a confidence, its AUROC with a
        95% bootstrap interval and the direction the interval supports
        (:func:`evidence.raw_auroc_rows`).

    ``log_epistemic`` log-transforms epistemic and normalized_epistemic before standardizing
    (they span orders of magnitude). Rows with ``correct`` null are dropped. Raises
    :class:`isouq.errors.DataError` on missing fields or bad values, or a dataset (or a model
    on it) without at least two correct and two incorrect answers.
    """
    rows = list(rows)
    groups = group_rows(rows)
    check_classes(groups)
    runs = method_runs(groups, n_bootstrap=n_bootstrap, seed=seed, log_epistemic=log_epistemic)
    split_auc = split_aurocs(groups, n_splits=n_splits, seed=seed, log_epistemic=log_epistemic)
    significance = ttests_from_splits(split_auc, alpha=alpha)
    return {
        "auroc": method_by_dataset(runs, "auroc"),
        "prr": method_by_dataset(runs, "prr"),
        "aurac": method_by_dataset(runs, "aurac"),
        "auroc_per_model": model_by_method(runs, groups, "auroc"),
        "metrics_per_model": runs_long_table(runs),
        "significance": significance,
        "significance_wide": significance_wide(significance),
        "paired_bootstrap": lift_from_splits(split_auc, n_resamples=n_paired_bootstrap, seed=seed),
        "correlation": correlation_table(rows),
        "lomo": lomo_from_groups(groups, log_epistemic=log_epistemic),
        "cost": cost_table(rows),
        "raw_auroc": [r for g in groups.values()
                      for r in raw_auroc_rows(g, n_bootstrap=n_bootstrap, seed=seed)],
    }


def common_rows_tables(
    rows: Iterable[Mapping],
    *,
    n_bootstrap: int = 300,
    seed: int = 0,
    log_epistemic: bool = True,
    min_per_class: int = 2,
) -> dict[str, list[dict]]:
    """{"auroc_common_rows": one row per (dataset, model) whose run is in progress: every
    method's AUROC (mean over ``n_bootstrap`` out-of-bag runs, as in ``study_tables``) on the
    judged rows that carry every score (``rows_scored_by_all``), with ``n`` those rows and
    ``of`` the group's judged rows}. Empty when every group is complete; groups whose common
    rows lack ``min_per_class`` correct or incorrect judged answers are left out."""
    common, totals = rows_scored_by_all(r for r in rows if r.get("correct") is not None)
    if not common:
        return {"auroc_common_rows": []}
    groups = {k: g for k, g in group_rows(common).items()
              if g.n_per_class >= min_per_class}
    runs = method_runs(groups, n_bootstrap=n_bootstrap, seed=seed, log_epistemic=log_epistemic)
    table = []
    for row in model_by_method(runs, groups, "auroc"):
        key = (row.pop("dataset"), row.pop("model"))
        table.append({"dataset": key[0], "model": key[1], "n": groups[key].n,
                      "of": totals[key], **row})
    return {"auroc_common_rows": table}
