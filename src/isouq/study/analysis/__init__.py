"""The paper's QA study tables, built from the metrics of :mod:`isouq.evaluation`.

:func:`study_tables` computes every table of the short-answer study; ``evidence`` the exact-label
evidence, ``long_spans`` the long-answer span study, ``transfer`` leave-one-model-out, ``cost``
and ``correlation`` the cost and agreement tables.
"""

from __future__ import annotations

from .correlation import correlation_table, spearman
from .cost import cost_table, speedup
from .qa_study import common_rows_tables, study_tables
from .transfer import leave_one_model_out, lomo_table

__all__ = [
    "common_rows_tables",
    "correlation_table",
    "cost_table",
    "leave_one_model_out",
    "lomo_table",
    "spearman",
    "speedup",
    "study_tables",
]
