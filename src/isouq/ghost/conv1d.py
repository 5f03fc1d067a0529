"""transformers' Conv1D (GPT-2): y = x W + b with W (in, out); per example W-grad = Aᵀ B."""

from __future__ import annotations

from torch import nn

from .calls import Call, as_tokens
from .factors import Contribution, Materialized, Pair, at_least_f32
from .registry import register_rule


def _is_hf_conv1d(module: nn.Module) -> bool:
    # transformers.pytorch_utils.Conv1D, matched by name so transformers stays optional here
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


@register_rule(match=_is_hf_conv1d, uses_output=False, reads_params=False)
def contributions(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """weight (in, out): Pair(A, B); bias: Σₜ bₜ."""
    A = as_tokens(call.args[0]).to(call.grad.dtype)
    B = as_tokens(call.grad)
    out: dict[str, Contribution] = {"weight": Pair(A, B, input_side="left")}
    if getattr(module, "bias", None) is not None:
        out["bias"] = Materialized(at_least_f32(B).sum(1))
    return out
