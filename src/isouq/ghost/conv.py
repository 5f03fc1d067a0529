"""nn.Conv1d / Conv2d / Conv3d: exact per-example weight and bias gradients.

A convolution is a Linear layer applied at every output position t to the unfolded input
patch uₜ (Cin/g · K values per group, K = kernel size): per example and group j,
g_W = Σₜ bₜ uₜᵀ = Bⱼᵀ Uⱼ, with B the output gradient (positions × Cout/g) and U the unfolded
input (positions × Cin/g·K). So it is a :class:`~isouq.ghost.factors.Pair` over the L output
positions, with the g groups folded into the batch, and the cost rule of ``factors.py``
(Gram ~ L² (a + b) against materializing ~ L a b, a = Cout/g, b = Cin/g·K, plus its memory
cap) picks per layer and per batch:
- Gram: ‖g_W‖² = ⟨B Bᵀ, U Uᵀ⟩ over positions (few positions, wide layers: late stages);
- materialize: the per-example gradients (N, Cout, Cin/g, *kernel) from weight-gradient
  convolutions with chunks of the batch folded into the groups (no unfolded copy of the
  input; ``GROUPED_CHUNK_BYTES``), or, for
  small patches (``UNFOLD_MAX_PATCH``), one bmm with the unfolded input.
Stride, padding (numbers, ``'same'``, ``'valid'``, any ``padding_mode``), dilation and groups
(depthwise included) are handled; bias: g_b = Σₜ bₜ.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelError
from . import factors
from .calls import Call
from .factors import Contribution, Materialized, Pair, at_least_f32
from .registry import register_rule

#: Materialize through the unfolded input (bmm) when a patch has at most this many values
#: (Cin/g · kernel size), through the batch-folded weight-gradient convolution otherwise.
UNFOLD_MAX_PATCH = 256
#: Above this size (bytes) of the unfolded input, small patches materialize one example at a
#: time through the ordinary weight-gradient convolution instead of unfolding: a large unfolded
#: copy (an ImageNet stem: 3 × 7 × 7 patches at 112 × 112 positions, 59 MB for 8 images) makes
#: the bmm memory-bound (57 ms there against 20 ms for 8 single-example convolutions, CPU).
UNFOLD_MAX_BYTES = 16 * 2**20
#: How much slower a multiply-add of the patch Gram path (a channel Gram, strided sums over
#: kernel offsets, the output-gradient Gram: many memory-bound steps) runs than one of the
#: stride-1 weight-gradient convolution that materializes (one optimized kernel); the cost
#: rule weighs the Gram form's count by it for stride-1 layers. Measured on CPU with
#: benchmarks/classifiers.py's ResNet (batch 32): 128→128 channels at 16×16, the Gram path took
#: 82 ms for 0.7 G multiply-adds where materializing took 37 ms for 1.2 G. A strided layer's
#: batch-folded weight-gradient convolution runs about as slowly as the Gram path (128→256,
#: stride 2, 8×8 out: 64 ms for 0.6 G), so there the counts are compared as they are.
GRAM_SLOWDOWN = 4.0
#: The batch-folded weight-gradient convolution runs on chunks of examples whose per-example
#: gradients take about this many bytes: one call over a whole batch of wide layers slows down
#: once its output leaves the cache (CPU, benchmarks/conv_chunks.py, batch 32: 256→256 channels
#: at 8×8, 100 ms in one call against 66 ms in chunks; 512→512 at 4×4, 357 ms against 212 ms).
GROUPED_CHUNK_BYTES = 2 * 2**20


def unfold(x: torch.Tensor, kernel: tuple[int, ...], dilation: tuple[int, ...],
           stride: tuple[int, ...]) -> torch.Tensor:
    """Patches of an already padded (N, C, *spatial) input: (N, C·K, L), channel-major.

    Column t holds the input patch that output position t (row-major over the d output dims)
    sees, in the order of a conv weight's (C, *kernel) dims.
    """
    d = len(kernel)
    for i in range(d):
        span = dilation[i] * (kernel[i] - 1) + 1
        x = x.unfold(2 + i, span, stride[i])  # window dim appended last
        if dilation[i] > 1:
            x = x[..., :: dilation[i]]
    # (N, C, o_1..o_d, k_1..k_d) -> (N, C, k_1..k_d, o_1..o_d)
    perm = (0, 1, *range(2 + d, 2 + 2 * d), *range(2, 2 + d))
    N, C = x.shape[:2]
    return x.permute(perm).reshape(N, C * math.prod(kernel), -1)


def _padded(module: nn.modules.conv._ConvNd, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The input padded explicitly when needed, and the padding left for the convolution."""
    d = len(module.kernel_size)
    if isinstance(module.padding, str) or module.padding_mode != "zeros":
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        pads = list(module._reversed_padding_repeated_twice)
        if any(pads):
            x = F.pad(x, pads, mode=mode)
        return x, (0,) * d
    return x, tuple(module.padding)


def _patches(module, full: torch.Tensor, N: int, g: int, b: int, L: int) -> torch.Tensor:
    """Unfolded input per example and group: (N·g, L, b)."""
    U = unfold(full, tuple(module.kernel_size), tuple(module.dilation), tuple(module.stride))
    return U.view(N, g, b, L).transpose(2, 3).reshape(N * g, L, b)


