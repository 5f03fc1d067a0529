"""What a forward hook records about one call of a hooked module."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import InputError


@dataclass
class Call:
    """One forward call: the module, its inputs, and (after backward) d(Σ sᵢ)/d(output).

    Tensors are batch-first: dim 0 indexes the examples.
    """

    module: nn.Module
    args: tuple
    kwargs: dict
    output: torch.Tensor
    grad: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    #: the model's output layer (a language model's head, ``get_output_embeddings``): its output
    #: gradient is zero outside the scored positions, which a rule may drop (``Pair.compacted``)
    sparse_output: bool = False
    #: for the output layer, when the caller knows them (``GhostNorms.head_positions``): (N, K)
    #: positions of its output's dim 1 that may carry gradient, each row's, padded with ones
    #: that carry none; None: a rule reads them from the gradient
    positions: torch.Tensor | None = None
    #: the call's place among the forward's recorded calls (the same for every batch of a
    #: model): what the backward's bookkeeping keys a call by, not the object's identity
    index: int = -1


def as_tokens(t: torch.Tensor) -> torch.Tensor:
    """(N, ..., d) -> (N, T, d): every position between batch and feature dims is a 'token'."""
    if t.ndim < 2:
        raise InputError("ghost norms need batch-first inputs of at least 2 dims (N, ..., d); "
                         "add the batch dimension (x[None]) for a single example")
    return t.reshape(t.shape[0], -1, t.shape[-1])
