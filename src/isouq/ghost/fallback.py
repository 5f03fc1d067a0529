"""Exact per-example gradients for any module without a rule (slower; a warning says so).

Re-runs the module's forward on the recorded inputs with its own parameters differentiable,
then one batched backward (``is_grads_batched``) with cotangent rows that keep example i only.
Memory grows with N² × output size, so examples go in chunks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from .calls import Call
from .factors import Contribution, Materialized
from .weights import is_offloaded, resolve, rule_params, unhooked

CHUNK = 8


def contributions(module: nn.Module, call: Call, names: list[str]) -> dict[str, Contribution]:
    """Per-example gradients (N, *shape) of the parameters ``names`` (dotted, local)."""
    # recursive: a composite layer (nn.MultiheadAttention) owns its children's parameters
    # offloaded (accelerate) or sharded (FSDP2) weights as the forward had them; offloaded
    # buffers too, since the forward runs without accelerate's hook
    own = rule_params(module, call, recurse=True)
    bufs = {n: resolve(module, n, b) for n, b in module.named_buffers() if is_offloaded(b)}
    grads = {n: [] for n in names}
    N = call.grad.shape[0]
    with torch.enable_grad(), unhooked(module):
        theta = {n: (own[n].clone().requires_grad_(True) if n in names else own[n]) for n in own}
        out = functional_call(module, {**bufs, **theta}, call.args, call.kwargs)
        out = out[0] if isinstance(out, tuple | list) else out
        for s in range(0, N, CHUNK):
            rows = range(s, min(s + CHUNK, N))
            cot = call.grad.new_zeros(len(rows), *call.grad.shape)
            for j, i in enumerate(rows):
                cot[j, i] = call.grad[i]
            gs = torch.autograd.grad(
                out, [theta[n] for n in names], cot, is_grads_batched=True,
                retain_graph=True, allow_unused=True,
            )
            for n, g in zip(names, gs, strict=False):
                g = cot.new_zeros(len(rows), *own[n].shape) if g is None else g
                grads[n].append(g)
    return {n: Materialized(torch.cat(v)) for n, v in grads.items()}
