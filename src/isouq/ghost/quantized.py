"""bitsandbytes' quantized linear layers: ``Linear4bit`` (NF4/FP4, with or without double
quantization, any compute dtype) and ``Linear8bitLt`` (LLM.int8(), with or without its outlier
threshold).

Both compute y = ã Wᵀ + b with W the dequantized weight, so the per-example gradient with
respect to W is Σₜ bₜ ãₜᵀ, as for ``nn.Linear`` (``linear.py``), and no dequantized copy of W is
ever made; ã is the input as the layer's matmul multiplies it:

- ``Linear4bit``: the input cast to the layer's compute dtype.
- ``Linear8bitLt`` in eval mode (``MatMul8bitLt``): the input quantized too, row by row (each
  token's row rounded to int8 codes CA by its absmax SCA: ã = CA·SCA·c/127, where c is what
  the device's ``int8_mm_dequant`` kernel multiplies by beyond 1/127², asked of the kernel:
  1 + 1.8·10⁻⁵ in bitsandbytes 0.50's CPU kernel); with a threshold, the columns holding an input entry
  at or above it are kept in the input's own precision (ã = x there). Which columns those are
  depends on every row the call sees (the whole batch): an answer scored beside others may be
  computed slightly differently from the same answer alone, and the rule is exact for the
  batch as computed. The input's gradient passes through the rounding unchanged (bitsandbytes'
  backward), as in the model's own backward.
- ``Linear8bitLt`` in train mode on CPU or XPU (``MatMul8bitFp``): ã = x.

Registered when the first bitsandbytes layer is looked up (``registry.register_package``), so
that isouq never imports bitsandbytes itself.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

from .calls import Call
from .factors import Contribution
from .linear import linear_contributions
from .registry import register_package, register_rule


def _linear4bit(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """weight (as dequantized): Pair(B, x̃); bias: Σₜ bₜ."""
    x = call.args[0]
    dtype = getattr(module, "compute_dtype", None) or x.dtype
    return linear_contributions(x.to(dtype), call.grad, module.bias is not None,
                                call.sparse_output, call.positions)


#: device type -> c, the factor the int8 kernel multiplies CA·CB·SCA·SCB by, times 127²
_KERNEL_SCALE: dict[str, float] = {}


def _kernel_scale(device: torch.device) -> float:
    """c = 127² × the constant of bitsandbytes' ``int8_mm_dequant`` on ``device``, asked of the
    kernel itself (an int32 product of 127² with unit row and column scales)."""
    if device.type not in _KERNEL_SCALE:
        prod = torch.full((1, 1), 127 * 127, dtype=torch.int32, device=device)
        one = torch.ones(1, dtype=torch.float32, device=device)
        out = torch.ops.bitsandbytes.int8_mm_dequant(prod, one, one, dtype=torch.float32)
        _KERNEL_SCALE[device.type] = float(out)
    return _KERNEL_SCALE[device.type]


#: id(input) -> (weak reference, (version, threshold), ã): q/k/v (gate/up) share one input, so
#: they share one ã, and the engine computes its Gram once (``factors._dense_gram``)
_INT8_INPUTS: dict[int, tuple] = {}


def int8_input(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """ã, the input ``x`` (…, in) as ``MatMul8bitLt`` multiplies it by the dequantized weight:
    each row's int8 codes times its scale (``int8_vectorwise_quant``, the call the layer
    makes), the outlier columns (``threshold`` > 0) as they are. float32, ``x``'s shape."""
    key = (x._version, threshold)
    hit = _INT8_INPUTS.get(id(x))
    if hit is not None and hit[0]() is x and hit[1] == key:
        return hit[2]
    import bitsandbytes.functional as bnbf

    with torch.no_grad():
        A = x.reshape(-1, x.shape[-1])
        CA, SCA, outliers = bnbf.int8_vectorwise_quant(A.to(torch.float16), threshold=threshold)
        a = CA.float() * (SCA.float()[:, None] * (_kernel_scale(x.device) / 127.0))
        if threshold > 0.0 and outliers is not None and outliers.numel():
            a[:, outliers] = A[:, outliers].float()
        a = a.reshape(x.shape)
    i = id(x)
    _INT8_INPUTS[i] = (weakref.ref(x, lambda _: _INT8_INPUTS.pop(i, None)), key, a)
    return a


def _linear8bit(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """weight (as dequantized: int8 codes × row scales / 127): Pair(B, ã); bias: Σₜ bₜ."""
    x = call.args[0]
    state = module.state
    if state.is_training and x.device.type in ("cpu", "xpu"):  # bnb.matmul: MatMul8bitFp
        a = x
    else:
        a = int8_input(x, float(state.threshold))
    return linear_contributions(a, call.grad, module.bias is not None, call.sparse_output,
                                call.positions)


class _Once(logging.Filter):
    """Lets each distinct message through once: bitsandbytes logs "inputs will be cast from
    float32 to float16" at every call of every 8-bit layer, thousands of lines per scoring run."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        new = msg not in self.seen
        self.seen.add(msg)
        return new


def register() -> None:
    """Register the rules for bitsandbytes' layer types (bitsandbytes is loaded by then)."""
    import bitsandbytes as bnb

    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once())

    register_rule(bnb.nn.Linear4bit, subclasses=True, uses_output=False,
                  reads_params=False)(_linear4bit)
    register_rule(bnb.nn.Linear8bitLt, subclasses=True, uses_output=False,
                  reads_params=False)(_linear8bit)


register_package("bitsandbytes.", register)  # called on meeting the first bitsandbytes layer
