"""The scaling experiment: sizes, plans, budget rules, tables, and a resumable quick run."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from isouq.errors import InputError
from isouq.runio import read_jsonl, write_results
from isouq.study.experiments import scaling as sc

# --------------------------------------------------------------------------- pure functions


def test_parameter_counts_match_the_paper():
    counts = [sc.spec_for_width(w).n_params for w in sc.HMC_WIDTHS]
    assert counts[:3] == [12, 132, 388] and counts[-1] == 1_065_012
    assert [r["n_params"] for r in sc.PAPER["hmc"]] == counts
    assert sc.spec_for_width(8192).n_params == 67_174_404  # "6.7×10⁷"
    assert [r["gn_rho"] for r in sc.PAPER["hmc"]] == [0.97, 0.84, 0.89, 0.68, 0.82, 0.66,
                                                       0.78, 0.83, 0.87]
    assert sc.model_label(0) == "LogReg" and sc.model_label(16) == "MLP(16,16)"
    with pytest.raises(InputError):
        sc.spec_for_width(-1)


def test_plan_cheapest_first_interleaved():
    jobs = sc.plan(["hmc", "vi"], {"hmc": [16, 0, 8, 8], "vi": [16, 8]})
    assert [j.key for j in jobs] == ["hmc:0", "hmc:8", "vi:8", "hmc:16", "vi:16"]
    assert [j.key for j in sc.plan(["vi"], {"vi": [32, 8]})] == ["vi:8", "vi:32"]


def _row(study, width, seconds):
    return {"study": study, "width": width, "n_params": sc.spec_for_width(width).n_params,
            "seconds": {"total": seconds}}


def test_predict_seconds_and_budget_decision():
    rows = [_row("hmc", 64, 100.0), _row("hmc", 8, 5.0), _row("vi", 128, 10.0)]
    D64, D256 = sc.spec_for_width(64).n_params, sc.spec_for_width(256).n_params
    got = sc.predict_seconds(sc.Job("hmc", 256), rows)
    assert got == pytest.approx(100.0 * (D256 / D64) ** sc.COST_EXPONENT["hmc"])
    assert sc.predict_seconds(sc.Job("vi", 64), rows) is None  # nothing smaller finished
    assert sc.predict_seconds(sc.Job("hmc", 0), rows) is None
    assert sc.budget_decision(10.0, None, 1e9) is None
    assert sc.budget_decision(61.0, 60.0, None) == "budget spent"
    assert sc.budget_decision(10.0, 60.0, 100.0) == "predicted to overrun"
    assert sc.budget_decision(10.0, 60.0, 40.0) is None
    assert sc.budget_decision(10.0, 60.0, None) is None


def test_auto_thinning():
    assert sc.auto_thinning(2, 1000, 17_412) == 1
    # w = 1028: 2·1000 draws of 1,065,012 float64 = 15.9 GiB → keep every 8th
    assert sc.auto_thinning(2, 1000, 1_065_012) == 8
    assert sc.auto_thinning(2, 1000, 1_065_012, budget_bytes=2 * 1000 * 1_065_012 * 8) == 1


def test_correlation_fields_pooled_and_per_class():
    rng = np.random.default_rng(0)
    ref = rng.uniform(0.1, 1.0, (50, 4))
    gn = 3.0 * ref  # perfectly proportional
    pe = rng.uniform(size=(50, 4))
    f = sc.correlation_fields(gn, pe, ref, pe**2)
    assert f["gn_r"] == pytest.approx(1.0) and f["gn_rho"] == pytest.approx(1.0)
    assert f["pe_rho"] == pytest.approx(1.0)  # monotone
    assert set(f["per_class"]) == {"0", "1", "2", "3"}
    assert f["per_class"]["2"]["gn_rho"] == pytest.approx(1.0)


def test_smooth_and_elbo_roundtrip(tmp_path):
    assert sc.smooth(np.arange(5.0), 2).tolist() == [0.5, 1.5, 2.5, 3.5]
    assert sc.smooth(np.arange(3.0), 10).tolist() == [1.0]
    e = np.array([-100.0, -50.5, -20.25])
    rel = sc.write_elbo(tmp_path, 8, e)
    assert rel == "elbo/vi_w8.csv"
    np.testing.assert_allclose(sc.read_elbo(tmp_path, rel), e)
    assert sc.read_elbo(tmp_path, "elbo/none.csv") is None


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(InputError):
        sc.run(tmp_path, study="mcmc")
    with pytest.raises(InputError):
        sc.run(tmp_path, sizes=[8, -2])
    with pytest.raises(InputError):
        sc.run(tmp_path, budget_minutes=0)


def test_spent_budget_starts_nothing(tmp_path):
    doc = json.loads(sc.run(tmp_path, quick=True, budget_minutes=1e-9).read_text())
    assert doc["tables"]["hmc"] == [] and doc["tables"]["vi"] == [] and doc["rows"] == 0
    run = read_jsonl(tmp_path / "runs.jsonl")[0]
    assert run["ran"] == [] and set(run["not_started"]) == {"hmc:0", "hmc:8", "vi:8", "vi:16"}
    assert all(v.startswith("budget spent") for v in run["not_started"].values())
    assert doc["settings"]["budget_minutes"] == 1e-9


def _fake_checkpoint(out, width: int, done: int, log: list[dict]) -> None:
    d = out / "checkpoints" / f"hmc_w{width}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({
        "format": 1, "fingerprint": {"num_warmup": 1000}, "done": done, "total": 2000,
        "every": 8, "seconds": 7200.0, "state": None, "parts": [], "log": log,
        "updated": "2026-11-25T18:00:00"}))


def test_progress_prints_and_records_sizes_in_progress(tmp_path, capsys):
    # 2 segments of 8 iterations: 40 s and 20 s, 1,000 + 1,000 leapfrog steps
    log = [{"start": 1000, "stop": 1008, "seconds": 40.0, "leapfrog_steps": 1000},
           {"start": 1008, "stop": 1016, "seconds": 20.0, "leapfrog_steps": 1000}]
    _fake_checkpoint(tmp_path, 512, 1016, log)
    _fake_checkpoint(tmp_path, 16, 400, log[:1])
    (tmp_path / "checkpoints" / "hmc_wrong").mkdir()  # not a size: ignored
    rows = sc.in_progress_rows(tmp_path)
    assert [r["model"] for r in rows] == ["MLP(16,16)", "MLP(512,512)"]
    big = rows[1]
    assert big["n_params"] == 266_244 and big["status"] == "incomplete: sampling"
    assert rows[0]["status"] == "incomplete: warmup"
    assert big["iterations"] == "1,016 of 2,000" and big["hours_so_far"] == 2.0
    assert big["leapfrog_steps"] == 2000 and big["ms_per_leapfrog_step"] == 30.0
    # 60 s per 16 iterations, 984 left: 3,690 s
    assert big["hours_left_at_recent_rate"] == round(984 * 60 / 16 / 3600, 1)
    # without results.json: printed only; with one: stored as a table, then dropped when done
    assert sc.run(tmp_path, progress=True) == tmp_path / "results.json"
    assert "MLP(512,512) (266,244 params) incomplete: sampling" in capsys.readouterr().out
    assert not (tmp_path / "results.json").exists()
    write_results(tmp_path, "scaling", settings={}, seed=0, started=0.0, tables={"hmc": []})
    sc.run(tmp_path, progress=True)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["tables"]["hmc_in_progress"] == rows and doc["tables"]["hmc"] == []
    for w in (16, 512):
        shutil.rmtree(tmp_path / "checkpoints" / f"hmc_w{w}")
    sc.run(tmp_path, progress=True)
    assert "no HMC size in progress" in capsys.readouterr().out
    assert "hmc_in_progress" not in json.loads((tmp_path / "results.json").read_text())["tables"]


def test_progress_flag_on_the_command_line(tmp_path, capsys):
    from isouq.cli import main

    assert main(["experiment", "scaling", "--out", str(tmp_path), "--progress"]) == 0
    assert "no HMC size in progress" in capsys.readouterr().out


# --------------------------------------------------------------------------- end to end

SMALL = dict(num_warmup=60, num_samples=60, vi_steps=150, vi_draws=50, grid_n=12)


def _check_doc(doc: dict, out) -> None:
    assert doc["experiment"] == sc.NAME == "scaling"
    assert {"settings", "seed", "versions", "started", "elapsed_s", "tables", "paper",
            "figures"} <= set(doc)
    t = doc["tables"]
    assert [r["width"] for r in t["hmc"]] == [0, 8]
    assert [r["width"] for r in t["vi"]] == [8, 16]
    assert [r["n_params"] for r in t["hmc"]] == [12, 132]
    for r in t["hmc"] + t["vi"]:
        assert -1 <= r["gn_rho"] <= 1 and -1 <= r["gn_r"] <= 1
        assert -1 <= r["pe_rho"] <= 1 and r["seconds"] > 0
    assert all(r["r_hat_max"] is not None for r in t["hmc"])
    assert all(np.isfinite(r["elbo_final"]) for r in t["vi"])
    assert len(t["per_class"]) == 4 * 4
    assert {r["class"] for r in t["per_class"]} == {"0", "1", "2", "3"}
    assert doc["paper"]["hmc"][3]["gn_rho"] == 0.68 and "vi" in doc["paper"]
    assert set(doc["figures"]) == {"scaling.png", "scaling_vi_elbo.png"}
    assert all((out / f).is_file() for f in doc["figures"])
    assert (out / "tables.md").is_file()
    assert (out / "elbo" / "vi_w8.csv").is_file() and (out / "elbo" / "vi_w16.csv").is_file()


def test_quick_run_one_row_per_size_and_resumes(tmp_path, monkeypatch):
    doc = json.loads(sc.run(tmp_path, quick=True, **SMALL).read_text())
    _check_doc(doc, tmp_path)
    rows = read_jsonl(tmp_path / "sizes.jsonl")
    assert sorted(r["key"] for r in rows) == ["hmc:0", "hmc:8", "vi:16", "vi:8"]
    hmc8 = next(r for r in rows if r["key"] == "hmc:8")
    assert hmc8["settings"]["num_samples"] == 60 and hmc8["reference"]["thinning"] == 1
    assert hmc8["map"]["grad_norm"] < 1e-3
    # each size's HMC checkpoint is removed once its row is written; the folder is git-ignored
    assert hmc8["reference"]["resumed_at"] == 0 and hmc8["reference"]["leapfrog_steps"] > 0
    assert not list((tmp_path / "checkpoints").glob("hmc_w*"))
    assert (tmp_path / "checkpoints" / ".gitignore").read_text() == "*\n"

    # a second run skips every finished size and rebuilds the same tables
    def boom(*a, **k):
        raise AssertionError("a finished size ran again")

    monkeypatch.setattr(sc, "run_hmc_size", boom)
    monkeypatch.setattr(sc, "run_vi_size", boom)
    again = json.loads(sc.run(tmp_path, quick=True, **SMALL).read_text())
    assert again["tables"]["hmc"] == doc["tables"]["hmc"]
    assert again["tables"]["vi"] == doc["tables"]["vi"]
    assert len(read_jsonl(tmp_path / "sizes.jsonl")) == 4
    runs = again["tables"]["runs"]
    assert len(runs) == 2 and runs[1]["ran"] == ""
    assert runs[1]["already_done"] == "hmc:0 hmc:8 vi:8 vi:16"

    # other settings on the same folder: refused before any work
    with pytest.raises(InputError, match="other settings"):
        sc.run(tmp_path, quick=True, **{**SMALL, "num_samples": 61})
    with pytest.raises(InputError, match="vi_prior"):
        sc.run(tmp_path, quick=True, study="vi", vi_prior="fan_in", **SMALL)
    with pytest.raises(InputError, match="vi_elbo"):
        sc.run(tmp_path, quick=True, study="vi", vi_elbo="analytic_kl", **SMALL)
    # HMC settings do not concern a VI-only run (its sizes are all done)
    vi_only = json.loads(sc.run(tmp_path, quick=True, study="vi",
                                **{**SMALL, "num_samples": 61}).read_text())
    assert vi_only["tables"]["runs"][2]["already_done"] == "vi:8 vi:16"
    assert len(vi_only["tables"]["hmc"]) == 2  # earlier HMC rows stay in the tables


@pytest.mark.slow
def test_quick_run_defaults(tmp_path):
    """The plain quick run (about a minute on 2 shared cores): run with -m slow."""
    doc = json.loads(sc.run(tmp_path, quick=True).read_text())
    _check_doc(doc, tmp_path)
    s = doc["settings"]["studies"]
    assert s["hmc"]["num_samples"] == 150 and s["vi"]["vi_steps"] == 400


def test_cautions_come_from_each_reference_own_diagnostics():
    def row(study, width, ref, pe_rho=0.95):
        return {"study": study, "width": width, "n_params": sc.spec_for_width(width).n_params,
                "gn_rho": 0.9, "pe_rho": pe_rho, "reference": ref}

    rows = [row("vi", 8, {"elbo_rel_change_last_10pct": 0.001}),
            row("vi", 512, {"elbo_rel_change_last_10pct": 0.04}, pe_rho=0.5),
            row("hmc", 0, {"r_hat_max": 1.07}), row("hmc", 8, {"r_hat_max": 1.01})]
    got = {(c["study"], c["width"]): c["why"] for c in sc.cautions(rows)}
    assert set(got) == {("vi", 512), ("hmc", 0)}
    assert "not converged" in got[("vi", 512)] and "0.50" in got[("vi", 512)]
    assert "R-hat 1.070" in got[("hmc", 0)]
