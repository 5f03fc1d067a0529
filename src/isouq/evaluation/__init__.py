"""Statistics of the QA study: does an uncertainty score predict whether an answer is correct?

Small pure functions over numpy arrays (shapes in each docstring) and row-level wrappers over
the QA pipeline's JSONL rows; :func:`study_tables` computes every table of the study.
"""

from __future__ import annotations

from .auroc import auroc, auroc_table, bootstrap_metrics, bootstrap_splits, evaluate_splits
from .classifier import fit_predict
from .correlation import correlation_table, spearman
from .cost import cost_table, speedup
from .labels import label_agreement, label_tables, with_gold_labels
from .qa_study import common_rows_tables, study_tables
from .rejection import aurac, prr, rejection_area, rejection_curve
from .rows import BASELINES, GRADIENT_METHODS, METHODS, group_rows
from .significance import (
    bh_adjust,
    paired_bootstrap,
    paired_bootstrap_table,
    paired_ttest,
    random_splits,
    significance_table,
)
from .transfer import leave_one_model_out, lomo_table

__all__ = [
    "BASELINES",
    "GRADIENT_METHODS",
    "METHODS",
    "aurac",
    "auroc",
    "auroc_table",
    "bh_adjust",
    "bootstrap_metrics",
    "bootstrap_splits",
    "common_rows_tables",
    "correlation_table",
    "cost_table",
    "evaluate_splits",
    "fit_predict",
    "group_rows",
    "label_agreement",
    "label_tables",
    "leave_one_model_out",
    "lomo_table",
    "paired_bootstrap",
    "paired_bootstrap_table",
    "paired_ttest",
    "prr",
    "random_splits",
    "rejection_area",
    "rejection_curve",
    "significance_table",
    "spearman",
    "speedup",
    "study_tables",
    "with_gold_labels",
]
