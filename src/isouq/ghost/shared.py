"""Layers that read one input tensor: one Gram of it per backward, one cost rule for them all.

In a transformer block q_proj, k_proj and v_proj read the same tensor, as do gate_proj and
up_proj (and a PEFT LoRA layer's base layer and its A). With gₚ = Bₚᵀ A for each such weight
(B: the layer's output gradient, A: the shared input, (N, T, ·) per example) the Gram form needs
A Aᵀ once for the whole group, and the squared norms are

- per parameter (``GhostNorms.backward_detailed``): ⟨Bₚ Bₚᵀ, A Aᵀ⟩ for each p;
- summed (``GhostNorms.backward``, ``score_sequences`` without ``per_param``: the total only):
  ⟨Σₚ Bₚ Bₚᵀ, A Aᵀ⟩, one inner product per group; on CUDA Σₚ Bₚ Bₚᵀ is one product of the
  output gradients side by side, [B₁ … Bₘ] (``CONCAT_DEVICES``).

The cost rule is the group's (:func:`gram_plan`): once A Aᵀ is paid for, another member's Gram
form costs only its own T² bₚ against T bₚ d to materialize (d: A's width), so the members for
which that is cheaper take the Gram form together when the group as a whole costs less that way
than materializing every member (or when a member's materialized block would pass the memory
cap); the others materialize. A group of one follows the per-parameter rule
(``factors.choose_gram``) exactly.

Membership is fixed before the backward from the recorded calls: calls whose first argument is
the same tensor (device, address, shape, strides, dtype and version; every call holds its input,
so no other tensor can take that address meanwhile). The engine hands a member's contributions
over when its output gradient arrives (:meth:`SharedInputs.add`); a group is computed as soon as
its last member has arrived, then released (the input and its Gram are not held to the end of
the backward). Members are sorted further by what their Pair actually multiplies (its
``source`` where the rule names it: the recorded input as it is or cast to one dtype, equal
values; else the tensor's storage: a rule that rounds the input makes another), so only
identical factors share a Gram. Only what
``sq_norms`` would compute from one dense Pair joins: a weight used by several calls (tied,
reused) needs its cross terms and stays out, as do embedding indices, folded groups and Grams a
rule gives itself.

Every Gram here is symmetric: with ``factors.GRAM_BLOCKS`` = k > 1 (environment variable
``ISOUQ_GHOST_GRAM_BLOCKS``) the T positions are split into k blocks and only the blocks on and
above the diagonal are multiplied ((k + 1) / 2k of the products, in k (k + 1) / 2 smaller
ones); the inner product counts the blocks above the diagonal twice. The default, 1, is the
whole Gram in one product.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from . import factors
from .calls import Call
from .factors import Contribution, Pair, block_gram, block_gram_inner, storage_key
from .reduction import Reduction

#: devices on which a group's summed output-gradient Gram Σₚ Bₚ Bₚᵀ is one product of the
#: gradients side by side, [B₁ … Bₘ]: one kernel launch instead of m products and m − 1 sums,
#: for one copy of the gradients. On CUDA a batch is bound by its launches; on the CPU the copy
#: costs more than it saves (the same arithmetic either way)
CONCAT_DEVICES = {"cuda"}


def joins(c: Contribution) -> bool:
    """Whether a contribution may share its input's Gram: one dense Pair, nothing folded or
    given by the rule in Gram form."""
    return (isinstance(c, Pair) and not c.is_index and c.fold == 1 and c.right_gram is None
            and c.right_fn is None)


def input_factor(p: Pair) -> torch.Tensor:
    """The Pair's factor that is the layer's input, (N, T, d)."""
    return p.right if p.input_side == "right" else p.left


def gradient_factor(p: Pair) -> torch.Tensor:
    """The Pair's other factor, the output gradient, (N, T, w)."""
    return p.left if p.input_side == "right" else p.right


def gram_plan(pairs: list[Pair]) -> list[bool]:
    """Which Pairs of one shared input factor take the Gram form (True) or materialize.

    Args:
        pairs: dense Pairs (see :func:`joins`) whose input factors are one tensor (N, T, d).

    Returns:
        One flag per Pair. A single Pair: ``factors.choose_gram``. Several: every Pair whose own
        side (T² w against T w d to materialize, or a block over the memory cap) favours the
        Gram joins it, if the group's cost then (T² d + the members' T² w + the others' blocks)
        does not exceed materializing them all, or some block is over the cap.
    """
    if len(pairs) == 1:
        return [factors.choose_gram(pairs)]
    N, T, d = input_factor(pairs[0]).shape
    flags, over_cap, mats, joined = [], False, 0.0, 0.0
    for p in pairs:
        a, b = p.shape
        w = gradient_factor(p).shape[-1]
        _, mat = factors.form_costs(a, b, [(T, False)])
        capped = N * a * b * p.right.element_size() > factors.MATERIALIZE_BYTES
        flag = capped or T * T * w <= mat
        over_cap |= capped
        flags.append(flag)
        mats += mat
        joined += T * T * w if flag else mat
    if any(flags) and (over_cap or T * T * d + joined <= mats):
        return flags
    return [False] * len(pairs)


def input_key(call: Call) -> tuple | None:
    """The identity of the call's first argument (None when it is not a tensor): equal keys of
    live tensors mean the same values; the version counter tells an in-place change apart."""
    x = call.args[0] if call.args else None
    if not isinstance(x, torch.Tensor):
        return None
    return (*storage_key(x), x._version)


