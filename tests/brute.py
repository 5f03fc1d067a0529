"""Brute-force per-example gradients: the independent reference of the ghost-norm tests."""

from __future__ import annotations

import torch


def brute(model, params: dict, s_fn, n: int) -> torch.Tensor:
    """(n, P) ‖∇θ sᵢ‖² per parameter tensor, one ``autograd.grad`` per example.

    Args:
        model: unused except through ``s_fn`` (kept for call symmetry with the ghost engine).
        params: name -> parameter, in the column order.
        s_fn: i -> the scalar sᵢ computed from example i alone.
        n: number of examples.
    """
    rows = []
    for i in range(n):
        gs = torch.autograd.grad(s_fn(i), list(params.values()), allow_unused=True)
        rows.append(torch.stack([g.pow(2).sum() if g is not None else torch.tensor(0.0)
                                 for g in gs]))
    return torch.stack(rows)
