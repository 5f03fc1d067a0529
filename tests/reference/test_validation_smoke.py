"""The validation experiment end to end on tiny settings: files, tables, diagnostics."""

from __future__ import annotations

import json

import pytest

from isouq.errors import InputError
from isouq.study.experiments import validation


def test_validation_quick_smoke_and_resume(tmp_path, monkeypatch):
    """~16 s on 2 cores; then a re-run resumes from problems.jsonl without sampling again."""
    path = validation.run(tmp_path, quick=True, problems=["binary_linear", "regression_linear"],
                          num_warmup=40, num_samples=40, grid_n=8)
    doc = json.loads(path.read_text())
    assert doc["experiment"] == "validation" and doc["settings"]["num_samples"] == 40
    epi = {r["problem"]: r for r in doc["tables"]["epistemic"]}
    assert set(epi) == {"binary_linear", "regression_linear"}
    assert epi["regression_linear"]["gn_rho"] > 0.9  # linear model: GN ∝ exact variance
    assert epi["binary_linear"]["gn_rho"] >= 0.9  # logistic regression (paper: 0.99)
    assert len(doc["tables"]["aleatoric"]) == 1 and len(doc["tables"]["hessian"]) == 1
    assert all("r_hat_max" in r for r in doc["tables"]["diagnostics"])
    assert all((tmp_path / f).exists() for f in doc["figures"])
    assert (tmp_path / "tables.md").exists()
    vs = {(r["problem"], r["metric"]): r for r in doc["tables"]["versus_paper"]}
    r = vs[("binary_linear", "gn_rho")]
    assert r["paper"] == 0.99 and r["diff"] == pytest.approx(r["ours"] - 0.99)

    def no_sampling(*a, **k):
        raise AssertionError("a finished problem was run again")

    monkeypatch.setattr(validation, "run_problem", no_sampling)
    again = json.loads(validation.run(tmp_path, quick=True, problems=["binary_linear",
                                      "regression_linear"], num_warmup=40, num_samples=40,
                                      grid_n=8).read_text())
    assert again["tables"]["epistemic"] == doc["tables"]["epistemic"]
    with pytest.raises(InputError, match="other settings"):
        validation.run(tmp_path, quick=True, problems=["binary_linear"], num_warmup=40,
                       num_samples=50, grid_n=8)


def test_validation_rejects_unknown_problem(tmp_path):
    with pytest.raises(InputError, match="unknown problem"):
        validation.run(tmp_path, problems=["moons"])
