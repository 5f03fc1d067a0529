"""Compact HMC checkpoints: running sums instead of draws, small enough for git.

- the running sums give the numbers the stored-draws path computes from the same draws;
- a run cut, carried to a "new machine" (a clone holding only the committed files) and resumed
  there gives exactly the uninterrupted run's numbers;
- the checkpoint of MLP(1028,1028), the size it is for, fits 50 MB compressed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

import isouq.study.reference as R
from isouq.data.synthetic import make_problem
from isouq.errors import InputError
from isouq.models import toy as tm
from isouq.study.reference import hmc as hmc_mod
from isouq.study.reference.checkpoint import (
    Checkpoint,
    Progress,
    RunningPredictive,
    pack_lossless,
    read_meta,
    segments,
)
from isouq.study.reference.predictive import predictive_moments

# warmup 30: windows [0,3] [4,26] [27,29], so segments of 7 cut the middle (Welford) window;
# sampling 21 thinned by 2: 10 kept draws a chain, every lag within ess_max_lag
KW = dict(num_warmup=30, num_samples=21, num_chains=2, seed=3, thinning=2, checkpoint_every=7,
          compact=True)
SEGMENTS = segments(30, 21, 7)  # (0,7) (7,14) (14,21) (21,28) (28,30) (30,37) (37,44) (44,51)
DIAG = ("r_hat_max", "r_hat_median", "r_hat_q95", "r_hat_min", "ess_max", "ess_median",
        "ess_q95", "ess_min", "ess_truncated", "r_hat_n_nan", "ess_n_nan", "accept_prob",
        "divergences", "num_steps_mean", "step_size", "leapfrog_steps", "n_draws")


@pytest.fixture(scope="module")
def problem():
    return make_problem("binary_xor", n_train=30, grid_n=4), tm.mlp2(2, 3, 1)


@pytest.fixture(scope="module")
def uninterrupted(problem, tmp_path_factory):
    """A whole compact run, with the kept draws and per-iteration fields it summed recorded."""
    p, spec = problem
    seen = {"kept": [], "extra": []}
    real = hmc_mod._Online.update

    def update(self, kept, extra):
        seen["kept"].append(kept.copy())
        seen["extra"].append({k: v.copy() for k, v in extra.items()})
        return real(self, kept, extra)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(hmc_mod._Online, "update", update)
        ref = R.hmc_reference(p, spec, checkpoint=tmp_path_factory.mktemp("full") / "ck", **KW)
    return ref, seen


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
    for k in ("mean", "epistemic", "aleatoric"):
        assert np.array_equal(getattr(a, k).numpy(), getattr(b, k).numpy()), k
    for k in DIAG:
        assert a.diagnostics[k] == b.diagnostics[k], k


def _ar_draws(K=2, N=37, shape=(5, 3), seed=0):
    """AR(1) chains per point (coefficients −0.3 … 0.9), squashed into (0, 1)."""
    rng = np.random.default_rng(seed)
    phi = rng.uniform(-0.3, 0.9, size=shape)
    x, e = np.zeros((K, N, *shape)), rng.standard_normal((K, N, *shape))
    for t in range(N):
        x[:, t] = (phi * x[:, t - 1] if t else 0.0) + e[:, t]
    return 1.0 / (1.0 + np.exp(-x - 2.0))


@pytest.mark.parametrize("max_lag", [64, 5])
def test_running_sums_equal_numpyro_on_the_same_draws(max_lag):
    q = _ar_draws()
    K, N = q.shape[:2]
    rp = RunningPredictive(K, N, q.shape[2:], max_lag=max_lag)
    for a, b in [(0, 3), (3, 4), (4, 4), (4, 20), (20, 37)]:  # segments, one empty
        rp.update(q[:, a:b])
        rp = RunningPredictive.from_arrays(rp.to_arrays(), K, N, q.shape[2:], max_lag)
    mean, var, alea, diag = rp.finalize("multiclass")
    flat = q.reshape(K * N, *q.shape[2:])
    np.testing.assert_allclose(mean, flat.mean(0), rtol=1e-13)
    np.testing.assert_allclose(var, flat.var(0), rtol=1e-12)
    np.testing.assert_allclose(alea, (flat * (1 - flat)).mean(0), rtol=1e-13)
    np.testing.assert_allclose(rp.split_r_hat().reshape(q.shape[2:]), split_gelman_rubin(q),
                               rtol=1e-12)
    ess, truncated = (x.reshape(q.shape[2:]) for x in rp.ess())
    want = np.asarray(effective_sample_size(q))
    np.testing.assert_allclose(ess[~truncated], want[~truncated], rtol=1e-10)
    assert (ess[truncated] >= want[truncated] * (1 - 1e-12)).all()  # an upper bound there
    assert diag["ess_truncated"] == truncated.sum() and (truncated.any() == (max_lag == 5))


def test_running_sums_refuse_other_sizes_and_extra_draws():
    rp = RunningPredictive(2, 4, (3,))
    with pytest.raises(InputError, match="other sizes"):
        RunningPredictive.from_arrays(rp.to_arrays(), 2, 5, (3,))
    rp.update(np.full((2, 4, 3), 0.5))
    with pytest.raises(InputError, match="more than the 4 draws"):
        rp.update(np.full((2, 1, 3), 0.5))


def test_pack_lossless_halves_only_exact_float32_values():
    exact = np.array([0.0, 1.0, -2.5, np.float32(0.1)], dtype=np.float64)
    assert pack_lossless(exact).dtype == np.float32
    assert np.array_equal(pack_lossless(exact).astype(np.float64), exact)
    assert pack_lossless(np.array([0.1])).dtype == np.float64
    assert pack_lossless(np.arange(3)).dtype == np.arange(3).dtype


def test_compact_numbers_equal_the_stored_draws_path(problem, uninterrupted):
    """mean, Var, E[p(1 − p)], R-hat and ESS from the running sums = predictive_moments on the
    draws the run summed; per-iteration summaries = those of the stored fields."""
    p, spec = problem
    ref, seen = uninterrupted
    draws = np.concatenate(seen["kept"], axis=1)
    assert draws.shape == (2, 21 // 2, spec.n_params)
    mean, epi, alea, diag = predictive_moments(draws, p.grid.numpy(), spec, "binary")
    np.testing.assert_allclose(ref.mean.numpy(), mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ref.epistemic.numpy(), epi, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(ref.aleatoric.numpy(), alea, rtol=1e-12, atol=1e-15)
    d = ref.diagnostics
    for k in ("r_hat_max", "r_hat_median", "r_hat_q95", "r_hat_min", "ess_max", "ess_median",
              "ess_q95", "ess_min"):
        assert d[k] == pytest.approx(diag[k], rel=1e-9), k
    assert d["ess_truncated"] == 0 and d["n_draws"] == diag["n_draws"] == 20
    extra = {k: np.concatenate([e[k] for e in seen["extra"]], axis=1)
             for k in hmc_mod.EXTRA_FIELDS}
    assert extra["accept_prob"].shape == (2, 21)
    assert d["accept_prob"] == pytest.approx(extra["accept_prob"].mean(), rel=1e-12)
    assert d["num_steps_mean"] == pytest.approx(extra["num_steps"].mean(), rel=1e-12)
    assert d["divergences"] == extra["diverging"].sum()
    assert d["step_size"] == [hmc_mod._effective_step(float(s[-1]), "hmc", 1.0)
                              for s in extra["adapt_state.step_size"]]
    assert ref.samples is None and np.isnan(ref.param_mean.numpy()).all()
    assert d["checkpoint"] == "compact" and ref.settings["compact"] is True


def _clone_committed(ck, tmp_path):
    """The checkpoint as a new machine gets it: commit it in a git repository, clone that."""
    repo, clone = tmp_path / "repo", tmp_path / "clone"
    shutil.copytree(ck, repo / "ck")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "ck"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "ck"], check=True)
    subprocess.run([*git, "clone", "-q", str(repo), str(clone)], check=True)
    shutil.rmtree(repo)
    shutil.rmtree(ck)  # the old machine is gone
    return clone / "ck"


@pytest.mark.parametrize("call", [3, pytest.param(7, marks=pytest.mark.slow)])
# cut in the middle warmup window (its Welford sums in the checkpoint), and in sampling
def test_compact_run_resumed_on_a_new_machine_gives_the_uninterrupted_result(
        problem, uninterrupted, tmp_path, monkeypatch, call):
    p, spec = problem
    ck = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, call)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    meta = read_meta(ck)
    assert meta["layout"] == "compact" and meta["done"] == SEGMENTS[call - 2][1]
    assert meta["parts"] == [] and meta["state"] is None
    assert sorted(f.name for f in ck.iterdir()) == sorted(["meta.json", *meta["files"]])
    # no draws: the stored arrays hold the sampler state and the running sums only
    stored = {}
    for f in meta["files"]:
        with np.load(ck / f) as z:
            stored.update({f"{f}:{k}": z[k] for k in z.files})
    D, C = spec.n_params, 2
    assert all(a.shape == (C, D) for a in stored.values() if D in a.shape)
    assert sum(a.shape == (C, D) for a in stored.values()) == 4  # θ, M⁻¹, Welford mean and M2
    moved = _clone_committed(ck, tmp_path)
    resumed = R.hmc_reference(p, spec, checkpoint=moved, **KW)
    assert resumed.diagnostics["resumed_at"] == meta["done"]
    _same(uninterrupted[0], resumed)
    again = R.hmc_reference(p, spec, checkpoint=moved, **KW)  # finished: read back
    assert again.diagnostics["resumed_at"] == 51
    _same(uninterrupted[0], again)


def test_a_compact_checkpoint_refuses_the_other_layout_and_settings(problem, tmp_path,
                                                                    monkeypatch):
    p, spec = problem
    ck = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, 2)
        with pytest.raises(KeyboardInterrupt):
            R.hmc_reference(p, spec, checkpoint=ck, **KW)
    assert read_meta(ck)["fingerprint"]["layout"] == "compact"
    with pytest.raises(InputError, match="other settings"):
        R.hmc_reference(p, spec, checkpoint=ck, **{**KW, "compact": False})
    with pytest.raises(InputError, match="other settings.*ess_max_lag"):
        R.hmc_reference(p, spec, checkpoint=ck, **{**KW, "ess_max_lag": 4})
    fp = read_meta(ck)["fingerprint"]
    with pytest.raises(InputError, match="'compact' layout"):
        Checkpoint(ck, fp).load()
    with pytest.raises(InputError, match="keeps no draws"):
        R.hmc_reference(p, spec, **{**KW, "keep_samples": True})


def test_a_copy_missing_a_listed_file_is_refused(tmp_path):
    ck = Checkpoint(tmp_path / "ck", {"a": 1}, layout="compact")
    prog = Progress(done=2, total=4, every=2)
    ck.save_compact(prog, {"sampler": {"x": np.arange(3.0)}, "mass": {"m": np.ones(4)}},
                    {"start": 0, "stop": 2, "seconds": 1.0})
    files = read_meta(ck.path)["files"]
    assert [f.split("_")[0] for f in files] == ["sampler", "mass"]
    with np.load(ck.path / files[1]) as z:
        assert z["m"].dtype == np.float32  # ones: stored in 4 bytes
    # an unchanged group keeps its file; a changed one gets a new name, the old one goes
    prog.done = 4
    ck.save_compact(prog, {"sampler": {"x": np.arange(3.0) + 1}, "mass": {"m": np.ones(4)}},
                    {"start": 2, "stop": 4, "seconds": 1.0})
    new = read_meta(ck.path)["files"]
    assert new[1] == files[1] and new[0] != files[0] and not (ck.path / files[0]).exists()
    assert ck.size_bytes() == sum((ck.path / f).stat().st_size for f in [*new, "meta.json"])
    (ck.path / new[0]).unlink()
    with pytest.raises(InputError, match="not there"):
        ck.load()
    assert json.loads((ck.path / "meta.json").read_text())["done"] == 4


@pytest.mark.slow
def test_the_compact_checkpoint_of_mlp_1028_fits_50_mb(tmp_path):
    """The largest state a compact MLP(1028,1028) run writes — a warmup middle window (Welford
    sums full) and, later, sampling (running sums full) — each ≤ 50 MB compressed."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import HMC, init_to_sample

    from isouq.study.experiments.scaling import COMPACT_THINNING, PROBLEM, spec_for_width
    from isouq.study.reference.model import bnn_model

    spec = spec_for_width(1028)
    prob = make_problem(PROBLEM["hmc"], grid_n=50)
    kernel = HMC(bnn_model(spec, "multiclass", 1.0), trajectory_length=1.0,
                 init_strategy=init_to_sample)
    X, y = jnp.asarray(prob.X.numpy()), jnp.asarray(prob.y.numpy())
    state = hmc_mod._initial_state(kernel, jax.random.split(jax.random.PRNGKey(0), 2), 1000,
                                   None, (X, y), 2)
    rng = np.random.default_rng(0)
    groups = hmc_mod.pack_state(state)
    D = spec.n_params
    for g in ("mass", "welford"):  # worst case: every number a distinct float32 value
        for k, a in groups[g].items():
            if a.shape == (2, D):
                groups[g][k] = rng.random((2, D)).astype(np.float32).astype(np.float64)
    online = hmc_mod._Online(spec, "multiclass", prob.grid.numpy(), 2,
                             1000 // COMPACT_THINNING, hmc_mod.ESS_MAX_LAG)
    empty = online.to_arrays()
    for a in online.pred.a.values():
        if a.dtype == np.float64:
            a[...] = rng.random(a.shape)
    zeros = {k: np.zeros_like(v) for k, v in groups["welford"].items()}
    sizes = {}
    for phase, welford, running in (("warmup", groups["welford"], empty),
                                    ("sampling", zeros, online.to_arrays())):
        ck = Checkpoint(tmp_path / phase, {"phase": phase}, layout="compact")
        prog = Progress(done=1, total=2000, every=2)
        ck.save_compact(prog, {**groups, "welford": welford, "running": running},
                        {"start": 0, "stop": 1, "seconds": 1.0})
        sizes[phase] = ck.size_bytes(prog)
    assert max(sizes.values()) <= 50e6, sizes
