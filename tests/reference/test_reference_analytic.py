"""Closed-form Bayesian linear regression: the oracle the samplers are tested against."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import isouq.study.reference as R
from isouq.errors import InputError
from isouq.models import toy as tm


def _data(n=30, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0][:d], dtype=torch.float64) + 0.5 + 0.3 * torch.randn(
        n, generator=g, dtype=torch.float64)
    return X, y


def test_posterior_is_ridge_and_covariance_inverse_precision():
    X, y = _data()
    lam, sigma = 2.0, 0.3
    Phi = R.linear_features(X)
    mean, cov = R.blr_posterior(Phi, y, lam, sigma)
    A = Phi.T @ Phi + lam * sigma**2 * torch.eye(3, dtype=torch.float64)
    assert torch.allclose(mean, torch.linalg.solve(A, Phi.T @ y))
    assert torch.allclose(cov @ (lam * torch.eye(3, dtype=torch.float64) + Phi.T @ Phi / sigma**2),
                          torch.eye(3, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(cov, cov.T)


def test_features_follow_torch_layout():
    X, _ = _data()
    model = tm.build(tm.linear_regression(2)).double()
    theta = torch.tensor(R.flat_params(model))
    assert torch.allclose(R.linear_features(X) @ theta, model(X)[:, 0].detach())


def test_predictive_and_reference():
    X, y = _data(d=1)
    grid = torch.linspace(-3, 3, 7).unsqueeze(1)
    ref = R.linear_regression_reference(X, y, 1.0, 0.3, grid)
    mean, cov = R.blr_posterior(R.linear_features(X), y, 1.0, 0.3)
    phi = R.linear_features(grid)
    assert torch.allclose(ref.epistemic, torch.einsum("gi,ij,gj->g", phi, cov, phi))
    assert torch.allclose(ref.mean, phi @ mean)
    assert int(ref.epistemic.argmin()) == 3  # least uncertain near the data (x ≈ 0)
    assert torch.allclose(ref.aleatoric, torch.full((7,), 0.09, dtype=torch.float64))


def test_mean_field_optimum_diagonal_target_is_exact():
    cov = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))
    m, v = R.mean_field_optimum(torch.zeros(2, dtype=torch.float64), cov)
    assert torch.allclose(v, torch.tensor([1.0, 4.0], dtype=torch.float64))
    corr = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
    _, v = R.mean_field_optimum(torch.zeros(2, dtype=torch.float64), corr)
    np.testing.assert_allclose(v.numpy(), 1 - 0.81)


def test_errors():
    X, y = _data()
    with pytest.raises(InputError):
        R.blr_posterior(R.linear_features(X), y, 0.0, 0.3)
    with pytest.raises(InputError):
        R.blr_posterior(R.linear_features(X), y[:3], 1.0, 0.3)
    with pytest.raises(InputError):
        R.linear_features(torch.zeros(3))
