"""scripts/quiet.sh: the background runs are stopped while a command runs, continued after it
(also when it fails), and each stop is logged for the LM-Polygraph benchmark's costs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("pgrep") is None,
                                reason="needs Linux and pgrep")


@pytest.fixture
def background(tmp_path):
    """A stand-in background run, in its own process group as `setsid nohup bash scripts/…` starts
    one, under a name no real run has."""
    name = f"fake_run_{os.getpid()}.sh"
    script = tmp_path / "scripts" / name
    script.parent.mkdir()
    script.write_text("while true; do sleep 0.1; done\n")
    proc = subprocess.Popen(["bash", str(script)], start_new_session=True)
    time.sleep(0.3)
    yield name, proc
    proc.kill()
    proc.wait()


def _state(pid: int) -> str:
    return subprocess.run(["ps", "-o", "stat=", str(pid)], capture_output=True,
                          text=True).stdout.strip()


def _quiet(name: str, log: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUIET_NAMES": name, "PAUSES": str(log)}
    return subprocess.run(["bash", str(ROOT / "scripts/quiet.sh"), *cmd], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_run_is_stopped_while_the_command_runs_then_continued_and_the_stop_logged(
        background, tmp_path):
    name, proc = background
    log = tmp_path / "pauses.log"
    assert f"{name}: running" in _quiet(name, log, "status").stdout
    r = _quiet(name, log, "run", "ps", "-o", "stat=", str(proc.pid))
    assert r.returncode == 0 and r.stdout.strip().startswith("T"), r  # stopped meanwhile
    assert not _state(proc.pid).startswith("T")  # going on again
    start, end = (int(x) for x in log.read_text().split())
    assert 0 <= end - start < 60


def test_a_failing_command_still_continues_the_run(background, tmp_path):
    name, proc = background
    r = _quiet(name, tmp_path / "pauses.log", "run", "false")
    assert r.returncode != 0 and not _state(proc.pid).startswith("T")
    assert len((tmp_path / "pauses.log").read_text().splitlines()) == 1
