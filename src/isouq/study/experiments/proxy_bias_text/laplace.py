"""Last-layer Laplace on the linear head: empirical Fisher, predicted-class gradients, dense or
low-rank (Woodbury) covariance, epistemic gᵀCg."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ....covariance import Dense, curvature
from ....errors import InputError
from ....per_example import output_jacobians


def head_params(head: nn.Linear) -> dict[str, nn.Parameter]:
    """The head's parameters in flattening order: weight (C, H) row-major, then bias (C,)."""
    return {"weight": head.weight, "bias": head.bias}


def head_fisher(head: nn.Linear, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Empirical Fisher (P, P) float64 of the summed categorical NLL of ``head`` on (feats, labels).

    feats (n, H) float; labels (n,) int. H_EF = Σₙ ∇θℓₙ∇θℓₙᵀ, P = C·H + C.
    """
    return curvature(head, head_params(head), feats.to(head.weight.dtype), labels.long(),
                     likelihood="classification", kind="ef")


def predicted_class_gradients(head: nn.Linear, feats: torch.Tensor) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
    """g = ∇θ p(ĉ | x) for the predicted class ĉ of each row of feats (n, H).

    Returns (G (n, P) in head order, pred (n,) int64).
    """
    def probs(o: torch.Tensor) -> torch.Tensor:
        return torch.softmax(o, dim=-1).reshape(-1)

    C = head.out_features
    x = feats.to(head.weight.dtype)
    G = torch.empty(x.shape[0], C * (head.in_features + 1), dtype=x.dtype)
    pred = torch.empty(x.shape[0], dtype=torch.long)
    for rows, out, J in output_jacobians(head, head_params(head), x, probs, C):
        c = out.argmax(-1)
        pred[rows] = c
        G[rows] = J[torch.arange(J.shape[0]), c]
    return G, pred


def epistemic_under(cov, G: torch.Tensor) -> np.ndarray:
    """gᵀCg (n,) float64 for each row of G (n, P)."""
    return cov.quadratic(G.double()).double().numpy()


def nll_gradients(head: nn.Linear, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example ∇θℓₙ (n, P) of the categorical NLL of a linear softmax head, in closed form.

    ℓₙ = −log softmax(W xₙ + b)[yₙ]; ∇_W ℓₙ = (pₙ − e_yₙ) xₙᵀ, ∇_b ℓₙ = pₙ − e_yₙ, flattened
    as :func:`head_params` (W row-major, then b). GᵀG is the empirical Fisher.
    """
    x = feats.to(head.weight.dtype)
    with torch.no_grad():
        r = torch.softmax(head(x), dim=-1)
        r[torch.arange(x.shape[0]), labels.long()] -= 1.0
    return torch.cat([(r.unsqueeze(2) * x.unsqueeze(1)).reshape(x.shape[0], -1), r], dim=1)


class LowRankLaplace:
    """C = (GᵀG + λI)⁻¹ for n < P per-example gradients G (n, P), via Woodbury (exact).

    gᵀCg = (‖g‖² − ‖L⁻¹Gg‖²)/λ with L Lᵀ = λIₙ + GGᵀ: an n×n Cholesky instead of P×P.
    Same values as ``Dense(G.T @ G, λ)`` (tested), at O(n²P) instead of O(P³).
    """

    name = "laplace-lowrank"

    def __init__(self, G: torch.Tensor, prior_precision: float = 1.0):
        self.G, self.prior_precision = G.double(), float(prior_precision)
        K = self.G @ self.G.T + self.prior_precision * torch.eye(G.shape[0], dtype=torch.float64)
        self.L = torch.linalg.cholesky(K)

    def quadratic(self, J: torch.Tensor) -> torch.Tensor:
        """J (..., P) → (...) = Jᵀ C J."""
        lead, P = J.shape[:-1], J.shape[-1]
        Jd = J.reshape(-1, P).double()
        Z = torch.linalg.solve_triangular(self.L, self.G @ Jd.T, upper=False)
        q = (Jd.pow(2).sum(1) - Z.pow(2).sum(0)) / self.prior_precision
        return q.reshape(lead).to(J.dtype)


def laplace_covariance(head: nn.Linear, feats: torch.Tensor, labels: torch.Tensor,
                       prior_precision: float, solver: str = "auto"):
    """(EF(feats, labels) + λI)⁻¹ as a covariance object with ``quadratic``.

    solver: "dense" (``covariance.curvature(kind="ef")`` + ``covariance.Dense``, P×P
    Cholesky), "lowrank" (:class:`LowRankLaplace`), "auto" (low-rank when n < P).
    """
    P = head.out_features * (head.in_features + 1)
    if solver not in ("auto", "dense", "lowrank"):
        raise InputError(f"solver={solver!r}; use auto, dense or lowrank")
    if solver == "lowrank" or (solver == "auto" and feats.shape[0] < P):
        return LowRankLaplace(nll_gradients(head, feats, labels), prior_precision)
    return Dense(head_fisher(head, feats, labels), prior_precision)


def laplace_epistemic(head: nn.Linear, feats: torch.Tensor, labels: torch.Tensor,
                      G: torch.Tensor, prior_precision: float, solver: str = "auto") -> np.ndarray:
    """gᵀ(EF(feats, labels) + λI)⁻¹g (n,) for the rows of G (n, P)."""
    return epistemic_under(laplace_covariance(head, feats, labels, prior_precision, solver), G)
