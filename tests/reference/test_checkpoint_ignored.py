"""A checkpoint of either layout stays out of git: its first save writes a ``.gitignore`` beside
it (unless one is there), so ``git add .`` in the repository around it takes none of its files."""

from __future__ import annotations

import subprocess

import numpy as np

from isouq.study.reference.checkpoint import Checkpoint, Progress

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def _tracked_after_add_all(repo) -> list[str]:
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    out = subprocess.run([*GIT, "-C", str(repo), "ls-files"], check=True, capture_output=True,
                         text=True).stdout
    return out.split()


def test_a_compact_checkpoint_is_ignored_by_git(tmp_path):
    subprocess.run([*GIT, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "results.json").write_text("{}")
    ck = Checkpoint(tmp_path / "compact_checkpoints" / "hmc_w8", {"a": 1}, layout="compact")
    p = Progress(done=2, total=10, every=2)
    ck.save_compact(p, {"sampler": {"theta": np.arange(6.0)}}, {"start": 0, "stop": 2})
    assert (tmp_path / "compact_checkpoints" / ".gitignore").read_text() == "*\n"
    assert ck.load().files == p.files and len(p.files) == 1
    assert _tracked_after_add_all(tmp_path) == ["results.json"]


def test_a_gitignore_already_there_is_kept(tmp_path):
    parent = tmp_path / "compact_checkpoints"
    parent.mkdir()
    (parent / ".gitignore").write_text("hmc_w*/\n")
    ck = Checkpoint(parent / "hmc_w8", {"a": 1}, layout="compact")
    ck.save_compact(Progress(done=2, total=10, every=2), {"sampler": {"x": np.ones(3)}},
                    {"start": 0, "stop": 2})
    assert (parent / ".gitignore").read_text() == "hmc_w*/\n"
