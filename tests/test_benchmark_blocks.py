"""benchmarks/blocks.py (the block profile against the summed ghost path, side by side) runs end
to end on a tiny random config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_blocks_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "blocks.py"), "--config", str(tiny_llama_dir),
         "--batch-sizes", "2", "--rounds", "3", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = json.loads((tmp_path / "blocks.json").read_text())["rows"]
    assert row["rounds"] == 3 and len(row["seconds"]["ghost_blocks"]) == 3
    assert row["blocks_over_ghost_min"] <= row["blocks_over_ghost"] <= row["blocks_over_ghost_max"]
    assert (tmp_path / "blocks.md").read_text().count("|") > 4
