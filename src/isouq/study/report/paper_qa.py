"""The paper's question-answering numbers (§4.2 Table 2, App. H Tables 9-13) as dict rows.

Each table has the same row schema as the matching :func:`isouq.evaluation.study_tables`
table, so one view function renders ours and the paper's alike. A column ``"X ±"`` holds the
standard deviation of column ``X``. Four LLMs: Llama 2 (AWQ), Llama 3.2 3B, OLMo 1B, Phi-4.
"""

from __future__ import annotations

METHOD_COLUMNS: tuple[str, ...] = (
    "Naive Ent.", "Sem. Ent.", "P(True)", "Alea.", "Epi.", "Epi. & Alea.",
)
MODELS: tuple[str, ...] = ("Llama 2 (AWQ)", "Llama 3.2 3B", "OLMo 1B", "Phi-4 (4-bit)")


def _auroc() -> list[dict]:
    """Table 2: AUROC mean ± std over 300 bootstrap runs and 4 LLMs."""
    vals = {  # method: (TriviaQA, ±, TruthfulQA, ±)
        "Naive Ent.": (0.52, 0.04, 0.51, 0.08),
        "Sem. Ent.": (0.55, 0.03, 0.54, 0.08),
        "P(True)": (0.69, 0.06, 0.55, 0.06),
        "Alea.": (0.60, 0.04, 0.60, 0.09),
        "Epi.": (0.52, 0.07, 0.55, 0.07),
        "Epi. & Alea.": (0.61, 0.05, 0.63, 0.08),
    }
    return [
        {"method": m, "TriviaQA": a, "TriviaQA ±": sa, "TruthfulQA": b, "TruthfulQA ±": sb}
        for m, (a, sa, b, sb) in vals.items()
    ]


def _auroc_per_model() -> list[dict]:
    """Table 9: per-model AUROC (mean over 300 bootstrap runs)."""
    vals = {
        "TruthfulQA": [
            (0.57, 0.52, 0.57, 0.61, 0.51, 0.58),
            (0.53, 0.58, 0.50, 0.69, 0.53, 0.68),
            (0.47, 0.47, 0.54, 0.51, 0.53, 0.57),
            (0.47, 0.58, 0.58, 0.59, 0.63, 0.69),
        ],
        "TriviaQA": [
            (0.58, 0.56, 0.75, 0.61, 0.60, 0.61),
            (0.53, 0.51, 0.59, 0.64, 0.51, 0.67),
            (0.48, 0.58, 0.72, 0.55, 0.55, 0.55),
            (0.50, 0.55, 0.69, 0.61, 0.42, 0.60),
        ],
    }
    return [
        {"dataset": ds, "model": model, **dict(zip(METHOD_COLUMNS, row, strict=True))}
        for ds, rows in vals.items()
        for model, row in zip(MODELS, rows, strict=True)
    ]


def _significance_wide() -> list[dict]:
    """Table 10: BH-adjusted p of paired t-tests; arrow when significant at 0.05."""
    cells = {
        ("TruthfulQA", "Alea."): ("<0.001 ↑", "0.005 ↑", "0.005 ↑"),
        ("TruthfulQA", "Epi."): ("0.005 ↑", "0.575", "0.985"),
        ("TruthfulQA", "Epi. & Alea."): ("<0.001 ↑", "<0.001 ↑", "<0.001 ↑"),
        ("TriviaQA", "Alea."): ("<0.001 ↑", "<0.001 ↑", "<0.001 ↓"),
        ("TriviaQA", "Epi."): ("0.712", "<0.001 ↓", "<0.001 ↓"),
        ("TriviaQA", "Epi. & Alea."): ("<0.001 ↑", "<0.001 ↑", "<0.001 ↓"),
    }
    return [
        {"dataset": ds, "method": m, "vs Naive Ent.": a, "vs Sem. Ent.": b, "vs P(True)": c}
        for (ds, m), (a, b, c) in cells.items()
    ]


def _paired_bootstrap() -> list[dict]:
    """App. H.4: Epi. & Alea. vs Alea., 10,000 resamples paired by model and split."""
    return [
        {"dataset": "TruthfulQA", "method": "Epi. & Alea.", "reference": "Alea.", "n_cells": 40,
         "delta_auroc": 0.027, "ci_low": 0.002, "ci_high": 0.054, "confidence": 0.95,
         "p": 0.018},
        {"dataset": "TriviaQA", "method": "Epi. & Alea.", "reference": "Alea.", "n_cells": 40,
         "delta_auroc": 0.006, "ci_low": -0.003, "ci_high": 0.016, "confidence": 0.95,
         "p": 0.106},
    ]


