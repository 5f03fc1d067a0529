"""nn.Linear: weight (out, in) gradient per example = Σₜ bₜ aₜᵀ = Bᵀ A; bias = Σₜ bₜ."""

from __future__ import annotations

from torch import nn

from .calls import Call, as_tokens
from .factors import Contribution, Materialized, Pair, at_least_f32
from .registry import register_rule


# subclasses that change forward (quantized layers, LoRA, ...) go to the exact fallback
@register_rule(nn.Linear, uses_output=False)
def contributions(module: nn.Linear, call: Call) -> dict[str, Contribution]:
    """weight: Pair(B, A) (Gram or materialized by the cost rule); bias: Σₜ bₜ (N, out)."""
    A = as_tokens(call.args[0]).to(call.grad.dtype)
    B = as_tokens(call.grad)
    pair = Pair(B, A)
    if B.shape[-1] > 4 * A.shape[-1]:  # wide outputs (lm_head): drop positions with no gradient
        pair = pair.compacted(by="left")
    out: dict[str, Contribution] = {"weight": pair}
    if module.bias is not None:
        out["bias"] = Materialized(at_least_f32(B).sum(1))
    return out
