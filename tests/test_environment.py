"""isouq's environment variables are read where their value is used, never at import; nothing
changes the process's environment on import (``XLA_FLAGS`` included)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from isouq.errors import InputError
from isouq.ghost import factors
from isouq.per_example import DEFAULT_CHUNK_BYTES, chunk_size_for
from isouq.runtime import env_int


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, with ``env`` over this one's (None: unset)."""
    import os

    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=full)


def test_env_int_reads_now_and_names_a_bad_value(monkeypatch):
    monkeypatch.delenv("ISOUQ_TEST_VALUE", raising=False)
    assert env_int("ISOUQ_TEST_VALUE", 7) == 7
    monkeypatch.setenv("ISOUQ_TEST_VALUE", " 12 ")
    assert env_int("ISOUQ_TEST_VALUE", 7) == 12
    monkeypatch.setenv("ISOUQ_TEST_VALUE", "")
    assert env_int("ISOUQ_TEST_VALUE", 7) == 7
    for bad, low in (("many", None), ("1.5", None), ("0", 1)):
        monkeypatch.setenv("ISOUQ_TEST_VALUE", bad)
        with pytest.raises(InputError, match=f"ISOUQ_TEST_VALUE='{bad}' is not a whole number"):
            env_int("ISOUQ_TEST_VALUE", 7, low=low)


def test_ghost_settings_follow_the_environment_after_import(monkeypatch):
    for name in factors.SETTINGS:
        monkeypatch.delenv(factors.SETTINGS[name][0], raising=False)
    assert (factors.MATERIALIZE_BYTES, factors.GRAM_BLOCKS, factors.TOKEN_MULTIPLE) == (
        256 * 2**20, 1, 8)
    monkeypatch.setenv("ISOUQ_TOKEN_MULTIPLE", "16")
    assert factors.TOKEN_MULTIPLE == 16 and factors.token_multiple("cuda") == 16
    assert factors.token_multiple("cpu") == 1
    monkeypatch.setenv("ISOUQ_TOKEN_MULTIPLE", "0")  # as before: at least 1, no padding
    assert factors.token_multiple("cuda") == 1
    monkeypatch.setenv("ISOUQ_GHOST_GRAM_BLOCKS", "3")
    assert factors.GRAM_BLOCKS == 3
    # a 4 × 4 block over 200 positions: the Gram form is dearer, so it is materialized ...
    positions = [(200, False)]
    assert not factors.gram_is_cheaper(4, 4, 4, positions, elem_bytes=4)
    # ... unless the (N, a, b) block is over the cap the environment sets now
    monkeypatch.setenv("ISOUQ_GHOST_MATERIALIZE_BYTES", str(4 * 4 * 4 * 4 - 1))
    assert factors.gram_is_cheaper(4, 4, 4, positions, elem_bytes=4)


def test_an_assigned_ghost_setting_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("ISOUQ_GHOST_GRAM_BLOCKS", "2")
    monkeypatch.setattr(factors, "GRAM_BLOCKS", 5)
    assert factors.GRAM_BLOCKS == 5 and factors.setting("GRAM_BLOCKS") == 5


def test_chunk_budget_follows_the_environment(monkeypatch):
    monkeypatch.delenv("ISOUQ_CHUNK_BYTES", raising=False)
    assert chunk_size_for(1000) == DEFAULT_CHUNK_BYTES // 12000
    monkeypatch.setenv("ISOUQ_CHUNK_BYTES", str(120_000))
    assert chunk_size_for(1000) == 10 and chunk_size_for(1000, budget_bytes=24_000) == 2


def test_bad_values_do_not_break_import_and_are_named_at_use():
    r = run_python("""
import isouq.ghost.factors as f, isouq.per_example as pe
from isouq.errors import InputError
for get in (lambda: f.TOKEN_MULTIPLE, lambda: pe.chunk_size_for(10)):
    try:
        get()
    except InputError as e:
        print(e)
""", {"ISOUQ_TOKEN_MULTIPLE": "eight", "ISOUQ_CHUNK_BYTES": "lots"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ISOUQ_TOKEN_MULTIPLE='eight'" in r.stdout and "ISOUQ_CHUNK_BYTES='lots'" in r.stdout


def test_importing_the_references_sets_no_xla_flags_and_prepare_jax_gives_the_devices():
    pytest.importorskip("numpyro")
    r = run_python("""
import os
import isouq.study.reference as R
assert "XLA_FLAGS" not in os.environ, os.environ["XLA_FLAGS"]
import jax
print(R.prepare_jax(), jax.local_device_count(), R.prepare_jax(5))
print(jax.numpy.ones(1).dtype)
""", {"ISOUQ_JAX_HOST_DEVICES": "3", "XLA_FLAGS": None})
    assert r.returncode == 0, r.stderr[-3000:]
    # three devices as asked; asked again once JAX runs, nothing changes
    assert r.stdout.split() == ["3", "3", "3", "float64"], r.stdout
