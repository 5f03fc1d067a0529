"""scripts/check_repo_size.py on scratch repositories: a tracked file over 2 MB outside the
allow-list, an allowed file over its cap, and tracked results/ over budget each fail it; what is
not tracked (an ignored cache, an untracked file) does not count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import by_path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_repo_size.py"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def _module():
    return by_path.module(SCRIPT)


def _check(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), *args],
                          capture_output=True, text=True)


def _write(repo: Path, rel: str, n_bytes: int) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(n_bytes))


def _git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _write(r, "src/a.py", 1_000)
    _write(r, "results/x/rows.jsonl", 300_000)
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "small")
    return r


def test_a_small_tree_passes_and_sizes_are_the_files_bytes(repo):
    got = _check(repo)
    assert got.returncode == 0, got.stderr
    assert "2 tracked files" in got.stdout and "results/ 0.3 of" in got.stdout
    sizes = _module().tracked_sizes(repo)
    assert sizes == {p: (repo / p).stat().st_size for p in ("src/a.py", "results/x/rows.jsonl")}


def test_a_committed_file_over_2_mb_fails_until_it_leaves_the_index(repo):
    _write(repo, "results/scaling/compact_checkpoints/hmc_w1028/sampler.npz", 2_100_000)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a checkpoint")
    got = _check(repo)
    assert got.returncode == 1
    assert ("results/scaling/compact_checkpoints/hmc_w1028/sampler.npz: 2.10 MB > 2 MB, not on "
            "the allow-list") in got.stderr
    # the fix: the file stays on disk as a git-ignored cache
    (repo / ".gitignore").write_text("/results/scaling/compact_checkpoints/\n")
    _git(repo, "rm", "-r", "-q", "--cached", "results/scaling/compact_checkpoints")
    _git(repo, "add", ".gitignore")
    assert _check(repo).returncode == 0
    assert (repo / "results/scaling/compact_checkpoints/hmc_w1028/sampler.npz").is_file()


def test_a_staged_file_counts_an_untracked_one_does_not(repo):
    _write(repo, "report.html", 2_500_000)
    assert _check(repo).returncode == 0  # untracked
    _git(repo, "add", "report.html")
    got = _check(repo)
    assert got.returncode == 1 and "report.html: 2.50 MB > 2 MB" in got.stderr


def test_the_allow_list_and_its_caps(repo):
    mod = _module()
    path, cap = next(iter(mod.ALLOWED.items()))
    assert cap > mod.MAX_FILE_MB
    assert mod.problems({path: int(mod.MAX_FILE_MB * mod.MB) + 1}) == []
    over = mod.problems({path: int(cap * mod.MB) + 1})
    assert len(over) == 1 and "over its cap on the allow-list" in over[0]
    assert mod.problems({"elsewhere/" + path: int(mod.MAX_FILE_MB * mod.MB) + 1})
    assert mod.problems({"a.bin": int(mod.MAX_FILE_MB * mod.MB)}) == []  # at the limit: fine


def test_results_over_budget_fails_and_only_results_counts(repo):
    for i in range(4):
        _write(repo, f"results/y/part{i}.jsonl", 400_000)
        _write(repo, f"data/part{i}.bin", 400_000)
    _git(repo, "add", ".")
    assert _check(repo, "--results-budget-mb", "2").returncode == 0  # 1.9 MB under results/
    _write(repo, "results/y/part4.jsonl", 400_000)
    _git(repo, "add", ".")
    got = _check(repo, "--results-budget-mb", "2")
    assert got.returncode == 1
    assert "results/: 2.3 MB tracked > the budget of 2 MB" in got.stderr


def test_not_a_repository_is_one_line(tmp_path):
    got = _check(tmp_path)
    assert got.returncode == 2
    assert got.stderr.count("\n") == 1 and "is not a git work tree" in got.stderr