def _correlation() -> list[dict]:
    """Table 11: Spearman ρ between ‖g‖² and P(True); p < 0.001 stored as 0.0."""
    vals = [
        ("Llama 2 (AWQ)", "TruthfulQA", 811, -0.17, 0.0),
        ("Llama 3.2 3B", "TruthfulQA", 794, -0.11, 0.002),
        ("OLMo 1B", "TruthfulQA", 501, -0.12, 0.007),
        ("Phi-4 (4-bit)", "TruthfulQA", 455, -0.20, 0.0),
        ("Llama 2 (AWQ)", "TriviaQA", 7885, -0.22, 0.0),
        ("Llama 3.2 3B", "TriviaQA", 7408, -0.27, 0.0),
        ("OLMo 1B", "TriviaQA", 4670, -0.19, 0.0),
        ("Phi-4 (4-bit)", "TriviaQA", 3270, -0.10, 0.0),
        ("Pooled", "TruthfulQA", 2561, -0.23, 0.0),
        ("Pooled", "TriviaQA", 23233, -0.21, 0.0),
    ]
    return [{"model": m, "dataset": d, "n": n, "rho": r, "p": p} for m, d, n, r, p in vals]


def _lomo() -> list[dict]:
    """Table 12: leave-one-model-out AUROC, with Mean and Std rows per dataset."""
    cols = ("Raw", "Normalized", "Raw & Alea.", "Norm & Alea.")
    vals = {
        "TruthfulQA": [
            ("Llama 3.2 3B", (0.53, 0.47, 0.33, 0.33)),
            ("Llama 2 (AWQ)", (0.55, 0.55, 0.51, 0.53)),
            ("OLMo 1B", (0.47, 0.47, 0.49, 0.49)),
            ("Phi-4 (4-bit)", (0.37, 0.37, 0.61, 0.61)),
            ("Mean", (0.48, 0.46, 0.48, 0.49)),
            ("Std", (0.08, 0.08, 0.12, 0.12)),
        ],
        "TriviaQA": [
            ("Llama 3.2 3B", (0.49, 0.49, 0.35, 0.35)),
            ("Llama 2 (AWQ)", (0.40, 0.40, 0.38, 0.38)),
            ("OLMo 1B", (0.45, 0.55, 0.44, 0.44)),
            ("Phi-4 (4-bit)", (0.40, 0.40, 0.61, 0.61)),
            ("Mean", (0.44, 0.46, 0.45, 0.45)),
            ("Std", (0.05, 0.07, 0.11, 0.11)),
        ],
    }
    return [
        {"dataset": ds, "held_out": who, **dict(zip(cols, v, strict=True))}
        for ds, rows in vals.items()
        for who, v in rows
    ]


def _cost() -> list[dict]:
    """Tables 13-14: per-sample passes and seconds (mean, std) on one H100; no dataset split."""
    secs = {
        "Llama 2 (AWQ)": ((0.12, 0.01), (7.14, 0.96), (10.67, 1.87), (11.29, 2.03)),
        "Llama 3.2 3B": ((0.08, 0.00), (5.37, 0.39), (8.18, 0.77), (8.94, 0.76)),
        "OLMo 1B": ((0.06, 0.00), (3.06, 0.64), (4.52, 1.08), (5.24, 1.18)),
        "Phi-4 (4-bit)": ((0.15, 0.00), (6.73, 0.98), (10.26, 1.50), (10.93, 1.67)),
    }
    methods = (("Gradient norm (ours)", 1), ("P(True)", 6), ("Naive Ent.", 10),
               ("Sem. Ent.", 10))
    rows = []
    for model, per_method in secs.items():
        ref = per_method[0][0]
        for (method, passes), (mean, std) in zip(methods, per_method, strict=True):
            rows.append({"dataset": "all", "model": model, "method": method, "passes": passes,
                         "n": None, "mean_s": mean, "std_s": std,
                         "speedup": round(mean / ref, 1)})
    return rows


def paper_qa_tables() -> dict[str, list[dict]]:
    """The paper's QA tables keyed like :func:`isouq.evaluation.study_tables` output."""
    return {
        "auroc": _auroc(),
        "auroc_per_model": _auroc_per_model(),
        "significance_wide": _significance_wide(),
        "paired_bootstrap": _paired_bootstrap(),
        "correlation": _correlation(),
        "lomo": _lomo(),
        "cost": _cost(),
    }
