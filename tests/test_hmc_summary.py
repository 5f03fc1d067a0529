"""scripts/hmc_summary.py: the compact summary git keeps of a resumable HMC size, from its
checkpoint's meta.json and the cost model, checked against sums done here by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "hmc_summary.py"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args],
                          capture_output=True, text=True)


def test_summary_of_a_compact_checkpoint(tmp_path):
    ck = tmp_path / "compact_checkpoints" / "hmc_w1028"
    ck.mkdir(parents=True)
    (ck / "sampler_0123456789abcdef.npz").write_bytes(b"x" * 3_000_000)
    log = [{"start": 0, "stop": 2, "seconds": 100.0, "leapfrog_steps": 800},  # no CPU recorded
           {"start": 2, "stop": 4, "seconds": 60.0, "cpu_seconds": 50.0, "leapfrog_steps": 600},
           {"start": 4, "stop": 6, "seconds": 40.0, "cpu_seconds": 30.0, "leapfrog_steps": 400}]
    meta = {"format": 1, "layout": "compact", "done": 6, "total": 20_000, "every": 2,
            "seconds": 200.0, "state": None, "parts": [],
            "files": ["sampler_0123456789abcdef.npz"], "log": log, "updated": "T",
            "fingerprint": {"num_warmup": 10_000, "num_chains": 2, "spec": {"n_params": 99}}}
    (ck / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "cost.json").write_text(json.dumps({
        "warmup_factor": 1.2,
        "projection": [{"n_params": 99, "steps_per_iteration": 50.0, "cpu_hours": 7.0,
                        "wall_hours_2_cores": 3.5}]}))
    got = _run(tmp_path, "--recent", "2")
    assert got.returncode == 0, got.stderr
    doc = json.loads((tmp_path / "hmc_w1028_summary.json").read_text())
    assert doc["done"] == 6 and doc["phase"] == "warmup" and doc["segments"] == log
    assert doc["checkpoint_mb"] == round((3_000_000 + len(json.dumps(meta))) / 1e6, 1)
    recent = doc["cost_per_iteration"]["recent"]  # the last 2 segments: 4 iterations
    assert recent["iterations"] == 4
    assert recent["wall_seconds_per_iteration"] == 100.0 / 4
    assert recent["cpu_seconds_per_iteration"] == 80.0 / 4
    assert recent["leapfrog_steps_per_iteration_per_chain"] == 1000 / 4 / 2
    assert recent["cpu_ms_per_leapfrog_step"] == 1e3 * 80 / 1000
    whole = doc["cost_per_iteration"]["all"]  # CPU only over the segments that recorded it
    assert whole["wall_seconds_per_iteration"] == round(200.0 / 6, 1)
    assert whole["cpu_seconds_per_iteration"] == 80.0 / 4
    p = doc["projection"]
    assert p["iterations_left"] == 19_994
    assert p["cpu_hours_left_at_recent_rate"] == 111.1  # 20 s x 19,994
    assert p["wall_hours_left_at_recent_rate"] == 138.8  # 25 s x 19,994
    # 9,994 warmup iterations left at 1.4x an adapted one, then 10,000 sampling ones; an
    # adapted iteration: 2 chains x 50 steps x 80 ms = 8 s
    assert p["cpu_hours_left_at_cost_model_steps"] == 53.3
    assert p["cost_model_cpu_hours_whole_run"] == 7.0


def test_no_checkpoint_is_one_line(tmp_path):
    got = _run(tmp_path)
    assert got.returncode == 2 and got.stderr.count("\n") == 1
    assert "no checkpoint in" in got.stderr
    assert not (tmp_path / "hmc_w1028_summary.json").exists()
