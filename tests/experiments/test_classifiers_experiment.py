"""isouq experiment classifiers: settings, the shifted set, AUROC intervals, one small run."""

import json

import numpy as np
import pytest
import torch

from isouq.errors import InputError
from isouq.study.experiments import classifiers as C


def test_unknown_or_bad_options_are_refused(tmp_path):
    with pytest.raises(InputError, match="unknown option"):
        C.run(tmp_path, quick=True, epoch=3)
    with pytest.raises(InputError, match="ensemble"):
        C.run(tmp_path, quick=True, ensemble=0)


def test_shifted_images_keep_shape_and_range_and_differ():
    X = torch.rand(6, 1, 8, 8)
    S = C.shifted(X, 30.0, 2.0, seed=0)
    assert S.shape == X.shape and float(S.min()) >= 0 and float(S.max()) <= 1
    assert float((S - X).abs().mean()) > 0.05
    assert torch.equal(S, C.shifted(X, 30.0, 2.0, seed=0))  # seeded


def test_auroc_interval_brackets_the_estimate_and_perfect_scores_give_one():
    rng = np.random.default_rng(0)
    pos = rng.random(200) < 0.3
    score = pos + rng.normal(0, 1, 200)
    r = C.auroc_ci(pos, score, 200, seed=0)
    assert r["lo"] <= r["auroc"] <= r["hi"] and 0.5 < r["auroc"] < 1
    assert C.auroc_ci(pos, pos.astype(float), 50, seed=0)["auroc"] == 1.0
    assert C.auroc_ci(np.ones(5, bool), np.arange(5.0), 10, seed=0)["auroc"] is None


@pytest.mark.slow
def test_small_run_writes_every_method_and_task(tmp_path):
    path = C.run(tmp_path, quick=True, epochs=3, ensemble=2, mc_samples=3, n_bootstrap=20)
    d = json.loads(path.read_text())
    rows = d["tables"]["auroc"]
    tasks = {r["task"] for r in rows}
    assert len(tasks) == 3
    methods = {r["method"] for r in rows}
    assert {"epistemic", "epistemic_log", "aleatoric", "combined", "msp", "entropy", "ensemble",
            "mc_dropout"} <= methods
    assert all(r["auroc"] is None or 0 <= r["auroc"] <= 1 for r in rows)
    assert (tmp_path / "classifiers_auroc.png").exists()
