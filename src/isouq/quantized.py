"""Quantized weights (bitsandbytes 4-bit and 8-bit, torchao): what they stand for, read one at a
time.

A bitsandbytes layer keeps its weight packed (``Params4bit``: two 4-bit codes per byte and a
``quant_state`` of block scales; ``Int8Params``: int8 codes and per-row scales ``SCB``, which
move to the layer's ``state`` on its first forward); a torchao weight is a tensor subclass
(``Int8Tensor``, ``IntxUnpackedToInt8Tensor``: integer codes and scales) in an ordinary
``nn.Linear``. The model computes with the dequantized values W. isouq's gradient is with
respect to W, the weight "as the model computes with it": its count is W's, its ‖θ*‖² is W's,
and its per-example gradient Σₜ bₜ aₜᵀ needs no copy of W (``ghost/quantized.py``,
``ghost/linear.py``).

Nothing here imports bitsandbytes unless such a weight is met, nor torchao ever.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from .errors import ModelError


def is_torchao(p: torch.Tensor) -> bool:
    """True for a torchao quantized weight (a tensor subclass holding codes and scales)."""
    return type(p).__module__.startswith("torchao.")


def is_quantized(p: torch.Tensor) -> bool:
    """True for a bitsandbytes 4-bit or 8-bit weight or a torchao one (integer codes standing
    for real values)."""
    return (not p.is_floating_point() and (hasattr(p, "quant_state") or hasattr(p, "SCB"))
            or is_torchao(p))


def quantizes_inputs(p: torch.Tensor) -> bool:
    """True for a torchao weight whose layer rounds its input too (dynamic or static activation
    quantization): its layer passes no gradient to its input."""
    return is_torchao(p) and (getattr(p, "act_quant_kwargs", None) is not None
                              or getattr(p, "activation_quantization", None) is not None)


def check_inputs_not_quantized(model: nn.Module) -> None:
    """Raise ModelError when torchao rounds the inputs of some layer of ``model``: autograd
    passes no gradient through such a layer (the rounded input is a new tensor without a
    history), so every parameter before it would score 0 and its own weight has no rule."""
    kinds = sorted({type(p).__name__ for p in model.parameters() if quantizes_inputs(p)})
    if kinds:
        raise ModelError(
            f"torchao quantizes the inputs of this model's layers too ({', '.join(kinds)} with "
            "activation quantization): no gradient passes through them, so there is nothing "
            "to score; quantize the weights only (torchao Int8WeightOnlyConfig or "
            "IntxWeightOnlyConfig), which isouq scores exactly")


def computes_as_dequantized(p: torch.Tensor) -> bool:
    """True when ``F.linear(x, p, b)`` is ``x Wᵀ + b`` with W = ``dequantized(p)``: a plain
    weight, or a torchao weight-only one (``Int8Tensor`` without activation quantization,
    pre-scaling or zero points; ``IntxUnpackedToInt8Tensor`` without activation
    quantization). False for every other torchao weight: it quantizes or rescales the input
    too, or computes in a way isouq has not checked."""
    if not is_torchao(p):
        return True
    kind = type(p).__name__
    if quantizes_inputs(p):
        return False
    if kind == "Int8Tensor":
        zero = getattr(p, "zero_point", None)
        return getattr(p, "act_pre_scale", None) is None and (zero is None or not bool(zero.any()))
    return kind == "IntxUnpackedToInt8Tensor"


def logical_numel(p: torch.Tensor) -> int:
    """Scalar parameters ``p`` stands for: the dequantized weight's count for a 4-bit weight
    (two codes per byte), the tensor's own count otherwise."""
    state = getattr(p, "quant_state", None)
    if state is not None and not p.is_floating_point():
        return math.prod(state.shape)
    return p.numel()


def int8_row_scales(p: torch.Tensor, owner: nn.Module | None = None) -> torch.Tensor:
    """The per-row scales (``SCB``, (out,) float32) of a bitsandbytes 8-bit weight ``p``: on the
    weight until the layer's first forward, on the layer's ``state`` after it (``owner``: the
    ``Linear8bitLt`` holding ``p``)."""
    scb = getattr(p, "SCB", None)
    if scb is None:
        scb = getattr(getattr(owner, "state", None), "SCB", None)
    if scb is None:
        raise ModelError(
            "an 8-bit bitsandbytes weight has no row scales (SCB) on it after its layer's first "
            "forward: pass the Linear8bitLt holding it (dequantized(p, owner=layer))")
    return scb


def dequantized(p: torch.Tensor, owner: nn.Module | None = None) -> torch.Tensor:
    """The real-valued weight a quantized ``p`` stands for (float32, a temporary copy); ``p``
    itself when it is not quantized.

    Args:
        p: a weight, (out, in) for a quantized one.
        owner: the module holding ``p``; needed for a bitsandbytes 8-bit weight whose layer
            has run (its row scales are on the layer then).

    Returns:
        (out, in) float32 values W as the layer computes with them."""
    if not is_quantized(p):
        return p
    if is_torchao(p):
        with torch.no_grad():
            return p.dequantize().float()
    import bitsandbytes.functional as bnbf

    with torch.no_grad():
        state = getattr(p, "quant_state", None)
        if state is not None:
            if getattr(state, "packing_format_for_cpu", False):
                data, state = cpu_unpacked(p.data, state, in_place=False)
                return bnbf.dequantize_4bit(data, state).float()
            return bnbf.dequantize_4bit(p.data, state).float()
        return p.data.float() * (int8_row_scales(p, owner).float()[:, None] / 127.0)


def cpu_unpacked(data: torch.Tensor, state, *, in_place: bool = True) -> tuple:
    """(codes, quant_state) of a 4-bit weight that bitsandbytes repacked for its CPU kernel, in
    the layout ``dequantize_4bit`` and the autograd path read; ``in_place=False`` leaves
    ``state`` as it was. bitsandbytes' own inverse leaves a non-nested ``absmax`` in the packed
    layout ((K/blocksize, N), bfloat16), which later forwards read in the wrong order: it is
    put back as the flat (N·K/blocksize,) float32 vector (keeping its bfloat16 rounding)."""
    import copy

    import bitsandbytes.functional as bnbf

    nested = getattr(state, "original_nested", state.nested)
    if not in_place:
        state = copy.copy(state)
    data, state = bnbf._convert_weight_packed_for_cpu_inverse(data, state)
    if not nested and state.absmax.dim() == 2:
        state.absmax = state.absmax.T.reshape(-1).float()
    return data, state


def keep_unpacked(model: nn.Module) -> nn.Module:
    """Stop bitsandbytes from repacking ``model``'s 4-bit weights for its CPU kernel without
    autograd on a forward without gradients (``support_avx512bf16_for_cpu``): generation and
    scoring then compute with the same weights, whatever ran before. Returns ``model``."""
    for m in _linear4bit_layers(model):
        if getattr(m, "support_avx512bf16_for_cpu", None) is not None:
            m.support_avx512bf16_for_cpu = False
    return model


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
    saved = []
    for m in layers:
        w = m.weight
        if getattr(w.quant_state, "packing_format_for_cpu", False):
            w.data, w.quant_state = cpu_unpacked(w.data, w.quant_state)
        saved.append((m, getattr(m, "support_avx512bf16_for_cpu", None)))
        if saved[-1][1] is not None:
            m.support_avx512bf16_for_cpu = False
    try:
        yield
    finally:
        for m, flag in saved:
            if flag is not None:
                m.support_avx512bf16_for_cpu = flag
