"""Validation over several seeds: mean ± std per table entry, the paper outside ±2 std."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from isouq.errors import InputError
from isouq.study.experiments import validation as V


def _row(problem, cls, seed, **vals):
    return {"problem": problem, "class": cls, "model": "m", "n_params": 3, "n_train": 10,
            "seed": seed, **vals}


def test_aggregate_is_mean_and_sample_std_per_problem_and_class():
    rows = [_row("a", "all", s, gn_r=v, gn_rho=w) for s, v, w in
            [(0, 0.5, 0.9), (1, 0.7, float("nan")), (2, 0.9, 0.7)]]
    rows += [_row("b", "0", 0, gn_r=0.1, gn_rho=0.2)]
    agg = {(r["problem"], r["class"]): r for r in V.aggregate(rows)}
    a = agg[("a", "all")]
    assert a["n_seeds"] == 3 and a["model"] == "m" and "seed" not in a
    assert a["gn_r"] == pytest.approx(np.mean([0.5, 0.7, 0.9]))
    assert a["gn_r_std"] == pytest.approx(np.std([0.5, 0.7, 0.9], ddof=1))
    assert a["gn_rho"] == pytest.approx(0.8)  # NaN (constant map) left out
    assert a["gn_rho_std"] == pytest.approx(np.std([0.9, 0.7], ddof=1))
    b = agg[("b", "0")]
    assert b["n_seeds"] == 1 and math.isnan(b["gn_r_std"])


def test_versus_paper_marks_the_paper_outside_two_std():
    paper = {r["problem"]: r for r in V.PAPER["epistemic"]}["binary_xor"]["gn_rho"]  # 0.68
    near = {"problem": "binary_xor", "class": "all", "gn_r": 0.65, "gn_rho": paper + 0.1,
            "gn_rho_std": 0.06, "gn_r_std": 0.01, "n_seeds": 5}
    rows = {r["metric"]: r for r in V.versus_paper([near], [])}
    assert rows["gn_rho"]["outside_2sd"] is False  # 0.1 < 2 · 0.06: inside the seed spread
    assert rows["gn_rho"]["note"] == "" and rows["gn_rho"]["std"] == 0.06
    assert rows["gn_r"]["outside_2sd"] is False  # 0.65 = the paper's
    far = {**near, "gn_rho_std": 0.04}
    rows = {r["metric"]: r for r in V.versus_paper([far], [])}
    assert rows["gn_rho"]["outside_2sd"] is True and rows["gn_rho"]["note"]
    one_seed = {k: v for k, v in near.items() if not k.endswith("_std") and k != "n_seeds"}
    rows = {r["metric"]: r for r in V.versus_paper([one_seed], [])}
    assert "outside_2sd" not in rows["gn_rho"] and rows["gn_rho"]["note"] == ""  # |Δ| ≤ 0.15


def test_keys_round_trip():
    assert V.seed_key("binary_xor", 0) == "binary_xor"
    assert V.parse_key(V.seed_key("binary_xor", 3)) == ("binary_xor", 3)
    assert V.parse_key("binary_xor") == ("binary_xor", 0)


def test_two_seeds_reuse_a_plain_run_and_aggregate(tmp_path, monkeypatch):
    kw = dict(quick=True, problems=["binary_linear"], num_warmup=30, num_samples=30, grid_n=6)
    plain = json.loads(V.run(tmp_path, **kw).read_text())
    calls = []
    real = V.run_problem

    def counting(name, kind, **k):
        calls.append(k["seed"])
        return real(name, kind, **k)

    monkeypatch.setattr(V, "run_problem", counting)
    doc = json.loads(V.run(tmp_path, seeds=2, **kw).read_text())
    assert calls == [1]  # seed 0 is the plain run's row
    t = doc["tables"]
    per = t["epistemic_per_seed"]
    assert [r["seed"] for r in per] == [0, 1]
    assert {k: v for k, v in per[0].items() if k != "seed"} == plain["tables"]["epistemic"][0]
    (agg,) = t["epistemic"]
    assert agg["n_seeds"] == 2
    assert agg["gn_rho"] == pytest.approx(np.mean([r["gn_rho"] for r in per]))
    assert agg["gn_rho_std"] == pytest.approx(np.std([r["gn_rho"] for r in per], ddof=1))
    assert per[0]["gn_rho"] != per[1]["gn_rho"]  # data, MAP and chains re-drawn
    vs = {r["metric"]: r for r in t["versus_paper"]}
    assert vs["gn_rho"]["n_seeds"] == 2 and "outside_2sd" in vs["gn_rho"]
    assert doc["settings"]["seeds"] == [0, 1] and len(doc["figures"]) == 1
    with pytest.raises(InputError, match="seeds must be"):
        V.run(tmp_path, seeds=0, **kw)


def test_hmc_init_map_starts_the_chains_at_the_map():
    hmc = {"num_warmup": 5, "num_samples": 5, "num_chains": 2, "kernel": "hmc", "init": "map"}
    res = V.run_problem("binary_linear", "linear", seed=0, grid_n=4, prior_precision=1.0,
                        hmc=hmc)
    assert res["ref"].settings["init"] == "given" and res["ref"].settings["init_jitter"] == 0.1
    assert hmc["init"] == "map"  # the caller's dict is not changed
