"""The GPU benchmark scripts run end to end (on the CPU, a tiny random config): a GPU session
has minutes, and a script that fails there costs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_paper_sizes_runs_every_method_and_variant(tiny_llama_dir, tmp_path):
    pytest.importorskip("transformers")
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paper_sizes.py"), "--models",
         str(tiny_llama_dir), "--methods", "floor", "full_backward", "ghost", "floor_unaligned",
         "ghost_unaligned", "--batch-sizes", "2", "--tokenizer", str(tiny_llama_dir),
         "--device", "cpu", "--dtype", "float32", "--warmups", "0", "--repeats", "1",
         "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "paper_sizes_t.json").read_text())
    assert not doc["failures"], doc["failures"]
    methods = {r["method"] for r in doc["rows"] if not r.get("oom")}
    assert methods == {"floor", "full_backward", "ghost", "floor_unaligned", "ghost_unaligned"}
    row = doc["table"][0]
    assert row["ghost/floor"] > 0 and row["unaligned ghost/floor"] > 0


def test_spans_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    out = tmp_path / "spans.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "spans.py"), "--config", str(tiny_llama_dir),
         "--device", "cpu", "--n", "4", "--repeats", "1", "--loop-repeats", "1", "--threads", "1",
         "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["seconds"]) >= {"whole", "spans_retain", "spans_loop"}
    assert doc["max_rel_diff_retain_vs_loop"] < 1e-4


def test_score_sequences_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences.py"), "--config",
         str(tiny_llama_dir), "--device", "cpu", "--batch-sizes", "2", "--methods", "floor",
         "ghost", "loop", "ghost_unaligned", "--repeats", "1", "--warmups", "0", "--threads",
         "1", "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "score_sequences_t.json").read_text())
    assert {r["method"] for r in doc["rows"]} == {"floor", "ghost", "loop", "ghost_unaligned"}
    assert {"loop/ghost", "ghost/floor", "ghost_unaligned/ghost"} <= set(doc["ratios"][0])


def test_half_precision_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "half_precision.py"), "--config",
         str(tiny_llama_dir), "--device", "cpu", "--n", "4", "--dtypes", "bfloat16", "--tag",
         "t", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp_path.glob("*.json"))


def test_ghost_launches_counts_a_narrow_architecture(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ghost_launches.py"), "--models", "olmo-1b",
         "--tokenizer", str(tiny_llama_dir), "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "ghost_launches_t.json").read_text())
    row = doc["table"][0]
    assert row["layers"] == 16 and row["ghost ops"] > row["floor ops"] > 0
    assert row["host syncs ghost − floor"] >= 0 and doc["commit"]


@pytest.mark.parametrize("mode", ["interleaved", "processes"])
def test_score_sequences_ab_runs_both_sides_in_turn(tiny_llama_dir, tmp_path, mode):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the earlier side is a git worktree)")
    args = (["--model", str(tiny_llama_dir), "--repeats", "2"] if mode == "interleaved" else
            ["--", "--config", str(tiny_llama_dir), "--device", "cpu", "--repeats", "1",
             "--warmups", "0", "--threads", "1"])
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences_ab.py"), "--before", "HEAD",
         "--rounds", "2", "--batch-sizes", "2", "--mode", mode, "--tag", "t", "--out",
         str(tmp_path), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "score_sequences_ab_t.json").read_text())
    assert [(r["side"], r["round"]) for r in doc["runs"]] == [
        ("before", 1), ("after", 1), ("before", 2), ("after", 2)]
    assert all(r["ghost/floor"]["2"] > 0 for r in doc["runs"])
    if mode == "interleaved":  # each side ran its own src/: the worktree's, then this one's
        srcs = [r["rows"][0]["src"] for r in doc["runs"]]
        assert "isouq-ab-" in srcs[0] and srcs[1] == str(ROOT / "src" / "isouq" / "__init__.py")
        assert all(len(r["rows"][0]["times"]["ghost"]) == 2 for r in doc["runs"])
    (row,) = doc["summary"]
    assert row["batch"] == 2 and row["before median"] > 0 and row["after median"] > 0
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                               text=True).stdout
    assert "isouq-ab-" not in worktrees  # the temporary worktree is removed


def test_score_sequences_ab_names_a_bad_revision(tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences_ab.py"), "--before",
         "no-such-rev", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
        cwd=ROOT)
    assert res.returncode == 2 and "--before no-such-rev: not a commit" in res.stderr
