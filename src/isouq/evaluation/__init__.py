"""Metrics over scored rows: does an uncertainty score predict whether an answer is correct?

Small pure functions over numpy arrays (shapes in each docstring) and row-level wrappers over
scored JSONL rows: AUROC with bootstrap intervals, rejection curves, probability metrics, paired
significance tests, gold labels, and the risk control that ``isouq calibrate`` certifies. The
paper's study tables built from them live in :mod:`isouq.study.analysis`.
"""

from __future__ import annotations

from .auroc import auroc, auroc_table, bootstrap_metrics, bootstrap_splits, evaluate_splits
from .classifier import fit_predict
from .labels import label_agreement, label_tables, with_gold_labels
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
    "evaluate_splits",
    "fit_predict",
    "group_rows",
    "label_agreement",
    "label_tables",
    "paired_bootstrap",
    "paired_bootstrap_table",
    "paired_ttest",
    "prr",
    "random_splits",
    "rejection_area",
    "rejection_curve",
    "significance_table",
    "with_gold_labels",
]
