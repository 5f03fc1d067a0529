"""LayerNorm / RMSNorm weights and biases (torch's and every Hugging Face ``*RMSNorm``).

Such parameters act elementwise on the normalized trailing dims and affinely:
yₜⱼ = αₜⱼ wⱼ + βₜⱼ (w·x̂, (1 + w)·x̂ as in Gemma, w·x̂ + b for LayerNorm; float32 upcasts do
not matter), j running over ``normalized_shape`` (any number of trailing dims). So
∂yₜ/∂w = f(w + 1) − f(w), one plain forward of the module on the recorded input, minus the
recorded output, whatever the exact formula (for a half-precision layer both terms are
evaluated on a float32 copy: a difference of two rounded outputs would keep few digits).
Per example: gᵢ = Σₜ (∂yₜ/∂w) ⊙ bₜ, shape (N, *w.shape), t running over the leading dims
between the batch and the normalized ones.

The fast path: for a weight that scales the normalized input, ∂y/∂w = x̂, one fused kernel
(``F.rms_norm`` / ``F.layer_norm`` without affine parameters, half the time of the module's own
forward as Hugging Face writes it), and ∂y/∂b = 1. Which formula a module follows is not
assumed from its name: on its first call (per module and dtype) both paths run and the fast
one is kept only if it gives the same ∂y/∂w as f(w + 1) − f(w); otherwise the module stays on
the general path. A bias-free norm (RMSNorm) whose output is exactly y = w ⊙ x̂ (also checked
on the first call: Gemma's (1 + w) ⊙ x̂ is not) needs no x̂ at all in float32/64:
gᵢ = (Σₜ bₜ ⊙ yₜ) / w from the recorded output, one multiply-and-sum (SmolLM2's 61 norms, batch
of 16 on CPU: 0.05 s against 0.08 s with the fused x̂), used while every |wⱼ| is a normal
number (no division by zero or by a subnormal).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..errors import ModelError
from .calls import Call
from .factors import LOW_PRECISION, Contribution, Materialized, at_least_f32
from .registry import register_rule
from .weights import rule_params, unhooked

_NAMES = ("LayerNorm", "RMSNorm")
#: a module's attribute {dtype: the formula ("rms"/"layer") whose fused x̂ matched
#: f(w + 1) − f(w) on the module's first call in that dtype, or None: the general path}
_FAST_CHECKED = "_isouq_norm_fast"
#: a module's attribute {dtype: whether y = w ⊙ x̂ held on the first call (then
#: gᵢ = Σₜ bₜ ⊙ yₜ / w)}. Both live on the module, not in a module-global table: a captured
#: backward (``isouq.capture``) reads them as the module's own state, not through a table of
#: every module scored so far.
_SCALES_OUTPUT = "_isouq_norm_scales_output"


def _memo(module: nn.Module, name: str) -> dict:
    """The module's memo ``name`` (:data:`_FAST_CHECKED`, :data:`_SCALES_OUTPUT`), made on first
    use."""
    memo = module.__dict__.get(name)
    if memo is None:
        memo = module.__dict__[name] = {}
    return memo


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


def _eps(module: nn.Module, dtype: torch.dtype) -> float | None:
    """The module's ε (torch's ``eps``, Hugging Face's ``variance_epsilon``); None if unknown."""
    for attr in ("eps", "variance_epsilon", "epsilon"):
        v = getattr(module, attr, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    if isinstance(module, nn.RMSNorm):  # eps=None: the input dtype's machine epsilon
        return torch.finfo(dtype).eps
    return None


def _kinds(module: nn.Module) -> tuple[str, ...]:
    """Candidate formulas for x̂, in the order tried: "rms" (x / rms(x)), "layer" ((x − mean) /
    std). A name ending in LayerNorm may still be an RMS norm (T5LayerNorm)."""
    return ("rms",) if type(module).__name__.endswith("RMSNorm") else ("layer", "rms")


def _fast_derivatives(module: nn.Module, x: torch.Tensor, names: list[str], shape: tuple,
                      kind: str) -> dict[str, torch.Tensor] | None:
    """∂y/∂w = x̂ for ``weight``, 1 for ``bias``, by the fused normalization of x of the
    ``kind`` formula (float32 for a half-precision input, as the general path); None when the
    module's ε is unknown or it has other parameters."""
    eps = _eps(module, x.dtype)
    if eps is None or not set(names) <= {"weight", "bias"}:
        return None
    x32 = at_least_f32(x)
    xhat = (F.rms_norm(x32, shape, eps=eps) if kind == "rms"
            else F.layer_norm(x32, shape, eps=eps))
    return {n: xhat if n == "weight" else torch.ones((), dtype=xhat.dtype, device=xhat.device)
            for n in names}


def _general_derivative(module: nn.Module, call: Call, own: dict, name: str,
                        dtype: torch.dtype) -> torch.Tensor:
    """f(w + 1) − f(w) for parameter ``name``, in float32 for half precision."""
    x = call.args[0]
    w = own[name]
    if w.dtype in LOW_PRECISION or x.dtype in LOW_PRECISION:
        # f(w + 1) − f(w) both in float32: a difference of two rounded half-precision
        # outputs would keep only a few digits of ∂y/∂w
        own32 = {n: p.float() for n, p in own.items()}
        with _dtype_eps(module, x.dtype), unhooked(module):
            f = lambda params: functional_call(module, params, (x.float(),), call.kwargs)  # noqa: E731
            return f({**own32, name: own32[name] + 1}) - f(own32)
    with unhooked(module):  # accelerate's hook would put its offloaded weights in place
        shifted = functional_call(module, {**own, name: w + 1}, (x,), call.kwargs)
    return shifted.to(dtype) - call.output.detach().to(dtype)


def _agree(fast: torch.Tensor, general: torch.Tensor) -> bool:
    """Same ∂y/∂w up to the rounding of f(w + 1) − f(w) (a wrong formula is off by O(1))."""
    fast = fast.expand_as(general)
    scale = float(general.abs().max()) if general.numel() else 0.0
    tol = 1e-3 * max(scale, 1e-12)
    return bool(torch.isfinite(general).all()) and float((fast - general).abs().max()) <= tol


def _derivatives(module: nn.Module, call: Call, own: dict, shapes: set
                 ) -> dict[str, torch.Tensor]:
    """∂y/∂w of every parameter: the fused x̂ of the formula this module was found to follow on
    its first call in this dtype (both paths compared then), else f(w + 1) − f(w)."""
    x = call.args[0]

    def general() -> dict[str, torch.Tensor]:
        return {n: _general_derivative(module, call, own, n, call.grad.dtype) for n in own}

    if len(shapes) != 1 or call.kwargs:
        return general()
    shape = next(iter(shapes))
    checked = _memo(module, _FAST_CHECKED)
    if x.dtype in checked:
        kind = checked[x.dtype]
        return general() if kind is None else _fast_derivatives(module, x, list(own), shape, kind)
    checked[x.dtype] = None
    exact = general()
    for kind in _kinds(module):
        fast = _fast_derivatives(module, x, list(own), shape, kind)
        if fast is None:
            break
        if all(_agree(fast[n], exact[n]) for n in own):
            checked[x.dtype] = kind
            return fast
    return exact


#: module -> ((weight version, address), 1/w when every |wⱼ| is a normal number, else None):
#: read once per weight state, not per call (a host synchronization per norm layer stalls a
#: GPU's queue), and 1/w made once with it
_INVERSE_WEIGHT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _inverse(module: nn.Module, call: Call, own: dict) -> torch.Tensor | None:
    """1/w when gᵢ may come from the output divided by w: a lone float32/64 weight over the
    output's trailing dims, every |wⱼ| a normal number; else None."""
    w, y = own.get("weight"), call.output
    if (set(own) != {"weight"} or y.dtype not in (torch.float32, torch.float64)
            or w.dtype != y.dtype or tuple(y.shape[y.ndim - w.ndim:]) != tuple(w.shape)):
        return None
    key = (w._version, w.data_ptr())
    hit = _INVERSE_WEIGHT.get(module)
    if hit is None or hit[0] != key:  # NaN: not normal
        normal = torch.finfo(w.dtype).tiny <= float(w.abs().min()) < float("inf")
        hit = (key, w.reciprocal() if normal else None)
        _INVERSE_WEIGHT[module] = hit
    return hit[1]


def before_backward(module: nn.Module, call: Call) -> None:
    """1/w of a module found to scale its output (``_SCALES_OUTPUT``), into ``call.extra``
    before the backward: its cache is keyed by the weight's storage, which a captured backward
    cannot read (``isouq.capture``)."""
    if _memo(module, _SCALES_OUTPUT).get(call.args[0].dtype) and call.output is not None:
        call.extra["inverse"] = _inverse(module, call, rule_params(module, call))


@register_rule(nn.LayerNorm, nn.RMSNorm, match=_by_name, applies=applies, subclasses=True,
               before_backward=before_backward)
def contributions(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """Per-example gradient of each affine parameter, materialized: (N, *w.shape)."""
    own = rule_params(module, call)  # offloaded or sharded weights: as the forward had them
    grad = call.grad
    N = grad.shape[0]
    shapes = {tuple(w.shape) for w in own.values()}
    for name, w in own.items():
        k = w.ndim
        if grad.ndim < k + 1 or tuple(grad.shape[grad.ndim - k:]) != tuple(w.shape):
            raise ModelError(f"{type(module).__name__}.{name} {tuple(w.shape)} does not act on "
                             f"the trailing dims of its output {tuple(grad.shape)}")
    b = grad  # multiplied by float32 (or wider) derivatives: the products are float32
    with torch.no_grad():
        dtype, y = call.args[0].dtype, call.output.detach()
        scales = _memo(module, _SCALES_OUTPUT)
        inverse = (call.extra["inverse"] if "inverse" in call.extra
                   else _inverse(module, call, own) if scales.get(dtype) else None)
        if inverse is not None:  # gᵢ = (Σₜ bₜ ⊙ yₜ) ⊙ 1/w: the scale applied where it is read
            w = own["weight"]
            return {"weight": Materialized((b * y).reshape(N, -1, w.numel()).sum(1),
                                           scale=inverse.reshape(-1))}
        derivatives = _derivatives(module, call, own, shapes)
        if dtype not in scales:  # first call: y = w ⊙ x̂ exactly, with x̂ the verified fused one?
            scales[dtype] = (_memo(module, _FAST_CHECKED).get(dtype) is not None
                             and _inverse(module, call, own) is not None
                             and _agree(y / own["weight"], derivatives["weight"]))
        out: dict[str, Contribution] = {}
        for name, w in own.items():
            D = derivatives[name]
            if D.ndim == 0:  # ∂y/∂b = 1: gᵢ = Σₜ bₜ
                g = b.reshape(N, -1, w.numel()).sum(1, dtype=torch.promote_types(b.dtype, D.dtype))
            else:
                g = (at_least_f32(D) * b).reshape(N, -1, w.numel()).sum(1)
            out[name] = Materialized(g)
    return out