def _patch_gram(module, full: torch.Tensor, out_sizes: tuple[int, ...]) -> torch.Tensor:
    """U Uᵀ over output positions (N·g, L, L) without unfolding: from the channel Gram
    P[p, p'] = Σ_c x[c, p] x[c, p'] of the padded input, UUᵀ[t, t'] = Σ_k P[t·s + k·δ, t'·s + k·δ]
    over kernel offsets k (s stride, δ dilation): Lp² C/g + L² K work instead of L² C/g · K."""
    N, C = full.shape[:2]
    g, sp = module.groups, tuple(full.shape[2:])
    X = full.reshape(N, g, C // g, -1).transpose(2, 3).reshape(N * g, -1, C // g)
    P = torch.bmm(X, X.transpose(1, 2)).view(N * g, *sp, *sp)
    R = None
    for offs in itertools.product(*(range(k) for k in module.kernel_size)):
        idx = tuple(slice(o * dl, o * dl + st * (n - 1) + 1, st) for o, dl, st, n in
                    zip(offs, module.dilation, module.stride, out_sizes, strict=True))
        blk = P[(slice(None), *idx, *idx)]
        R = blk if R is None else R + blk
    L = math.prod(out_sizes)
    return R.reshape(N * g, L, L)


def _grouped_weight_grads(module, grad: torch.Tensor, x: torch.Tensor,
                          pad: tuple[int, ...]) -> torch.Tensor:
    """(n, Cout, Cin/g, *kernel) weight gradients of n examples from ONE weight-gradient
    convolution with the examples folded into the groups (n·g groups, no unfolded copy)."""
    n, d, kernel = grad.shape[0], len(module.kernel_size), tuple(module.kernel_size)
    Cout, Cin = module.out_channels, module.in_channels
    w = grad.new_empty(1).expand(n * Cout, Cin // module.groups, *kernel)
    gw = torch.ops.aten.convolution_backward(
        grad.reshape(1, n * Cout, *grad.shape[2:]), x.reshape(1, n * Cin, *x.shape[2:]), w, None,
        list(module.stride), list(pad), list(module.dilation), False, [0] * d, n * module.groups,
        [False, True, False],
    )[1]
    return gw.view(n, Cout, Cin // module.groups, *kernel)


def _weight_grads(module, grad: torch.Tensor, x: torch.Tensor, pad: tuple[int, ...], *,
                  chunk: int) -> tuple[torch.Tensor, ...]:
    """Per-example weight gradients in blocks of ``chunk`` examples, each block
    (n, Cout, Cin/g, *kernel) from one weight-gradient convolution (1: the ordinary
    convolution of one example at a time); the blocks are not concatenated (a lone
    contribution's norms are taken block by block)."""
    return tuple(_grouped_weight_grads(module, grad[s : s + chunk], x[s : s + chunk], pad)
                 for s in range(0, grad.shape[0], chunk))


@register_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d, uses_output=False, reads_params=False)
def contributions(module: nn.modules.conv._ConvNd, call: Call) -> dict[str, Contribution]:
    """weight: Pair over positions (fold = groups) or materialized; bias: (N, Cout)."""
    grad = at_least_f32(call.grad)  # half-precision models: every term in float32
    d = len(module.kernel_size)
    x = call.args[0]
    if x.ndim != d + 2:
        raise ModelError(f"{type(module).__name__} got an input of shape {tuple(x.shape)}: ghost "
                         f"norms need a batch dimension first, (N, C, *{d} spatial dims)")
    N, Cout, Cin, g = grad.shape[0], module.out_channels, module.in_channels, module.groups
    kernel = tuple(module.kernel_size)
    L = math.prod(grad.shape[2:])
    a, b = Cout // g, Cin // g * math.prod(kernel)
    x, pad = _padded(module, x.to(grad.dtype))
    out: dict[str, Contribution] = {}
    if module.bias is not None:
        out["bias"] = Materialized(grad.reshape(N, Cout, -1).sum(-1))
    if module.weight is None:
        return out
    Lp = math.prod(n + 2 * q for n, q in zip(x.shape[2:], pad, strict=True))
    shape = Pair(torch.empty(N * g, L, a, device="meta", dtype=grad.dtype),
                 torch.empty(N * g, L, b, device="meta", dtype=grad.dtype), fold=g)
    gram_cost = Lp * Lp * (Cin // g) + L * L * (math.prod(kernel) + a)
    slowdown = GRAM_SLOWDOWN if all(st == 1 for st in module.stride) else 1.0
    gram = factors.choose_gram([shape], gram_cost=slowdown * gram_cost)
    if gram or b <= UNFOLD_MAX_PATCH:
        full = x if not any(pad) else F.pad(x, [p for q in reversed(pad) for p in (q, q)])
        B = grad.reshape(N, g, a, L).transpose(2, 3).reshape(N * g, L, a)
        if gram:
            placeholder = torch.empty((), dtype=grad.dtype, device=grad.device).expand(N * g, L, b)
            out["weight"] = Pair(B, placeholder, fold=g,
                                 right_gram=_patch_gram(module, full, tuple(grad.shape[2:])),
                                 right_fn=lambda: _patches(module, full, N, g, b, L))
            return out
        if N * g * b * L * full.element_size() > UNFOLD_MAX_BYTES:
            out["weight"] = Materialized(_weight_grads(module, grad, x, pad, chunk=1))
            return out
        # small patches (a stem's 3 × 3 × 3): bmm of the unfolded input beats the grouped
        # weight-gradient convolution, which CPU libraries run slowly with N·g groups
        gw = torch.bmm(B.transpose(1, 2), _patches(module, full, N, g, b, L))
        out["weight"] = Materialized(gw.view(N, Cout, -1))
        return out
    per_example = Cout * (Cin // g) * math.prod(kernel) * grad.element_size()
    chunk = max(1, min(N, GROUPED_CHUNK_BYTES // per_example))
    out["weight"] = Materialized(_weight_grads(module, grad, x, pad, chunk=chunk))
    return out
