"""Quantized weights (bitsandbytes 4-bit and 8-bit): what they stand for, read one at a time.

A bitsandbytes layer keeps its weight packed (``Params4bit``: two 4-bit codes per byte and a
``quant_state`` of block scales; ``Int8Params``: int8 codes and per-row scales ``SCB``); the
model computes with the dequantized values W. isouq's gradient is with respect to W, the
weight "as the model computes with it": its count is W's, its ‖θ*‖² is W's, and its
per-example gradient Σₜ bₜ aₜᵀ needs no copy of W (``ghost/quantized.py``).

Nothing here imports bitsandbytes unless such a weight is met.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn


def is_quantized(p: torch.Tensor) -> bool:
    """True for a bitsandbytes 4-bit or 8-bit weight (integer codes standing for real values)."""
    return not p.is_floating_point() and (hasattr(p, "quant_state") or hasattr(p, "SCB"))


def logical_numel(p: torch.Tensor) -> int:
    """Scalar parameters ``p`` stands for: the dequantized weight's count for a 4-bit weight
    (two codes per byte), the tensor's own count otherwise."""
    state = getattr(p, "quant_state", None)
    if state is not None and not p.is_floating_point():
        return math.prod(state.shape)
    return p.numel()


def dequantized(p: torch.Tensor) -> torch.Tensor:
    """The real-valued weight a quantized ``p`` stands for (float32, a temporary copy); ``p``
    itself when it is not quantized."""
    if not is_quantized(p):
        return p
    import bitsandbytes.functional as bnbf

    with torch.no_grad():
        state = getattr(p, "quant_state", None)
        if state is not None:
            if getattr(state, "packing_format_for_cpu", False):
                data, state = bnbf._convert_weight_packed_for_cpu_inverse(p.data, state)
                return bnbf.dequantize_4bit(data, state).float()
            return bnbf.dequantize_4bit(p.data, state).float()
        return p.data.float() * (p.SCB.float()[:, None] / 127.0)


def _linear4bit_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules()
            if type(m).__module__.startswith("bitsandbytes") and hasattr(m, "weight")
            and getattr(m.weight, "quant_state", None) is not None]


@contextmanager
def autograd_ready(model: nn.Module):
    """Within it, every bitsandbytes 4-bit layer computes through its autograd-capable path.

    On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit weight for a kernel without
    autograd on the first forward run without gradients (``packing_format_for_cpu``), and from
    then on routes every call there, gradients or not: backward passes would silently skip
    those layers. Inside this context such weights are unpacked and no layer repacks; the
    packing is left off afterwards (bitsandbytes repacks on its next no-grad call)."""
    layers = _linear4bit_layers(model)
    if not layers:
        yield
        return
    import bitsandbytes.functional as bnbf

    saved = []
    for m in layers:
        w = m.weight
        if getattr(w.quant_state, "packing_format_for_cpu", False):
            w.data, w.quant_state = bnbf._convert_weight_packed_for_cpu_inverse(w.data,
                                                                                 w.quant_state)
        saved.append((m, getattr(m, "support_avx512bf16_for_cpu", None)))
        if saved[-1][1] is not None:
            m.support_avx512bf16_for_cpu = False
    try:
        yield
    finally:
        for m, flag in saved:
            if flag is not None:
                m.support_avx512bf16_for_cpu = flag
