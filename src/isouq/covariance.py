"""Parameter covariances C for the delta-method epistemic term gᵀ C g.

- ``Identity(scale)``: C = σ² I, the paper's isotropic choice; gᵀCg = σ²‖g‖².
- ``Diagonal``: C = diag(h + λ)⁻¹ with h the diagonal of an empirical Fisher or GGN
  estimated on user-given proxy data, λ the prior precision.
- ``Dense``: C = (H + λI)⁻¹, the full Laplace covariance, with H the Hessian, GGN or empirical
  Fisher of the summed negative log-likelihood; applied through a Cholesky solve, never an
  explicit inverse. For small models (or the last layer: ``params="last_layer"``).

Curvature is of the summed NLL Σₙ ℓ(xₙ, yₙ; θ) (the Laplace convention): Bernoulli for one-logit
classifiers, categorical for C ≥ 2 logits, Gaussian with noise σ for regression.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import grad, hessian, vmap

from .errors import CovarianceError, MemoryBudgetError
from .per_example import chunk_size_for, flatten, functional_model, output_jacobians, unflatten

Likelihood = Literal["classification", "regression"]
CurvatureKind = Literal["ggn", "ef", "hessian"]
KINDS = ("identity", "diagonal", "laplace", "last_layer")


@runtime_checkable
class Covariance(Protocol):
    """The one contract of a parameter covariance C, for every scoring function.

    ``name`` says what it is (recorded with the scores); ``quadratic(J)`` maps per-example
    gradients J (..., P) to gᵀCg (...). ``Identity`` (with its ``scale``), ``Diagonal`` and
    ``Dense`` implement it; so may a user's own class.
    """

    name: str

    def quadratic(self, J: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Identity:
    """C = scale · I, the paper's isotropic covariance: gᵀCg = scale · ‖g‖².

    Attributes:
        scale: σ², the prior variance of every parameter (default 1: the score is ‖g‖²).
    """

    scale: float = 1.0
    name: str = field(default="identity", init=False)

    def quadratic(self, J: torch.Tensor) -> torch.Tensor:
        """gᵀCg for every gradient g in ``J``.

        Args:
            J: (..., P) gradients (rows of Jacobians) over the P selected parameters.

        Returns:
            (...) scale · ‖g‖², in the squared units of the differentiated output.
        """
        return self.scale * J.pow(2).sum(-1)


@dataclass
class Diagonal:
    """C = diag(precision + prior_precision)⁻¹, a diagonal Laplace covariance.

    Attributes:
        precision: (P,) diagonal of a curvature (GGN or empirical Fisher) of the summed
            negative log-likelihood, e.g. from :func:`curvature` with ``structure="diag"``.
        prior_precision: λ > 0 added to every entry.

    Raises:
        CovarianceError: if an entry of precision + λ is not positive.
    """

    precision: torch.Tensor
    prior_precision: float = 1.0
    name: str = field(default="diagonal", init=False)

    def __post_init__(self):
        d = self.precision.double() + self.prior_precision
        if not bool((d > 0).all()):
            raise CovarianceError(
                "diagonal precision has non-positive entries; use prior_precision > 0 "
                "and a PSD curvature (hessian='ggn' or 'ef')"
            )
        self._inv = 1.0 / d

    def quadratic(self, J: torch.Tensor) -> torch.Tensor:
        """gᵀCg = Σₚ gₚ² / (hₚ + λ) for every gradient g in ``J``.

        Args:
            J: (..., P) gradients over the P selected parameters.

        Returns:
            (...) gᵀCg, in the squared units of the differentiated output.
        """
        return (J.double().pow(2) * self._inv).sum(-1).to(J.dtype)


class Dense:
    """C = (precision + prior_precision · I)⁻¹, the full Laplace covariance.

    Applied through the Cholesky factor L of H + λI: gᵀCg = ‖L⁻¹g‖² (a triangular solve; no
    explicit inverse). Memory is P² float64 numbers, so it suits small models or the last layer.

    Args:
        precision: (P, P) curvature H (GGN, empirical Fisher or Hessian) of the summed negative
            log-likelihood, e.g. from :func:`curvature`.
        prior_precision: λ > 0 added to the diagonal.

    Raises:
        CovarianceError: if H + λI is not positive definite.
    """

    name = "laplace"

    def __init__(self, precision: torch.Tensor, prior_precision: float = 1.0):
        P = precision.shape[0]
        A = precision.double() + prior_precision * torch.eye(P, dtype=torch.float64)
        L, info = torch.linalg.cholesky_ex(A)
        if int(info) != 0:
            raise CovarianceError(
                "H + λI is not positive definite (the exact Hessian can be indefinite away from "
                "a minimum). Use hessian='ggn' or 'ef' (always PSD) or a larger prior_precision"
            )
        self.precision, self.prior_precision, self.L = precision, prior_precision, L

    def quadratic(self, J: torch.Tensor) -> torch.Tensor:
        """gᵀ(H + λI)⁻¹g for every gradient g in ``J``.

        Args:
            J: (..., P) gradients over the P selected parameters.

        Returns:
            (...) gᵀCg, in the squared units of the differentiated output.
        """
        lead, P = J.shape[:-1], J.shape[-1]
        Z = torch.linalg.solve_triangular(self.L, J.reshape(-1, P).double().T, upper=False)
        return Z.pow(2).sum(0).reshape(lead).to(J.dtype)

    def eigenvalues(self) -> torch.Tensor:
        """Eigenvalues of the curvature H (without the prior).

        Returns:
            (P,) float64, ascending.
        """
        return torch.linalg.eigvalsh(self.precision.double())




# ---------------------------------------------------------------- likelihood pieces
def nll(out: torch.Tensor, y: torch.Tensor, likelihood: Likelihood, sigma_noise: float = 1.0):
    """Summed negative log-likelihood of outputs ``out`` (n, K) or (n,) for targets ``y`` (n,)."""
    if likelihood == "regression":
        return 0.5 * ((out.reshape(-1) - y.reshape(-1).to(out.dtype)) / sigma_noise).pow(2).sum()
    if out.ndim == 1 or out.shape[-1] == 1:
        return nn.functional.binary_cross_entropy_with_logits(
            out.reshape(-1), y.reshape(-1).to(out.dtype), reduction="sum"
        )
    return nn.functional.cross_entropy(out, y.reshape(-1).long(), reduction="sum")


def output_hessian(out: torch.Tensor, likelihood: Likelihood, sigma_noise: float = 1.0):
    """Λ = ∂²ℓ/∂out² per example: (n, K, K) for outputs (n, K) (the GGN's middle factor)."""
    if likelihood == "regression":
        n = out.shape[0]
        return torch.full((n, 1, 1), 1.0 / sigma_noise**2, dtype=out.dtype)
    if out.shape[-1] == 1:
        p = torch.sigmoid(out)
        return (p * (1 - p)).unsqueeze(-1)
    p = torch.softmax(out, dim=-1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


# ---------------------------------------------------------------- curvature estimates
def curvature(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    likelihood: Likelihood,
    kind: CurvatureKind = "ggn",
    structure: Literal["full", "diag"] = "full",
    sigma_noise: float = 1.0,
) -> torch.Tensor:
    """Curvature of the summed negative log-likelihood Σₙ ℓ(xₙ, yₙ) w.r.t. the parameters.

    Args:
        model: the network at its trained weights θ*.
        params: {name: parameter} of the P parameters that take part (see
            :func:`select_params`).
        X: (n, ...) proxy inputs.
        y: (n,) targets: class indices for classification, values for regression.
        likelihood: ``"classification"`` (Bernoulli for one logit, categorical for C ≥ 2) or
            ``"regression"`` (Gaussian with noise ``sigma_noise``).
        kind: ``"ggn"`` (Σ JᵀΛJ), ``"ef"`` (empirical Fisher Σ ∇ℓₙ∇ℓₙᵀ) or ``"hessian"``
            (exact; full only, small models).
        structure: ``"full"`` or ``"diag"``.
        sigma_noise: σ of the Gaussian likelihood (regression only), in output units.

    Returns:
        float64 tensor, (P, P) for ``structure="full"`` or (P,) for ``"diag"``, in units of
        1/parameter² (it is a precision).

    Raises:
        CovarianceError: for an unknown ``kind``, or ``"hessian"`` with ``structure="diag"``.
    """
    theta = {n: p.detach() for n, p in params.items()}
    P = sum(t.numel() for t in theta.values())
    f = functional_model(model, params)
    full = structure == "full"
    acc = torch.zeros((P, P) if full else (P,), dtype=torch.float64)

    if kind == "hessian":
        if not full:
            raise CovarianceError("hessian='hessian' is computed in full; use 'ggn' or 'ef' for diag")
        flat0 = flatten(theta)

        def total(v, xb, yb):
            return nll(f(unflatten(v, theta), xb), yb, likelihood, sigma_noise)

        size = max(1, chunk_size_for(P * 4))
        for s in range(0, X.shape[0], size):
            acc += hessian(total)(flat0, X[s : s + size], y[s : s + size]).double()
        return acc

    if kind == "ef":
        def one(th, x, t):
            return nll(f(th, x.unsqueeze(0)), t.unsqueeze(0), likelihood, sigma_noise)

        per_ex = vmap(grad(one), in_dims=(None, 0, 0))
        size = chunk_size_for(P)
        for s in range(0, X.shape[0], size):
            G = flatten(per_ex(theta, X[s : s + size], y[s : s + size]), batch_dims=1).double()
            acc += G.T @ G if full else G.pow(2).sum(0)
        return acc

    if kind == "ggn":
        with torch.no_grad():
            K = f(theta, X[:1]).reshape(1, -1).shape[-1]
        for _rows, out, J in output_jacobians(model, params, X, lambda o: o.reshape(-1), K):
            Lam = output_hessian(out, likelihood, sigma_noise).double()
            J = J.double()
            if full:
                acc += torch.einsum("nkp,nkl,nlq->pq", J, Lam, J)
            else:
                acc += torch.einsum("nkp,nkl,nlp->p", J, Lam, J)
        return acc
    raise CovarianceError(f"hessian={kind!r} is not one of 'ggn', 'ef', 'hessian'")


def dense_limit_bytes() -> int:
    """Largest dense P×P float64 matrix allowed: ISOUQ_MAX_DENSE_BYTES or a quarter of RAM."""
    env = os.environ.get("ISOUQ_MAX_DENSE_BYTES")
    if env:
        return int(float(env))
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        ram = 8 * 2**30
    return ram // 4


def check_dense_fits(n_params: int) -> None:
    """Raise MemoryBudgetError, with the size and the alternatives, if P×P does not fit."""
    need = 8 * n_params**2
    limit = dense_limit_bytes()
    if need > limit:
        raise MemoryBudgetError(
            f"a full Laplace covariance over {n_params:,} parameters needs a "
            f"{n_params:,}×{n_params:,} float64 matrix = {need / 2**30:,.1f} GiB "
            f"(limit {limit / 2**30:.1f} GiB; ISOUQ_MAX_DENSE_BYTES raises it). "
            "Use covariance='diagonal', covariance='last_layer' (Laplace on the last layer only), "
            "or covariance='identity' (the paper's isotropic estimator) instead"
        )


def build_covariance(
    kind: str | Covariance,
    *,
    model: nn.Module,
    params: dict[str, nn.Parameter],
    data: tuple[torch.Tensor, torch.Tensor] | None,
    likelihood: Likelihood,
    prior_precision: float = 1.0,
    hessian: CurvatureKind = "ggn",
    sigma_noise: float = 1.0,
) -> Covariance:
    """Turn a covariance name (or a ready object) into a fitted covariance.

    Args:
        kind: ``"identity"``, ``"diagonal"``, ``"laplace"`` (full), ``"last_layer"`` (full, on
            the last layer's parameters: the caller selects them in ``params``), or a ready
            :class:`Identity`, :class:`Diagonal` or :class:`Dense`, returned as is.
        model: the network at its trained weights θ*.
        params: {name: parameter} of the P parameters that take part.
        data: (X (n, ...), y (n,)) proxy data for the curvature; required by every kind but
            ``"identity"``.
        likelihood: ``"classification"`` or ``"regression"``.
        prior_precision: λ > 0 added to the curvature.
        hessian: the curvature: ``"ggn"``, ``"ef"`` or ``"hessian"`` (full only).
        sigma_noise: σ of the Gaussian likelihood (regression only), in output units.

    Returns:
        A covariance with ``quadratic(J)``: gradients (..., P) -> gᵀCg (...).

    Raises:
        CovarianceError: unknown kind or curvature, missing or mismatched proxy data.
        MemoryBudgetError: a full P×P matrix would not fit in memory.
    """
    if isinstance(kind, Identity | Diagonal | Dense):
        return kind
    if not isinstance(kind, str) or kind not in KINDS + ("full",):
        raise CovarianceError(
            f"covariance={kind!r} is unknown; use one of {', '.join(KINDS)} or a Covariance object"
        )
    if kind == "identity":
        return Identity()
    if hessian not in ("ggn", "ef", "hessian"):
        raise CovarianceError(f"hessian={hessian!r} is not one of 'ggn', 'ef', 'hessian'")
    if data is None:
        raise CovarianceError(
            f"covariance={kind!r} needs proxy data to estimate the curvature: pass data=(X, y) "
            "(inputs and targets, e.g. the training set or a sample of it)"
        )
    X, y = (torch.as_tensor(t) for t in data)
    if X.shape[0] == 0:
        raise CovarianceError(f"covariance={kind!r}: the proxy data is empty (0 rows); pass ≥ 1 row")
    if X.shape[0] != y.shape[0]:
        raise CovarianceError(
            f"proxy data: X has {X.shape[0]} rows but y has {y.shape[0]}; they must match"
        )
    X = X.to(next(iter(params.values())).dtype)
    P = sum(p.numel() for p in params.values())
    if kind == "diagonal":
        if hessian == "hessian":
            raise CovarianceError("covariance='diagonal' supports hessian='ggn' or 'ef'")
        h = curvature(model, params, X, y, likelihood=likelihood, kind=hessian, structure="diag",
                      sigma_noise=sigma_noise)
        return Diagonal(h, prior_precision)
    check_dense_fits(P)
    H = curvature(model, params, X, y, likelihood=likelihood, kind=hessian, structure="full",
                  sigma_noise=sigma_noise)
    return Dense(H, prior_precision)