@dataclass
class _Group:
    expected: int = 0
    arrived: int = 0
    members: list[tuple[str, Pair]] = field(default_factory=list)


class SharedInputs:
    """One backward's groups of layer calls that read one input tensor, and their norms.

    Args:
        calls: the calls whose contributions the engine will hand over in the backward (one
            call per layer, every parameter owned by that layer alone).
        summed: only the total is wanted: a group's Gram-form members give one ⟨Σₚ Bₚ Bₚᵀ,
            A Aᵀ⟩ (in ``totals``), not one norm each (in ``norms``).
        group_of: parameter name -> the index of its group (e.g. its block): summed members of
            different groups are summed apart (one inner product per group, A Aᵀ still once).
        reduction: with ``summed`` and whole Grams (``GRAM_BLOCKS`` = 1), where the Grams and
            materialized blocks are written (``reduction.py``: reduced with the backward's
            others at its end); ``totals`` then stays empty.

    After the backward and :meth:`flush`: ``norms`` {parameter name: (N,)} and ``totals``, a
    list of (group index or None, (N,) sum) over parameters that are in no column of ``norms``.
    """

    def __init__(self, calls: Iterable[Call], *, summed: bool,
                 group_of: dict[str, int] | None = None, reduction: Reduction | None = None):
        self.summed = summed
        self.group_of = group_of
        self.reduction = reduction if summed else None
        self.norms: dict[str, torch.Tensor] = {}
        self.totals: list[tuple[int | None, torch.Tensor]] = []
        # each group named by its first call's index (the same for every batch of a model: no
        # address is read in the backward, which may be captured as one graph)
        self._groups: dict[int, _Group] = {}
        self._key_of: dict[int, int] = {}
        first: dict[tuple, int] = {}
        for c in calls:
            k = input_key(c)
            if k is not None:
                g = first.setdefault(k, c.index)
                self._groups.setdefault(g, _Group()).expected += 1
                self._key_of[c.index] = g

    def add(self, call: Call, contribs: dict[str, Contribution]) -> dict[str, Contribution]:
        """Hand over one call's contributions {parameter name: contribution} (its output
        gradient has arrived); computes the call's group if this was its last member.

        Returns:
            The contributions that joined no group (the caller computes them).
        """
        k = self._key_of.pop(call.index, None)
        if k is None:
            return contribs
        group = self._groups[k]
        rest = {}
        for name, c in contribs.items():
            if joins(c):
                group.members.append((name, c))
            else:
                rest[name] = c
        group.arrived += 1
        if group.arrived == group.expected:
            self._finish(self._groups.pop(k))
        return rest

    def flush(self) -> None:
        """Compute the groups some of whose members never arrived (an output s does not depend
        on), after the backward."""
        groups, self._groups, self._key_of = self._groups, {}, {}
        for group in groups.values():
            self._finish(group)

    def _group(self, name: str) -> int | None:
        return None if self.group_of is None else self.group_of[name]

    def _finish(self, group: _Group) -> None:
        by_input: dict[tuple, list[tuple[str, Pair]]] = {}
        for name, p in group.members:
            key = p.source if p.source is not None else storage_key(input_factor(p))
            by_input.setdefault(key, []).append((name, p))
        group.members = []
        for members in by_input.values():
            plan = gram_plan([p for _, p in members])
            grams = [(name, p) for (name, p), g in zip(members, plan, strict=True) if g]
            for (name, p), g in zip(members, plan, strict=True):
                if g:
                    continue
                if self.reduction is not None:
                    self.reduction.block(p, self._group(name))
                else:
                    self.norms[name] = factors.materialized_sq_norms([p], [])
            if grams:
                self._gram_form(grams)

    def _gram_form(self, members: list[tuple[str, Pair]]) -> None:
        """⟨Bₚ Bₚᵀ, A Aᵀ⟩ of each member (or of their sum, ``summed``), A Aᵀ computed once;
        each symmetric Gram as the blocks on and above its diagonal (``factors.GRAM_BLOCKS``)."""
        A = input_factor(members[0][1])
        k = max(1, min(factors.GRAM_BLOCKS, A.shape[1]))
        if self.reduction is not None and k == 1:  # written into the backward's buffers
            by: dict[int | None, list[Pair]] = {}
            for name, p in members:
                by.setdefault(self._group(name), []).append(p)
            for group, pairs in by.items():
                self.reduction.gram(A, [gradient_factor(p) for p in pairs], group,
                                    concat=A.device.type in CONCAT_DEVICES)
            return
        gram_a = block_gram(A, k)

        def own(p: Pair) -> list[torch.Tensor]:
            return block_gram(gradient_factor(p), k)

        if not self.summed:
            for name, p in members:
                self.norms[name] = block_gram_inner(own(p), gram_a, k)
            return
        by_group: dict[int | None, list[Pair]] = {}
        for name, p in members:
            by_group.setdefault(None if self.group_of is None else self.group_of[name],
                                []).append(p)
        for group, pairs in by_group.items():
            grads = [gradient_factor(p) for p in pairs]
            if len(grads) > 1 and grads[0].device.type in CONCAT_DEVICES:
                # Σₚ Bₚ Bₚᵀ = [B₁ … Bₘ][B₁ … Bₘ]ᵀ: one product of the gradients side by side
                S = block_gram(torch.cat(grads, dim=-1), k)
            else:
                S = None
                for g in map(own, pairs):
                    S = g if S is None else [s.add_(b) if s.dtype == b.dtype else s + b
                                             for s, b in zip(S, g, strict=True)]
            self.totals.append((group, block_gram_inner(S, gram_a, k)))
