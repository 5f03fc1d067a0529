"""LayerNorm / RMSNorm weights and biases (torch's and every Hugging Face ``*RMSNorm``).

Such parameters act elementwise on the normalized trailing dims and affinely:
yₜⱼ = αₜⱼ wⱼ + βₜⱼ (w·x̂, (1 + w)·x̂ as in Gemma, w·x̂ + b for LayerNorm; float32 upcasts do
not matter), j running over ``normalized_shape`` (any number of trailing dims). So
∂yₜ/∂w = f(w + 1) − f(w), one plain forward of the module on the recorded input, minus the
recorded output, whatever the exact formula (for a half-precision layer both terms are
evaluated on a float32 copy: a difference of two rounded outputs would keep few digits).
Per example: gᵢ = Σₜ (∂yₜ/∂w) ⊙ bₜ, shape (N, *w.shape), t running over the leading dims
between the batch and the normalized ones.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call

from .calls import Call
from .factors import LOW_PRECISION, Contribution, Materialized, at_least_f32
from .registry import register_rule

_NAMES = ("LayerNorm", "RMSNorm")


def _by_name(module: nn.Module) -> bool:
    return type(module).__name__.endswith(_NAMES)


def applies(module: nn.Module) -> bool:
    """A rule needs parameters; each acts on the trailing dims (checked per call)."""
    return any(True for _ in module.parameters(recurse=False))


@contextmanager
def _dtype_eps(module: nn.Module, dtype: torch.dtype):
    """torch's RMSNorm with ``eps=None`` uses the input dtype's machine epsilon: keep the one of
    the recorded (half-precision) call while the float32 copy runs."""
    if not (isinstance(module, nn.RMSNorm) and module.eps is None):
        yield
        return
    module.eps = torch.finfo(dtype).eps
    try:
        yield
    finally:
        module.eps = None


@register_rule(nn.LayerNorm, nn.RMSNorm, match=_by_name, applies=applies, subclasses=True)
def contributions(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """Per-example gradient of each affine parameter, materialized: (N, *w.shape)."""
    x = call.args[0]
    own = {n: p.detach() for n, p in module.named_parameters(recurse=False)}
    grad = call.grad
    N = grad.shape[0]
    out: dict[str, Contribution] = {}
    for name, w in own.items():
        k = w.ndim
        if grad.ndim < k + 1 or tuple(grad.shape[grad.ndim - k:]) != tuple(w.shape):
            raise ValueError(f"{type(module).__name__}.{name} {tuple(w.shape)} does not act on "
                             f"the trailing dims of its output {tuple(grad.shape)}")
        with torch.no_grad():
            if w.dtype in LOW_PRECISION or x.dtype in LOW_PRECISION:
                # f(w + 1) − f(w) both in float32: a difference of two rounded half-precision
                # outputs would keep only a few digits of ∂y/∂w
                own32 = {n: p.float() for n, p in own.items()}
                with _dtype_eps(module, x.dtype):
                    f = lambda params: functional_call(module, params, (x.float(),), call.kwargs)  # noqa: E731
                    D = f({**own32, name: own32[name] + 1}) - f(own32)
            else:
                shifted = functional_call(module, {**own, name: w + 1}, (x,), call.kwargs)
                D = shifted.to(grad.dtype) - call.output.detach().to(grad.dtype)
        g = (D * at_least_f32(grad)).reshape(N, -1, w.numel()).sum(1)
        out[name] = Materialized(g)
    return out
