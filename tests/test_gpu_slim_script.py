"""scripts/gpu_slim.sh: results/ leaves what travels to a GPU machine (untracked and ignored,
its files untouched on disk) and is tracked again as committed; refused while results/ holds
changes git does not have."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A repository with the script, a source file and 3 MiB of results."""
    r = tmp_path / "repo"
    (r / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_slim.sh", r / "scripts")
    (r / "src.py").write_text("x = 1\n")
    (r / "results").mkdir()
    (r / "results" / "big.bin").write_bytes(b"\0" * 3 * 2**20)
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    return r


def _slim(repo: Path, verb: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / "gpu_slim.sh"), verb],
                          capture_output=True, text=True)


def test_results_leave_what_travels_and_come_back(repo):
    before = _slim(repo, "size")
    assert before.returncode == 0 and before.stdout.startswith("3.0 MiB")
    on = _slim(repo, "on")
    assert on.returncode == 0, on.stderr
    assert on.stdout.startswith("0.0 MiB")
    assert (repo / "results" / "big.bin").stat().st_size == 3 * 2**20  # untouched on disk
    assert "results/big.bin" not in _git(repo, "ls-files")
    assert "results" not in _git(repo, "ls-files", "--others", "--exclude-standard")
    (repo / "results" / "written_meanwhile.json").write_text("{}")  # a background run
    off = _slim(repo, "off")
    assert off.returncode == 0 and off.stdout.startswith("3.0 MiB")
    assert "results/big.bin" in _git(repo, "ls-files")
    assert _git(repo, "status", "--porcelain") == "?? results/written_meanwhile.json\n"


def test_refused_while_results_hold_uncommitted_changes(repo):
    (repo / "results" / "new.json").write_text("{}")
    res = _slim(repo, "on")
    assert res.returncode == 2 and "commit them" in res.stderr
    assert (repo / "results" / "new.json").exists()
