"""A model's blocks: module paths that split its parameters into the embeddings, each layer of
its stack of repeated layers, the final norm and the head, so that ‖∇θ p̄‖² can be told block
by block (``score_sequences(..., blocks=True)``).

The rule, for a parameter named ``a.b.c.weight`` (``model.named_parameters()``):

- under a **stack** — an ``nn.ModuleList`` or ``nn.Sequential`` with ≥ 2 children that hold
  parameters (a decoder's ``model.layers``, GPT-2's ``transformer.h``) — its block is the stack's
  child it lives in (``model.layers.3``), whatever lies deeper (attention, MLP, a LoRA adapter, a
  quantized weight, an MoE expert); the outermost stack decides;
- otherwise its block is the module that holds it (``model.embed_tokens``, ``model.norm``,
  ``lm_head``).

A weight shared by two modules (a head tied to the embedding) is named once by PyTorch, so its
whole gradient — the embedding's and the head's contributions together — is its first name's
block (``model.embed_tokens``). A parameter held by the model itself (a root ``nn.Parameter``)
has no module path, and then the blocks cannot be named (:class:`~isouq.errors.ModelError`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import ModelError


@dataclass(frozen=True)
class Blocks:
    """``names``: the block module paths, in the model's order; ``of_param``: per scored
    parameter (in the order of the selection the map was made for) the index of its block."""

    names: tuple[str, ...]
    of_param: tuple[int, ...]

    def indicator(self, dtype=torch.float32) -> torch.Tensor:
        """(n_params, B) one-hot matrix: per-parameter norms @ it = per-block norms."""
        m = torch.zeros(len(self.of_param), len(self.names), dtype=dtype)
        m[torch.arange(len(self.of_param)), torch.tensor(self.of_param, dtype=torch.long)] = 1
        return m


def stacks(model: nn.Module) -> list[str]:
    """Module paths of the model's stacks of repeated layers (``nn.ModuleList``/
    ``nn.Sequential`` with ≥ 2 children holding parameters), outermost first."""
    out = []
    for path, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList | nn.Sequential):
            holding = [c for c in mod.children() if any(True for _ in c.parameters())]
            if len(holding) >= 2:
                out.append(path)
    return out


def block_of(name: str, stack_paths: list[str]) -> str:
    """The block of parameter ``name`` (module rule of this module's docstring); "" when the
    parameter sits on the model itself."""
    for s in stack_paths:  # outermost first: the first stack the name lies under
        prefix = f"{s}." if s else ""
        if name.startswith(prefix):
            child = name[len(prefix):].split(".", 1)
            if len(child) == 2:  # a parameter of a child, not of the stack module itself
                return prefix + child[0]
    return name.rsplit(".", 1)[0] if "." in name else ""


def block_map(model: nn.Module, names: list[str] | tuple[str, ...]) -> Blocks:
    """The blocks of the scored parameters ``names`` (as ``model.named_parameters()`` names
    them), in the model's order.

    Raises:
        ModelError: a parameter has no module path (it sits on the model itself), naming it
            and the fix.
    """
    stack_paths = stacks(model)
    found = {n: block_of(n, stack_paths) for n in names}
    rootless = [n for n, b in found.items() if not b]
    if rootless:
        raise ModelError(
            f"the blocks of this model cannot be named: parameter {rootless[0]!r} sits on the "
            "model itself, not in a submodule; hold it in a submodule (e.g. an nn.Linear or an "
            "nn.ParameterDict attribute) or score without blocks")
    order = {}
    for n, _ in model.named_parameters():  # the model's order, named once
        if n in found:
            order.setdefault(found[n], len(order))
    for n in names:  # names the model does not list (offloaded ties): after the rest
        order.setdefault(found[n], len(order))
    ordered = tuple(sorted(order, key=order.get))
    index = {b: i for i, b in enumerate(ordered)}
    return Blocks(ordered, tuple(index[found[n]] for n in names))


__all__ = ["Blocks", "block_map", "block_of", "stacks"]
