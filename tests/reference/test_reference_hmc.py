"""HMC reference: the sampler path against the analytic posterior, seeds, shapes, diagnostics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import isouq.study.reference as R
from isouq.data.synthetic import make_problem
from isouq.errors import InputError, MemoryBudgetError
from isouq.models import toy as tm
from isouq.study.reference.predictive import ess_per_param


def _blr_data(n: int = 40, seed: int = 0):
    """2D-input linear regression (3 parameters, correlated posterior)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) @ np.array([[1.0, 0.6], [0.0, 0.8]]) + 0.5
    y = X @ np.array([0.7, -0.4]) + 0.2 + 0.5 * rng.normal(size=n)
    grid = rng.uniform(-3, 3, size=(30, 2))
    return torch.tensor(X), torch.tensor(y), torch.tensor(grid)


@pytest.mark.parametrize("kernel", ["hmc", pytest.param("nuts", marks=pytest.mark.slow)])
def test_hmc_matches_analytic_blr_within_mc_error(kernel):
    X, y, grid = _blr_data()
    lam, sigma = 2.0, 0.5
    ref = R.hmc_reference((X, y), tm.linear_regression(2), "regression", lam, grid,
                          noise_std=sigma, num_warmup=400, num_samples=1500, num_chains=2,
                          seed=1, kernel=kernel, keep_samples=True)
    mean, cov = R.blr_posterior(R.linear_features(X), y, lam, sigma)
    mean, cov = mean.numpy(), cov.numpy()
    draws = ref.samples.numpy().reshape(2, 1500, 3)
    ess = ess_per_param(draws)
    assert ess.min() > 300, ess
    sd = np.sqrt(np.diag(cov))
    z_mean = (ref.param_mean.numpy() - mean) / (sd / np.sqrt(ess))
    assert np.abs(z_mean).max() < 4.0, z_mean
    cov_hat = np.cov(draws.reshape(-1, 3).T)
    se_cov = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / ess.min())
    z_cov = (cov_hat - cov) / se_cov
    assert np.abs(z_cov).max() < 4.0, z_cov
    # predictive variance of f(x) on the grid = φᵀSφ within its Monte-Carlo error
    _, f_var = R.blr_predictive(R.linear_features(grid), torch.tensor(mean), torch.tensor(cov))
    rel = ref.epistemic.numpy() / f_var.numpy() - 1
    assert np.abs(rel).max() < 4.0 * np.sqrt(2.0 / ref.diagnostics["ess_min"]), rel
    assert np.allclose(ref.aleatoric.numpy(), sigma**2)
    d = ref.diagnostics
    assert d["r_hat_max"] < 1.02 and d["divergences"] == 0 and d["warnings"] == []
    assert 0.5 < d["accept_prob"] <= 1.0 and len(d["step_size"]) == 2


@pytest.fixture(scope="module")
def tiny_binary():
    p = make_problem("binary_xor", n_train=30, grid_n=4)
    spec = tm.mlp2(2, 3, 1)
    kw = dict(num_warmup=40, num_samples=40, num_chains=2, keep_samples=True)
    return p, spec, [R.hmc_reference(p, spec, seed=0, **kw) for _ in range(2)]


def test_seeds_reproducible(tiny_binary):
    _, _, (a, b) = tiny_binary
    assert torch.equal(a.samples, b.samples) and torch.equal(a.epistemic, b.epistemic)
    assert not torch.equal(a.samples[:40], a.samples[40:])  # chains have their own keys


def test_binary_shapes_and_predictive_from_samples(tiny_binary):
    p, spec, (ref, _) = tiny_binary
    G = p.grid.shape[0]
    assert ref.epistemic.shape == ref.aleatoric.shape == ref.mean.shape == (G, 2)
    assert ref.epistemic.dtype == torch.float64
    assert torch.allclose(ref.epistemic[:, 0], ref.epistemic[:, 1])
    assert torch.allclose(ref.mean.sum(1), torch.ones(G, dtype=torch.float64))
    assert (ref.aleatoric <= 0.25).all() and (ref.epistemic >= 0).all()
    assert ref.samples.shape == (80, spec.n_params) and ref.param_mean.shape == (spec.n_params,)
    # the JAX predictive agrees with the torch model evaluated at every draw
    model = tm.build(spec).double()
    p1 = []
    for theta in ref.samples:
        R.load_into(model, theta)
        with torch.no_grad():
            p1.append(torch.sigmoid(model(p.grid.double())[:, 0]))
    p1 = torch.stack(p1)
    assert torch.allclose(ref.epistemic[:, 1], p1.var(0, unbiased=False), atol=1e-12)
    assert torch.allclose(ref.aleatoric[:, 1], (p1 * (1 - p1)).mean(0), atol=1e-12)
    for key in ("r_hat_max", "r_hat_median", "ess_min", "ess_median", "step_size",
                "accept_prob", "seconds", "param_r_hat_max"):
        assert key in ref.diagnostics
    model.load_state_dict(ref.state_dict(torch.float64))


def test_multiclass_shapes():
    p = make_problem("multiclass_clusters", n_train=40, grid_n=3, n_classes=3)
    spec = tm.softmax_regression(2, 3)
    ref = R.hmc_reference(p, spec, num_warmup=30, num_samples=30, num_chains=2, seed=0,
                          init=torch.zeros(spec.n_params), init_jitter=0.1)
    assert ref.epistemic.shape == (9, 3) and ref.mean.shape == (9, 3)
    assert torch.allclose(ref.mean.sum(1), torch.ones(9, dtype=torch.float64))
    assert ref.settings["init"] == "given"


def test_input_errors():
    p = make_problem("binary_xor", n_train=20, grid_n=3)
    with pytest.raises(InputError, match="ONE logit"):
        R.hmc_reference(p, tm.mlp2(2, 3, 2), num_warmup=1, num_samples=1)
    with pytest.raises(InputError, match="task"):
        R.hmc_reference((p.X, p.y), tm.mlp2(2, 3, 1), grid=p.grid)
    with pytest.raises(MemoryBudgetError, match="thinning"):
        R.hmc_reference(p, tm.mlp2(2, 3, 1), num_samples=10_000, memory_budget_bytes=1000)
    with pytest.raises(InputError, match="init"):
        R.hmc_reference(p, tm.mlp2(2, 3, 1), init=torch.zeros(5), num_samples=4)
