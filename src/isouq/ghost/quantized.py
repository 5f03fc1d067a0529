"""bitsandbytes' quantized linear layers: ``Linear4bit`` (NF4/FP4, with or without double
quantization, any compute dtype).

The layer computes y = x̃ Wᵀ + b with W the dequantized weight and x̃ the input cast to the
layer's compute dtype, so the per-example gradient with respect to W is Σₜ bₜ x̃ₜᵀ, exactly as
for ``nn.Linear`` (``linear.py``), and no dequantized copy of W is ever made. Registered when
the first bitsandbytes layer is looked up (``registry.register_package``), so that isouq never
imports bitsandbytes itself. ``Linear8bitLt`` is not covered: with its outlier threshold it
quantizes the activations too (y is not x Wᵀ); the engine refuses its int8 weights with a line
naming ``params='trainable'``.
"""

from __future__ import annotations

from torch import nn

from .calls import Call
from .factors import Contribution
from .linear import linear_contributions
from .registry import register_package, register_rule


def _linear4bit(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """weight (as dequantized): Pair(B, x̃); bias: Σₜ bₜ."""
    x = call.args[0]
    dtype = getattr(module, "compute_dtype", None) or x.dtype
    return linear_contributions(x.to(dtype), call.grad, module.bias is not None)


def register() -> None:
    """Register the rules for bitsandbytes' layer types (bitsandbytes is loaded by then)."""
    import bitsandbytes as bnb

    register_rule(bnb.nn.Linear4bit, subclasses=True, uses_output=False,
                  reads_params=False)(_linear4bit)


register_package("bitsandbytes.", register)  # called on meeting the first bitsandbytes layer
