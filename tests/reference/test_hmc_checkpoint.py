"""Checkpointed HMC: an interrupted and resumed run gives exactly the uninterrupted run's draws."""

from __future__ import annotations

import json

import numpy as np
import pytest

import isouq.study.reference as R
from isouq.data.synthetic import make_problem
from isouq.errors import InputError
from isouq.models import toy as tm
from isouq.study.reference import hmc as hmc_mod
from isouq.study.reference.checkpoint import (
    copy_checkpoint,
    kept_indices,
    progress_summary,
    read_meta,
    segments,
)

# 2 warmup + 3 sampling segments of 7 iterations (one compiled length), thinning 4 (21 % 4 = 1)
KW = dict(num_warmup=14, num_samples=21, num_chains=2, seed=3, thinning=4, keep_samples=True,
          checkpoint_every=7)


@pytest.fixture(scope="module")
def problem():
    return make_problem("binary_xor", n_train=30, grid_n=4), tm.mlp2(2, 3, 1)


@pytest.fixture(scope="module")
def uninterrupted(problem, tmp_path_factory):
    p, spec = problem
    return R.hmc_reference(p, spec, checkpoint=tmp_path_factory.mktemp("full") / "ck", **KW)


def _interrupt_at(monkeypatch, call: int):
    """Make the ``call``-th segment of the next run raise, as a kill would."""
    real, n = hmc_mod._run_segment, {"calls": 0}

    def run_segment(*a, **k):
        n["calls"] += 1
        if n["calls"] == call:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(hmc_mod, "_run_segment", run_segment)


def _same(a, b):
    assert np.array_equal(a.samples.numpy(), b.samples.numpy())
    assert np.array_equal(a.epistemic.numpy(), b.epistemic.numpy())
    for k in ("divergences", "accept_prob", "num_steps_mean", "step_size", "leapfrog_steps"):
        assert a.diagnostics[k] == b.diagnostics[k], k


@pytest.mark.parametrize("call", [pytest.param(2, marks=pytest.mark.slow), 3,
                                  pytest.param(5, marks=pytest.mark.slow)])
# interrupted in warmup, in the first sampling segment, in the last one
def test_interrupted_and_resumed_run_gives_exactly_the_same_draws(problem, uninterrupted,
                                                                   tmp_path, monkeypatch, call):
    p, spec = problem
    ck = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, call)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    assert read_meta(ck)["done"] == segments(14, 21, 7)[call - 2][1]
    status = progress_summary(read_meta(ck))
    assert status["done"] == read_meta(ck)["done"] and status["total"] == 35
    assert status["leapfrog_steps"] == sum(s["leapfrog_steps"] for s in read_meta(ck)["log"]) > 0
    assert status["eta_seconds"] == pytest.approx(
        status["seconds_per_iteration"] * (35 - status["done"]))
    resumed = R.hmc_reference(p, spec, checkpoint=ck, **KW)
    assert resumed.diagnostics["resumed_at"] == read_meta(ck)["log"][call - 2]["stop"]
    _same(uninterrupted, resumed)
    assert resumed.samples.shape == (2 * (21 // 4), spec.n_params)
    again = R.hmc_reference(p, spec, checkpoint=ck, **KW)  # finished: read back, no sampling
    assert again.diagnostics["resumed_at"] == 35
    _same(uninterrupted, again)


@pytest.mark.slow
def test_a_copied_checkpoint_resumes_like_the_original(problem, uninterrupted, tmp_path,
                                                         monkeypatch):
    p, spec = problem
    ck = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, 4)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    n = copy_checkpoint(ck, tmp_path / "copy")
    assert n == sum(f.stat().st_size for f in (tmp_path / "copy").iterdir())
    _same(uninterrupted, R.hmc_reference(p, spec, checkpoint=tmp_path / "copy", **KW))


@pytest.mark.slow
def test_kill_between_part_and_meta_resumes_from_previous_commit(problem, uninterrupted,
                                                                   tmp_path, monkeypatch):
    """A run killed after writing a part file but before the meta: the stray part is dropped."""
    p, spec = problem
    ck = tmp_path / "ck"
    real, n = hmc_mod.Checkpoint.save, {"calls": 0}

    def save(self, prog, state, part, first, log):
        n["calls"] += 1
        if n["calls"] == 4:  # the second sampling segment: part written, then killed
            np.savez(self.path / f"part_{first:07d}.npz", draws=np.zeros(1))
            raise KeyboardInterrupt
        return real(self, prog, state, part, first, log)

    with monkeypatch.context() as m:
        m.setattr(hmc_mod.Checkpoint, "save", save)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    assert len(read_meta(ck)["parts"]) == 1
    _same(uninterrupted, R.hmc_reference(p, spec, checkpoint=ck, **KW))
    assert sorted(f.name for f in ck.glob("part_*")) == read_meta(ck)["parts"]


@pytest.mark.slow
def test_segment_length_does_not_change_the_draws(problem, uninterrupted):
    """One segment per phase (no checkpoint) and 7-iteration segments: the same draws."""
    p, spec = problem
    kw = {k: v for k, v in KW.items() if k != "checkpoint_every"}
    _same(uninterrupted, R.hmc_reference(p, spec, **kw))


@pytest.mark.slow
def test_thinning_keeps_what_numpyro_mcmc_keeps(problem):
    """Kept draws = NumPyro MCMC(thinning=3) of the same chain (one segment per phase)."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import HMC, MCMC, init_to_sample

    from isouq.study.reference.model import bnn_model

    p, spec = problem
    X, y = jnp.asarray(p.X.numpy(), jnp.float64), jnp.asarray(p.y.numpy())
    ref = R.hmc_reference(p, spec, num_warmup=20, num_samples=23, num_chains=1, seed=3,
                          thinning=3, keep_samples=True)
    k = HMC(bnn_model(spec, "binary", 1.0), trajectory_length=1.0, init_strategy=init_to_sample)
    mcmc = MCMC(k, num_warmup=20, num_samples=23, num_chains=1, thinning=3, progress_bar=False)
    mcmc.run(jax.random.split(jax.random.PRNGKey(3), 1)[0], X, y)
    want = np.asarray(mcmc.get_samples()["theta"])
    assert want.shape == ref.samples.shape == (7, spec.n_params)
    np.testing.assert_allclose(ref.samples.numpy(), want, rtol=0, atol=1e-6)


def test_kept_indices_match_a_whole_run():
    S, thin = 23, 3
    whole = kept_indices(0, S, S, thin)
    pieces = np.concatenate([a + kept_indices(a, b, S, thin)
                             for a, b in [(0, 7), (7, 14), (14, 21), (21, 23)]])
    assert np.array_equal(whole, pieces)
    assert np.array_equal(whole, np.arange(S)[S % thin :][thin - 1 :: thin])  # NumPyro's rule
    assert segments(5, 4, 3) == [(0, 3), (3, 5), (5, 8), (8, 9)]


def test_checkpoint_with_other_settings_is_refused(problem, tmp_path, monkeypatch):
    p, spec = problem
    ck = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, 2)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    with pytest.raises(InputError, match="other settings.*seed"):
        R.hmc_reference(p, spec, checkpoint=ck, **{**KW, "seed": 4})
    p2 = make_problem("binary_xor", n_train=30, grid_n=4, seed=1)
    with pytest.raises(InputError, match="data"):
        R.hmc_reference(p2, spec, checkpoint=ck, **KW)
    meta = json.loads((ck / "meta.json").read_text())
    assert meta["fingerprint"]["seed"] == 3 and meta["every"] == 7
