"""PEFT layers with a DoRA adapter (``LoraConfig(use_dora=True)``): the whole adapted layer.

With r = x Wᵀ + c the base layer's output (bias c), A, B the adapter's matrices, σ its scaling
and m its magnitude vector, peft computes

    y = r + (s − 1) ⊙ (r − c) + s ⊙ σ B A x,   s = m / ‖W + σ B A‖ (per output row),

the norm detached from the gradient (DoRA's section 4.3). The base bias c is read twice — by
the base layer and by the DoRA layer, which subtracts it — so the layer is scored as one
composite module: with b = ∂(Σ sᵢ)/∂y, per example,

- W: the base layer's own rule with output gradient b ⊙ s (``nn.Linear``, bitsandbytes 4/8-bit:
  the weight as dequantized); c: Σₜ bₜ (its two reads cancel but for the first);
- B: Σₜ (σ s ⊙ bₜ)(A xₜ)ᵀ and A: Σₜ Bᵀ(σ s ⊙ bₜ) xₜᵀ (``nn.Linear``'s rule on those factors);
- m: Σₜ bₜ ⊙ (yₜ − c) / m, since y − c = s ⊙ (x Wᵀ + σ B A x): no product with W recomputed.

One active DoRA adapter, unmerged, is covered, in eval mode or without dropout; otherwise (more
adapters at once, a magnitude entry of 0, a base layer without a rule) the exact generic
fallback differentiates the whole layer, with its one warning. Plain LoRA layers are not
affected (their ``nn.Linear`` parts have their own rules). Registered when the first PEFT LoRA
layer is looked up (``registry.register_package``): isouq never imports peft itself.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelError
from ..quantized import dequantized, is_quantized
from .calls import Call, as_tokens
from .factors import Contribution, Materialized, at_least_f32
from .linear import linear_contributions
from .registry import register_package, register_rule, rule_for
from .weights import resolve, rule_params


def has_dora(module: nn.Module) -> bool:
    """True for a PEFT LoRA layer holding a DoRA adapter (it then owns its children)."""
    return any(getattr(module, "use_dora", {}).values())


def _active(module: nn.Module) -> list[str]:
    return [a for a in module.active_adapters if a in module.lora_A]


def covered(module: nn.Module) -> bool:
    """One active DoRA adapter, unmerged, magnitudes without a 0, a base layer with a rule."""
    active = _active(module)
    if module.merged or module.disable_adapters or len(active) != 1:
        return False
    k = active[0]
    base = module.get_base_layer()
    return (bool(module.use_dora.get(k)) and base is module.base_layer
            and rule_for(base) is not None
            and bool(resolve(module, f"lora_magnitude_vector.{k}.weight").ne(0).all()))


def _norms(module: nn.Module, own: dict, k: str, dtype: torch.dtype) -> torch.Tensor:
    """‖W + σ B A‖ per output row, in the layer's dtype as peft computes it (float32 at least)."""
    base = module.base_layer
    # a quantized weight read from its layer: a detached copy would lose its quantization state
    w = dequantized(base.weight, base) if is_quantized(base.weight) else own["base_layer.weight"]
    w = w.T if module.fan_in_fan_out else w
    ba = own[f"lora_B.{k}.weight"] @ own[f"lora_A.{k}.weight"]
    full = w.to(dtype) + module.scaling[k] * ba.to(dtype)
    return at_least_f32(torch.linalg.norm(at_least_f32(full), dim=1))


def _dora_layer(module: nn.Module, call: Call) -> dict[str, Contribution]:
    """Every parameter of the layer: base weight and bias, lora_A, lora_B, the magnitude."""
    (k,) = _active(module)
    if module.training and not isinstance(module.lora_dropout[k], nn.Identity):
        raise ModelError("a DoRA layer with dropout in train mode scores a random mask: call "
                         "model.eval() first (isouq.score_sequences does)")
    own = rule_params(module, call, recurse=True)
    x, y, b = call.args[0].detach(), at_least_f32(call.output.detach()), at_least_f32(call.grad)
    m = at_least_f32(own[f"lora_magnitude_vector.{k}.weight"])
    s = m / _norms(module, own, k, x.dtype)
    bs = b * s
    base = module.base_layer
    out: dict[str, Contribution] = {
        f"base_layer.{n}": c
        for n, c in rule_for(base).contributions(base, Call(base, (x,), {}, None, bs)).items()}
    c = own.get("base_layer.bias")
    if c is not None:
        out["base_layer.bias"] = Materialized(as_tokens(b).sum(1))
        y = y - c
    A, B = module.lora_A[k], module.lora_B[k]
    xa = x.to(own[f"lora_A.{k}.weight"].dtype)
    h = xa @ own[f"lora_A.{k}.weight"].T
    gl = module.scaling[k] * bs
    for name, contrib in linear_contributions(h, gl, B.bias is not None).items():
        out[f"lora_B.{k}.{name}"] = contrib
    ga = gl @ at_least_f32(own[f"lora_B.{k}.weight"])
    for name, contrib in linear_contributions(xa, ga, A.bias is not None).items():
        out[f"lora_A.{k}.{name}"] = contrib
    out[f"lora_magnitude_vector.{k}.weight"] = Materialized((as_tokens(b) * as_tokens(y / m)).sum(1))
    return out


def register() -> None:
    """Register the rule for peft's LoRA linear layers (peft is loaded by then)."""
    from peft.tuners.lora import bnb, layer

    kinds = [layer.Linear] + [k for k in (getattr(bnb, "Linear8bitLt", None),
                                          getattr(bnb, "Linear4bit", None)) if k is not None]
    register_rule(*kinds, composite=has_dora, applies=covered)(_dora_layer)


register_package("peft.tuners.lora.", register)  # on meeting the first LoRA layer
