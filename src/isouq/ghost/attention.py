"""nn.MultiheadAttention: its own parameters, exactly, from the gradient at its output.

The projections are Linear maps inside the layer: q = x_q W_qᵀ + b_q (likewise k, v) and
y = z W_oᵀ + b_o, z the heads' concatenated attention output. Their per-example gradients
need the gradients at q, k, v and z, which autograd does not expose: the rule recomputes the
layer from its recorded inputs with the weights fixed (projections outside, the attention
itself by ``F.multi_head_attention_forward`` with identity projections, so masks, causality
and ``add_zero_attn`` behave as in the layer), and one local backward of the recorded output
gradient gives ∂/∂q, ∂/∂k, ∂/∂v; ∂/∂z = b W_o. Then every weight is a Pair (Gram or
materialized by the cost rule):
- ``in_proj_weight`` (3E, E): self-attention (query = key = value) Pair([g_q g_k g_v], x);
  otherwise the three blocks stacked over positions, Pair(blockdiag rows, [x_q; x_k; x_v]);
- separate ``q/k/v_proj_weight``: Pair(g_q, x_q), Pair(g_k, x_k), Pair(g_v, x_v);
- ``out_proj.weight``: Pair(b, z); biases materialized (sums over positions).
Needs ``batch_first=True`` and no ``add_bias_kv`` (other layers use the exact fallback, and
``score_classifier`` says how to change a ``batch_first=False`` layer); dropout must be off
(eval mode), since a recomputation would draw other masks.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelError
from .calls import Call
from .factors import Contribution, Materialized, Pair, at_least_f32
from .registry import register_rule
from .weights import rule_params

_SIG = inspect.signature(nn.MultiheadAttention.forward)


def applies(module: nn.MultiheadAttention) -> bool:
    """batch_first layers without add_bias_kv (the rule's scope)."""
    return bool(module.batch_first) and module.bias_k is None and module.bias_v is None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


@register_rule(nn.MultiheadAttention, composite=True, applies=applies, uses_output=False)
def contributions(module: nn.MultiheadAttention, call: Call) -> dict[str, Contribution]:
    """in_proj (or q/k/v_proj) weight and bias, out_proj weight and bias, per example."""
    if module.training and module.dropout > 0:
        raise ModelError("nn.MultiheadAttention with dropout in training mode: each example's "
                         "gradient depends on random masks; score in eval mode (model.eval())")
    bound = _SIG.bind(module, *call.args, **call.kwargs)
    bound.apply_defaults()
    arg = bound.arguments
    query, key, value = arg["query"], arg["key"], arg["value"]
    if query.ndim != 3:
        raise ModelError(f"nn.MultiheadAttention got an unbatched query {tuple(query.shape)}: "
                         "ghost norms need (N, L, E) inputs with batch_first=True")
    B = at_least_f32(call.grad)  # (N, L, E), batch first; float32 for half-precision models
    dt = B.dtype
    query, key, value = (t.detach().to(dt) for t in (query, key, value))
    E, H = module.embed_dim, module.num_heads
    own = {n: p.to(dt) for n, p in rule_params(module, call, recurse=True).items()}
    if module._qkv_same_embed_dim:
        Wq, Wk, Wv = own["in_proj_weight"].chunk(3)
    else:
        Wq, Wk, Wv = own["q_proj_weight"], own["k_proj_weight"], own["v_proj_weight"]
    bq = bk = bv = None
    if "in_proj_bias" in own:
        bq, bk, bv = own["in_proj_bias"].chunk(3)
    eye = torch.eye(E, dtype=dt, device=B.device)
    with torch.enable_grad():
        q = F.linear(query, Wq, bq).requires_grad_(True)
        k = F.linear(key, Wk, bk).requires_grad_(True)
        v = F.linear(value, Wv, bv).requires_grad_(True)
        z, _ = F.multi_head_attention_forward(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), E, H,
            None, None, None, None, module.add_zero_attn, 0.0, eye, None, training=False,
            key_padding_mask=arg["key_padding_mask"], need_weights=bool(arg["need_weights"]),
            attn_mask=arg["attn_mask"], use_separate_proj_weight=True,
            q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye,
            average_attn_weights=bool(arg["average_attn_weights"]), is_causal=bool(arg["is_causal"]),
        )
        z = z.transpose(0, 1)  # (N, L, E)
        gz = B @ own["out_proj.weight"]
        gq, gk, gv = torch.autograd.grad(z, (q, k, v), gz, allow_unused=True)
    gq, gk, gv = (torch.zeros_like(t) if g is None else g for g, t in ((gq, q), (gk, k), (gv, v)))
    out: dict[str, Contribution] = {"out_proj.weight": Pair(B, z.detach())}
    if "out_proj.bias" in own:
        out["out_proj.bias"] = Materialized(B.sum(1))
    if "in_proj_bias" in own:
        out["in_proj_bias"] = Materialized(torch.cat([gq.sum(1), gk.sum(1), gv.sum(1)], -1))
    if module._qkv_same_embed_dim:
        if _same(query, key) and _same(key, value):
            out["in_proj_weight"] = Pair(torch.cat([gq, gk, gv], -1), query)
        else:  # block rows: position t of segment s only feeds the rows of block s
            N, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
            left = gq.new_zeros(N, Lq + 2 * Lk, 3 * E)
            left[:, :Lq, :E] = gq
            left[:, Lq:Lq + Lk, E:2 * E] = gk
            left[:, Lq + Lk:, 2 * E:] = gv
            out["in_proj_weight"] = Pair(left, torch.cat([query, key, value], 1))
    else:
        out["q_proj_weight"] = Pair(gq, query)
        out["k_proj_weight"] = Pair(gk, key)
        out["v_proj_weight"] = Pair(gv, value)
    return out
