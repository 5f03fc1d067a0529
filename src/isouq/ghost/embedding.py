"""nn.Embedding: weight (V, d) gradient per example = Σₜ onehot(xₜ) bₜᵀ (index form).

Positions holding ``padding_idx`` get no gradient in autograd; they are masked here to match.
Subclasses that only scale the lookup by a constant ``embed_scale`` (Gemma's
``*ScaledWordEmbedding``) are exact with bₜ·scale; other subclasses that override ``forward``
get the fallback. ``max_norm`` (renormalizes the weight in place) and
``scale_grad_by_freq`` (scales by counts in the whole batch, so no per-example gradient
exists) have no rule: the generic fallback runs.
"""

from __future__ import annotations

import torch
from torch import nn

from .calls import Call
from .factors import Contribution, Pair
from .registry import register_rule


def _scale(module: nn.Module) -> float | None:
    """1.0 for a plain embedding, embed_scale for a scaled one, None if forward is unknown."""
    if type(module).forward is nn.Embedding.forward:
        return 1.0
    s = getattr(module, "embed_scale", None)
    if s is None or (isinstance(s, torch.Tensor) and s.numel() != 1):
        return None
    return float(s)


def applies(module: nn.Module) -> bool:
    """No rule for max_norm, scale_grad_by_freq or an unknown forward (fallback runs)."""
    return (
        isinstance(module, nn.Embedding)
        and module.max_norm is None
        and not module.scale_grad_by_freq
        and _scale(module) is not None
    )


@register_rule(nn.Embedding, applies=applies, subclasses=True, uses_output=False,
               reads_params=False)
def contributions(module: nn.Embedding, call: Call) -> dict[str, Contribution]:
    idx = call.args[0]
    N = idx.shape[0]
    idx = idx.reshape(N, -1)
    B = call.grad.reshape(N, idx.shape[1], -1)
    if module.padding_idx is not None:
        B = B.masked_fill((idx == module.padding_idx).unsqueeze(-1), 0)
    scale = _scale(module)
    if scale != 1.0:
        B = B * scale
    return {"weight": Pair(idx, B, index_size=module.num_embeddings, input_side="left")}
