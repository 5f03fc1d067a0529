"""BatchNorm (eval mode), GroupNorm and InstanceNorm: per-channel affine parameters.

y = x̂ · w[c] + b[c] with x̂ the input normalized per channel c (dim 1): by the running
statistics (BatchNorm in eval mode, InstanceNorm with ``track_running_stats`` in eval mode), or
by each example's own statistics (GroupNorm, InstanceNorm otherwise). Per example:
g_w = Σ_positions x̂ ⊙ b and g_b = Σ_positions b, each (N, C): materialized, the cheapest form
(a Gram over positions never is).

On CPU both sums come from ONE call of the layer's own fused backward kernel with the examples
folded into the channels: the input (N, C, *positions) is read as one example with N·C channels
(a view for contiguous inputs), normalized by a mean and 1/σ per (example, channel) (the running
statistics repeated per example, or each example's own), so the kernel's "weight gradient" of
the folded layer is the per-example g_w, and its "bias gradient" g_b. One pass over x and b,
with x̂ never written out (the BatchNorm rules of the ResNet of ``benchmarks/classifiers.py``:
10 ms per call on CPU, against 17-18 ms for normalizing, then reducing). On other devices
(CUDA's form of that kernel asks for statistics the CPU one does not) x̂ ⊙ b is formed and
reduced, one memory-bound pass of the same sums.

BatchNorm normalizing by batch statistics (training mode, or ``track_running_stats=False``)
makes every example's output depend on the whole batch: no per-example gradient exists, and
the rule refuses it with an error naming the fix.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..errors import ModelError
from .calls import Call
from .factors import Contribution, Materialized, at_least_f32
from .registry import register_rule
from .weights import resolve


def _folded(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *positions) as one example of N·C channels: (1, N·C, *positions)."""
    return t.reshape(1, t.shape[0] * t.shape[1], *t.shape[2:])


def _contributions(module: nn.Module, g_w: torch.Tensor, g_b: torch.Tensor, N: int
                   ) -> dict[str, Contribution]:
    out: dict[str, Contribution] = {}
    if module.weight is not None:
        out["weight"] = Materialized(g_w.view(N, -1))
    if module.bias is not None:
        out["bias"] = Materialized(g_b.view(N, -1))
    return out


#: devices whose fused batch-norm backward kernel takes the statistics as given (CUDA's
#: asserts on ones this call leaves out; there the sums are formed directly)
FUSED_DEVICES = ("cpu",)


def _by_channel_stats(module: nn.Module, x: torch.Tensor, grad: torch.Tensor,
                      mean: torch.Tensor, invstd: torch.Tensor) -> dict[str, Contribution]:
    """Per-example (g_w, g_b) for x̂ = (x − mean) · invstd, mean and invstd (N·C,) per
    (example, channel): the fused kernel on the folded input (``FUSED_DEVICES``), else
    normalize and reduce."""
    N = grad.shape[0]
    if x.device.type in FUSED_DEVICES:  # train=True: the kernel reads the statistics given
        _, g_w, g_b = torch.ops.aten.native_batch_norm_backward(
            _folded(grad), _folded(x), None, None, None, mean, invstd, True, module.eps,
            [False, True, True])
        return _contributions(module, g_w, g_b, N)
    xs, gs = x.reshape(N * x.shape[1], -1), grad.reshape(N * grad.shape[1], -1)
    g_w = ((xs - mean[:, None]) * invstd[:, None] * gs).sum(1)
    return _contributions(module, g_w, gs.sum(1), N)


def _running(module: nn.Module, N: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The running mean and 1/√(var + eps), repeated per example: (N·C,) each."""
    mean, var = (resolve(module, n).to(dtype) for n in ("running_mean", "running_var"))
    return mean.repeat(N), torch.rsqrt(var + module.eps).repeat(N)


@register_rule(_BatchNorm, uses_output=False, reads_params=False)
def batch_norm(module: _BatchNorm, call: Call) -> dict[str, Contribution]:
    """BatchNorm1d/2d/3d in eval mode (running statistics)."""
    if module.training or module.running_mean is None:
        fix = ("score in eval mode (model.eval(); score_classifier does), where it uses its "
               "running statistics" if module.training else
               "train it with track_running_stats=True and score in eval mode, or use "
               "GroupNorm/LayerNorm")
        state = "in training mode" if module.training else "with track_running_stats=False"
        raise ModelError(
            f"{type(module).__name__} {state} normalizes by the batch's statistics: each "
            "example's output depends on the others "
            f"(a layer that mixes examples), so no per-example gradient exists; {fix}"
        )
    grad = at_least_f32(call.grad)  # half-precision models: every term in float32
    with torch.no_grad():
        return _by_channel_stats(module, call.args[0].to(grad.dtype), grad,
                                 *_running(module, grad.shape[0], grad.dtype))


def _own_stats(x: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/√(var + eps) (biased variance) of each (example, group): (N·groups,)."""
    var, mean = torch.var_mean(x.reshape(x.shape[0] * groups, -1), dim=1, correction=0)
    return mean, torch.rsqrt(var + eps)


@register_rule(nn.GroupNorm, uses_output=False, reads_params=False)
def group_norm(module: nn.GroupNorm, call: Call) -> dict[str, Contribution]:
    """GroupNorm: each example normalized by its own group statistics."""
    grad = at_least_f32(call.grad)
    x = call.args[0].to(grad.dtype)
    N, C, G = x.shape[0], x.shape[1], module.num_groups
    with torch.no_grad():
        mean, rstd = _own_stats(x, G, module.eps)
        _, g_w, g_b = torch.ops.aten.native_group_norm_backward(
            _folded(grad), _folded(x), mean.view(1, N * G), rstd.view(1, N * G),
            grad.new_ones(()).expand(N * C), 1, N * C, x[0, 0].numel(), N * G,
            [False, True, True])  # γ = 1: the kernel's dγ = Σ x̂ b does not depend on γ
    return _contributions(module, g_w, g_b, N)


@register_rule(_InstanceNorm, uses_output=False, reads_params=False)
def instance_norm(module: _InstanceNorm, call: Call) -> dict[str, Contribution]:
    """InstanceNorm1d/2d/3d with affine=True (per-example statistics, or running ones)."""
    grad = at_least_f32(call.grad)
    x = call.args[0]
    if x.ndim == module._get_no_batch_dim():
        raise ModelError(f"{type(module).__name__} got an unbatched input {tuple(x.shape)}; "
                         "ghost norms need a batch dimension first: pass (N, C, ...)")
    x = x.to(grad.dtype)
    running = not module.training and module.track_running_stats and module.running_mean is not None
    with torch.no_grad():
        stats = (_running(module, x.shape[0], grad.dtype) if running
                 else _own_stats(x, x.shape[1], module.eps))
        return _by_channel_stats(module, x, grad, *stats)
