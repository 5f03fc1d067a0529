"""The wheel works: built with ``python -m build --wheel`` from the files git would ship, it
installs with the ``llm`` extra into a fresh virtual environment (no system site-packages) and
``isouq --help``, ``isouq models`` and ``isouq score`` run from there, away from this checkout.

scripts/wheel_check.sh makes the same check in CI (.ci/run). Slow: a minute or more, most of it
pip installing transformers and the rest into the new environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["pyproject.toml", "README.md", "LICENSE", "src"]

pytestmark = pytest.mark.slow


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode})\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r


def shipped_files() -> list[str]:
    """The tracked and untracked, not ignored, files the wheel is built from."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the files git would ship)")
    out = run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *SHIPPED], cwd=ROOT)
    return [f for f in out.stdout.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python -m build --wheel`` on a copy of the shipped files (no build/ or egg-info of the
    checkout can leak into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    for f in shipped_files():
        (tmp / "src" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp / "src" / f)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp / "dist", tmp / "src"])
    wheels = sorted((tmp / "dist").glob("isouq-*-py3-none-any.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv without system site-packages, the wheel installed with its llm extra."""
    env = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", env])
    cfg = (env / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg, cfg
    run([env / "bin" / "python", "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt",
         f"{wheel}[llm]"])
    return env


def installed_version() -> str:
    import isouq

    return isouq.__version__


def test_the_wheel_holds_the_package(wheel):
    import isouq

    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = {f.removeprefix("src/") for f in shipped_files()
               if f.startswith("src/isouq/") and f.endswith((".py", ".jsonl"))}
    assert tracked <= names, sorted(tracked - names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/"))]
    dist_info = f"isouq-{isouq.__version__}.dist-info"
    assert wheel.name == f"isouq-{isouq.__version__}-py3-none-any.whl"
    assert f"{dist_info}/licenses/LICENSE" in names
    meta = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta
    assert f"Version: {isouq.__version__}" in meta
    assert "Provides-Extra: data" in meta and "Provides-Extra: llm" in meta
    assert "Classifier: License ::" not in meta


def test_the_installed_wheel_runs(venv, tiny_llama_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", "HF_HUB_OFFLINE": "1",
            "ISOUQ_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
            "VIRTUAL_ENV": str(venv)}
    isouq = venv / "bin" / "isouq"
    where = run([venv / "bin" / "python", "-c", "import isouq, importlib.metadata as m; "
                 "print(isouq.__file__); print(isouq.__version__, m.version('isouq'))"],
                cwd=tmp_path, env=env).stdout.split("\n")
    assert Path(where[0]).resolve().is_relative_to(venv.resolve()), where
    # one version: src/isouq/_version.py, read by setuptools at build time
    assert where[1].split() == [installed_version(), installed_version()], where

    assert "score" in run([isouq, "--help"], cwd=tmp_path, env=env).stdout
    assert "smollm2" in run([isouq, "models"], cwd=tmp_path, env=env).stdout

    pairs = tmp_path / "pairs.jsonl"
    rows = [{"id": "q0", "question": "what is the capital of france", "answer": "paris"},
            {"id": "q1", "prompt": [{"role": "user", "content": "who wrote hamlet"}],
             "answer": "shakespeare wrote hamlet"},
            {"id": "q2", "question": "why is the sky blue", "answer": "because the sky is blue"}]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run([isouq, "score", pairs, "--out", tmp_path / "scores.jsonl", "--model", tiny_llama_dir,
         "--batch-size", "2"], cwd=tmp_path, env=env)
    out = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [r["key"] for r in out] == ["q0", "q1", "q2"]
    for r in out:
        assert r["scores"]["epistemic"] > 0 and 0 < r["scores"]["mean_prob"] < 1, r
