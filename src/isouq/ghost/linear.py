"""nn.Linear: weight (out, in) gradient per example = Σₜ bₜ aₜᵀ = Bᵀ A; bias = Σₜ bₜ."""

from __future__ import annotations

import torch
from torch import nn

from ..quantized import computes_as_dequantized
from .calls import Call, as_tokens
from .factors import Contribution, Materialized, Pair, at_least_f32
from .registry import register_rule


def linear_contributions(x: torch.Tensor, grad: torch.Tensor, bias: bool,
                         compact: bool = False, positions: torch.Tensor | None = None,
                         source: tuple | None = None) -> dict[str, Contribution]:
    """y = x Wᵀ (+ b) with input ``x`` (N, ..., in) as multiplied and output gradient ``grad``
    (N, ..., out): weight Pair(B, A) (Gram or materialized by the cost rule), bias Σₜ bₜ;
    ``compact`` (the LM head, ``Call.sparse_output``): the positions with no gradient dropped
    first, where it pays: at ``positions`` (``Call.positions``, known to the caller), else read
    from the gradient (one host synchronization); ``source``: what ``x`` is (``Pair.source``)."""
    A = as_tokens(x)
    B = as_tokens(grad)
    pair = Pair(B, A, source=source)
    if compact:
        pair = pair.compacted(by="left", positions=positions)
    out: dict[str, Contribution] = {"weight": pair}
    if bias:
        out["bias"] = Materialized(at_least_f32(B).sum(1))
    return out


# subclasses that change forward (LoRA, ...) go to the exact fallback; bitsandbytes' quantized
# layers have their own rules (quantized.py); a torchao weight counts as its dequantized values
# when it is weight-only quantized, and no rule covers one that quantizes the input too
@register_rule(nn.Linear, uses_output=False, reads_params=False,
               applies=lambda m: computes_as_dequantized(m.weight))
def contributions(module: nn.Linear, call: Call) -> dict[str, Contribution]:
    """weight: Pair(B, A) (Gram or materialized by the cost rule); bias: Σₜ bₜ (N, out)."""
    return linear_contributions(call.args[0].to(call.grad.dtype), call.grad,
                                module.bias is not None, call.sparse_output, call.positions,
                                source=("input", call.grad.dtype))
