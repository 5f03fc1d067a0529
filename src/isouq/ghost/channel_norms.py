"""BatchNorm (eval mode), GroupNorm and InstanceNorm: per-channel affine parameters.

y = x̂ · w[c] + b[c] with x̂ the input normalized per channel c (dim 1): by the running
statistics (BatchNorm in eval mode, InstanceNorm with ``track_running_stats`` in eval mode), or
by each example's own statistics (GroupNorm, InstanceNorm otherwise). Per example:
g_w = Σ_positions x̂ ⊙ b and g_b = Σ_positions b, each (N, C): materialized, the cheapest form
(a Gram over positions never is). x̂ is recomputed from the recorded input with the
normalization alone, which costs less than one forward of the layer.

BatchNorm normalizing by batch statistics (training mode, or ``track_running_stats=False``)
makes every example's output depend on the whole batch: no per-example gradient exists, and
the rule refuses it with an error naming the fix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..errors import ModelError
from .calls import Call
from .factors import Contribution, Materialized, at_least_f32
from .registry import register_rule


def _affine(module: nn.Module, xhat: torch.Tensor, grad: torch.Tensor) -> dict[str, Contribution]:
    grad = at_least_f32(grad)  # half-precision models: every term in float32
    N, C = grad.shape[0], grad.shape[1]
    b = grad.reshape(N, C, -1)
    out: dict[str, Contribution] = {}
    if module.weight is not None:  # Σ_positions x̂ b per (example, channel)
        xh = xhat.to(grad.dtype).reshape(N, C, -1)
        out["weight"] = Materialized(torch.linalg.vecdot(xh, b))
    if module.bias is not None:
        out["bias"] = Materialized(b.sum(-1))
    return out


@register_rule(_BatchNorm)
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
    x = at_least_f32(call.args[0])
    with torch.no_grad():  # x̂ by the running statistics, in one fused pass
        xhat = F.batch_norm(x, at_least_f32(module.running_mean), at_least_f32(module.running_var),
                            None, None, False, 0.0, module.eps)
    return _affine(module, xhat, call.grad)


@register_rule(nn.GroupNorm)
def group_norm(module: nn.GroupNorm, call: Call) -> dict[str, Contribution]:
    """GroupNorm: each example normalized by its own group statistics."""
    x = at_least_f32(call.args[0])
    with torch.no_grad():
        xhat = F.group_norm(x, module.num_groups, None, None, module.eps)
    return _affine(module, xhat, call.grad)


@register_rule(_InstanceNorm)
def instance_norm(module: _InstanceNorm, call: Call) -> dict[str, Contribution]:
    """InstanceNorm1d/2d/3d with affine=True (per-example statistics, or running ones)."""
    x = at_least_f32(call.args[0])
    if x.ndim == module._get_no_batch_dim():
        raise ModelError(f"{type(module).__name__} got an unbatched input {tuple(x.shape)}; "
                         "ghost norms need a batch dimension first: pass (N, C, ...)")
    running = not module.training and module.track_running_stats and module.running_mean is not None
    with torch.no_grad():
        if running:
            xhat = F.instance_norm(x, at_least_f32(module.running_mean),
                                   at_least_f32(module.running_var), None, None, False, 0.0,
                                   module.eps)
        else:
            xhat = F.instance_norm(x, None, None, None, None, True, 0.0, module.eps)
    return _affine(module, xhat, call.grad)
