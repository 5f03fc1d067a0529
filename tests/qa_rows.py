"""Synthetic QA rows (schema of ``isouq.evaluation.rows``) for the evaluation and report tests."""

from __future__ import annotations

import numpy as np


def synth_rows(
    *,
    n: int = 80,
    models: tuple[str, ...] = ("m1", "m2", "m3"),
    datasets: tuple[str, ...] = ("TruthfulQA", "TriviaQA"),
    seed: int = 0,
    both_classes: bool = False,
) -> list[dict]:
    """Rows where aleatoric predicts correctness strongly, epistemic weakly and the baselines
    not at all. ``both_classes``: the first four rows of every (dataset, model) are two wrong
    and two correct answers, whatever the draw (a report needs both classes per model)."""
    rng = np.random.default_rng(seed)
    rng_p = np.random.default_rng(seed + 1000)  # p̄ from its own stream: the others unchanged
    rows = []
    for ds in datasets:
        for mi, model in enumerate(models):
            wrong = rng.random(n) < 0.5
            if both_classes:
                wrong[:2], wrong[2:4] = True, False
            alea = rng.normal(size=n) + 2.0 * wrong
            epi = np.exp(2.0 * rng.normal(size=n) + 0.7 * wrong + mi)
            for i in range(n):
                rows.append({
                    "key": f"{ds}-{i}", "model": model, "dataset": ds,
                    "question": f"q{i}?", "answer": "a", "correct": int(not wrong[i]),
                    "scores": {
                        "epistemic": float(epi[i]), "aleatoric": float(alea[i]),
                        "normalized_epistemic": float(epi[i] / 10.0**mi),
                        "naive_entropy": float(rng.normal()),
                        "semantic_entropy": float(rng.normal()),
                        "p_true": float(rng.random()),
                        "mean_prob": float(rng_p.uniform(0.05, 1.0)),
                    },
                    "passes": {"gradient": 1, "naive_entropy": 10, "semantic_entropy": 10,
                               "p_true": 6},
                    "seconds": {"gradient": 0.1, "naive_entropy": 5.0, "semantic_entropy": 6.0,
                                "p_true": float(rng.uniform(2.0, 4.0))},
                })
    return rows
