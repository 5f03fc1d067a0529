"""benchmarks/blocks.py (the block profile and the hidden states against the summed ghost path,
side by side) runs end to end on a tiny random config."""

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
    assert row["rounds"] == 3
    for method, tag in (("ghost_blocks", "blocks"), ("ghost_hidden", "hidden"),
                        ("ghost_blocks_hidden", "blocks_hidden")):
        assert len(row["seconds"][method]) == 3 and row[f"{method}_s_per_answer"] > 0
        lo, mid, hi = (row[f"{tag}_over_ghost{s}"] for s in ("_min", "", "_max"))
        assert lo <= mid <= hi
    assert (tmp_path / "blocks.md").read_text().count("|") > 4
