"""Bayesian linear regression with a conjugate Gaussian prior: the closed-form posterior.

Model: y = Φ w + ε, ε ~ N(0, σ²), prior w ~ N(0, I/α) (α = prior precision). Posterior
N(m, S) with S = (α I + ΦᵀΦ/σ²)⁻¹ and m = S Φᵀ y / σ². Predictive of f(x) = φ(x)ᵀw:
mean φᵀm, variance φᵀSφ. With φ(x) = [x, 1] (:func:`linear_features`) this is exactly the
posterior of the torch ``linear_regression()`` model (parameters [weight…, bias]) that the
HMC and VI references sample, so it is their test oracle.
"""

from __future__ import annotations

import time

import torch

from ...errors import InputError
from ...models.toy import MLPSpec
from .result import Reference


def linear_features(X: torch.Tensor) -> torch.Tensor:
    """Φ (N, d+1) float64 = [X, 1]: the torch Linear(d, 1) parameter order (weights, bias)."""
    X = torch.as_tensor(X, dtype=torch.float64)
    if X.ndim != 2:
        raise InputError(f"X must be (N, d), got {tuple(X.shape)}")
    return torch.cat([X, torch.ones(X.shape[0], 1, dtype=torch.float64)], dim=1)


def blr_posterior(
    Phi: torch.Tensor, y: torch.Tensor, prior_precision: float, noise_std: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean m (D,) and covariance S (D, D), float64, for features Φ (N, D), y (N,)."""
    if prior_precision <= 0 or noise_std <= 0:
        raise InputError("prior_precision and noise_std must be positive")
    Phi = torch.as_tensor(Phi, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64)
    if Phi.ndim != 2 or y.shape != (Phi.shape[0],):
        raise InputError(f"expected Φ (N, D) and y (N,), got {tuple(Phi.shape)}, {tuple(y.shape)}")
    precision = prior_precision * torch.eye(Phi.shape[1], dtype=torch.float64)
    precision = precision + Phi.T @ Phi / noise_std**2
    L = torch.linalg.cholesky(precision)
    cov = torch.cholesky_inverse(L)
    mean = torch.cholesky_solve((Phi.T @ y / noise_std**2).unsqueeze(1), L).squeeze(1)
    return mean, cov


def blr_predictive(
    Phi_star: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictive mean (G,) and variance (G,) of f = φᵀw at features Φ* (G, D) (no noise)."""
    Phi_star = torch.as_tensor(Phi_star, dtype=torch.float64)
    return Phi_star @ mean, ((Phi_star @ cov) * Phi_star).sum(1)


def mean_field_optimum(mean: torch.Tensor, cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The diagonal Gaussian q minimising KL(q ‖ N(mean, cov)): its mean and variance (D,).

    For a Gaussian target the mean-field optimum has the exact mean and variances 1/Λᵢᵢ,
    Λ = cov⁻¹ (it underestimates the marginal variances cov_ii). The VI reference's oracle.
    """
    return mean.clone(), 1.0 / torch.diagonal(torch.linalg.inv(cov))


def linear_regression_reference(
    X: torch.Tensor,
    y: torch.Tensor,
    prior_precision: float,
    noise_std: float,
    grid: torch.Tensor,
) -> Reference:
    """Exact posterior of f(x) = wᵀx + b on ``grid`` (G, d) as a :class:`Reference`.

    epistemic (G,) = φᵀSφ, aleatoric (G,) = noise_std², mean (G,) = φᵀm; param_mean/std (D,)
    in the torch layout of ``linear_regression(d)``.
    """
    t0 = time.perf_counter()
    X = torch.as_tensor(X, dtype=torch.float64)
    mean, cov = blr_posterior(linear_features(X), y, prior_precision, noise_std)
    f_mean, f_var = blr_predictive(linear_features(grid), mean, cov)
    return Reference(
        method="analytic",
        task="regression",
        epistemic=f_var,
        aleatoric=torch.full_like(f_var, noise_std**2),
        mean=f_mean,
        param_mean=mean,
        param_std=torch.sqrt(torch.diagonal(cov)),
        diagnostics={"seconds": round(time.perf_counter() - t0, 4), "covariance": cov.tolist()},
        settings={"prior_precision": prior_precision, "noise_std": noise_std,
                  "n_train": int(X.shape[0]), "n_eval": int(len(grid))},
        spec=MLPSpec(X.shape[1], (), 1),
    )
