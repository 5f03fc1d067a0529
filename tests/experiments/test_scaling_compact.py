"""The scaling study's compact HMC size: where its checkpoint lives, its progress row, and a
quick size run compact, cut, resumed and finished."""

from __future__ import annotations

import json

import pytest

from isouq.runio import read_jsonl
from isouq.study.experiments import scaling as sc


def test_only_the_largest_hmc_size_runs_compact(tmp_path):
    assert [w for w in sc.HMC_WIDTHS if sc.is_compact(sc.Job("hmc", w))] == [1028]
    assert not sc.is_compact(sc.Job("vi", 1024)) and not sc.is_compact(sc.Job("vi", 8192))
    assert sc.checkpoint_dir(tmp_path, sc.Job("hmc", 1028)) == (
        tmp_path / "compact_checkpoints" / "hmc_w1028")
    assert sc.checkpoint_dir(tmp_path, sc.Job("hmc", 512)) == tmp_path / "checkpoints" / "hmc_w512"


def test_progress_rows_show_a_compact_checkpoint_its_size_and_cpu_time(tmp_path, capsys):
    d = tmp_path / "compact_checkpoints" / "hmc_w1028"
    d.mkdir(parents=True)
    (d / "sampler_0123456789abcdef.npz").write_bytes(b"x" * 2_000_000)
    log = [{"start": 0, "stop": 2, "seconds": 600.0, "cpu_seconds": 300.0, "leapfrog_steps": 400},
           {"start": 2, "stop": 4, "seconds": 600.0, "leapfrog_steps": 400}]  # older: no CPU
    (d / "meta.json").write_text(json.dumps({
        "format": 1, "layout": "compact", "fingerprint": {"num_warmup": 1000}, "done": 4,
        "total": 2000, "every": 2, "seconds": 1200.0, "state": None, "parts": [],
        "files": ["sampler_0123456789abcdef.npz"], "log": log,
        "updated": "2026-11-26T08:00:00"}))
    (row,) = sc.in_progress_rows(tmp_path)
    assert row["model"] == "MLP(1028,1028)" and row["checkpoint"] == "compact"
    assert row["checkpoint_mb"] == 2.0 and row["iterations"] == "4 of 2,000"
    # CPU: 300 s for the 2 iterations that recorded it, 1,996 left
    assert row["cpu_hours_so_far"] == round(300 / 3600, 2)
    assert row["cpu_hours_left_at_recent_rate"] == round(1996 * 150 / 3600, 1)
    assert row["hours_left_at_recent_rate"] == round(1996 * 300 / 3600, 1)
    sc.record_progress(tmp_path)
    assert "compact checkpoint 2.0 MB" in capsys.readouterr().out


def test_a_compact_size_is_cut_resumed_and_finished(tmp_path, monkeypatch):
    from isouq.study.reference import hmc as hmc_mod

    monkeypatch.setattr(sc, "COMPACT_CHECKPOINT_ABOVE", 100)  # MLP(8,8) runs compact
    kw = dict(quick=True, study="hmc", sizes=[8], num_warmup=40, num_samples=40, grid_n=8)
    real, n = hmc_mod._run_segment, {"calls": 0}

    def run_segment(*a, **k):
        n["calls"] += 1
        if n["calls"] == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(hmc_mod, "_run_segment", run_segment)
        m.setattr(hmc_mod, "auto_checkpoint_every", lambda D: 16)
        with pytest.raises(KeyboardInterrupt):
            sc.run(tmp_path, **kw)
    ck = tmp_path / "compact_checkpoints" / "hmc_w8"
    assert json.loads((ck / "meta.json").read_text())["done"] == 56
    assert not (tmp_path / "checkpoints").exists()  # nothing in the git-ignored folder
    (row,) = sc.in_progress_rows(tmp_path)
    assert row["checkpoint"] == "compact" and row["status"] == "incomplete: sampling"
    monkeypatch.setattr(hmc_mod, "auto_checkpoint_every", lambda D: 16)
    sc.run(tmp_path, **kw)
    (done,) = read_jsonl(tmp_path / "sizes.jsonl")
    ref = done["reference"]
    assert ref["checkpoint"] == "compact" and ref["thinning"] == sc.COMPACT_THINNING
    assert ref["resumed_at"] == 56 and ref["ess_truncated"] == 0 and ref["r_hat_max"] > 0
    assert -1 <= done["gn_rho"] <= 1 and done["map"]["grad_norm"] < 1e-3
    assert not ck.exists() and sc.in_progress_rows(tmp_path) == []
