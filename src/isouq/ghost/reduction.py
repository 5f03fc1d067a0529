"""One backward's per-example squared norms, reduced in a few batched operations at its end.

With only the total asked for (``GhostNorms.backward``, ``score_sequences`` without
``per_param``; by group of parameters with ``groups``), each layer's part of ‖gᵢ‖² need not be
a number of its own as soon as its output gradient arrives. What the hooks hand over is written
into buffers allocated once per backward, and summed by a few batched operations:

- Gram form (``shared.py``): the input Gram A Aᵀ and the summed output-gradient Gram Σₚ Bₚ Bₚᵀ of
  a group are written, each by one product, into the next slot pair of one (2, K, N, T, T)
  buffer; when it is full, and at the end, ⟨A Aᵀ, Σₚ Bₚ Bₚᵀ⟩ of every slot is one batched
  product. An embedding's index Gram (token equality) is written there the same way.
- Materialized form: a Linear weight's per-example block Bᵀ A is written by one product into
  its columns of one (N, P) buffer, an embedding's by one scatter; the buffer's row norms are
  one reduction when it is full (or, with groups, when the group changes) and at the end.
- A materialized gradient (N, P) a rule gives (a norm layer's, a bias) is kept, its scale
  with it (``Materialized.scale``: for a norm weight that scales the normalized input,
  c = Σₜ bₜ ⊙ yₜ and s = 1/w), and the kept ones are reduced together, one product by their
  scales and one norm per example, at the end (or when the group changes, or the kept ones
  reach the cap). In a captured backward (``isouq.capture``) no product is written into a
  strided buffer: blocks are reduced at once.
- Anything else (tied weights' cross terms, fallbacks, other shapes) comes as its (N,) squared
  norm.

The buffers are capped (``factors.REDUCTION_BYTES``); the Grams of the main T × T shape (the
batch's positions) share the slot buffer, a Gram of another shape (the LM head's kept positions)
is reduced at once. Sums run in float32 at least, as ``factors.sq_norms``'; only the order of the
additions differs from a norm computed per layer.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from . import factors
from .factors import Materialized, Pair, at_least_f32


@dataclass
class _Slots:
    """A (2, K, N, T, T') buffer of Gram pairs, ``used`` of them written, one group each."""

    buf: torch.Tensor
    used: int = 0
    groups: list = field(default_factory=list)


@dataclass
class _Columns:
    """An (N, P) buffer of per-example blocks, ``used`` columns written, of group ``group``."""

    buf: torch.Tensor
    used: int = 0
    group: int | None = None


class Reduction:
    """The squared norms of one backward, reduced at its end.

    Args:
        N: examples.
        dtype: the result's dtype (float32 or float64).
        device: where the result goes (layers may live on other devices).
        slots: how many Gram pairs of the main shape the backward may write (an upper
            bound; the buffer holds no more than ``factors.REDUCTION_BYTES``).
        columns: how many materialized columns it may write (an upper bound, likewise).
        main: T, the positions of the main Gram shape (T × T); None: the first Gram's.
        groups: G, the number of groups (each piece then names its group), or None.
    """

    def __init__(self, N: int, dtype: torch.dtype, device, *, slots: int, columns: int,
                 main: int | None = None, groups: int | None = None):
        self.N, self.dtype, self.device, self.main, self.groups = N, dtype, device, main, groups
        self._want_slots, self._want_columns = max(1, slots), max(1, columns)
        self._slots: dict[tuple, _Slots] = {}
        self._columns: dict[tuple, _Columns] = {}
        self._squares: list[tuple[torch.Tensor, list]] = []  # ((k, N), k groups)
        self._roots: list[tuple[torch.Tensor, int | None]] = []  # (N,) norms, to square
        # small (N, P) gradients kept to be reduced together, of one group: scaled ones (c, s)
        # and plain ones; their bytes
        self._scaled: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._plain: list[torch.Tensor] = []
        self._deferred_group, self._deferred_bytes = None, 0

    # ------------------------------------------------------------------ Gram form
    def _slot(self, like: torch.Tensor, t1: int, t2: int, group) -> tuple | None:
        """The next free Gram pair (A's slot, B's slot) for this shape, or None (another
        shape than the main one: the caller reduces at once)."""
        if self.main is None:
            self.main = t1
        if t1 != self.main or t2 != self.main:
            return None
        dtype = torch.promote_types(like.dtype, torch.float32)
        key = (like.device, dtype)
        slots = self._slots.get(key)
        if slots is None:
            per = 2 * self.N * t1 * t2 * dtype.itemsize
            k = max(1, min(self._want_slots, factors.setting("REDUCTION_BYTES") // max(per, 1)))
            slots = self._slots[key] = _Slots(
                torch.empty(2, k, self.N, t1, t2, dtype=dtype, device=like.device))
        if slots.used == slots.buf.shape[1]:
            self._flush_slots(slots)
        slots.used += 1
        slots.groups.append(group)
        return slots.buf[0, slots.used - 1], slots.buf[1, slots.used - 1]

    def _flush_slots(self, slots: _Slots) -> None:
        if not slots.used:
            return
        a, b = slots.buf[0, :slots.used], slots.buf[1, :slots.used]
        k = slots.used
        # ⟨A Aᵀ, Σ B Bᵀ⟩ of every slot and example: one batched product of (1 × T²)(T² × 1)
        vals = torch.bmm(a.reshape(k * self.N, 1, -1), b.reshape(k * self.N, -1, 1))
        self._squares.append((vals.view(k, self.N), slots.groups))
        slots.used, slots.groups = 0, []

    def gram(self, inputs: torch.Tensor, grads: list[torch.Tensor], group=None,
             concat: bool = False) -> None:
        """⟨A Aᵀ, Σₚ Bₚ Bₚᵀ⟩ per example of a group: A = ``inputs`` (N, T, d), Bₚ = ``grads``
        (N, T, wₚ); with ``concat`` Σₚ Bₚ Bₚᵀ is one product of the Bₚ side by side."""
        N, T = inputs.shape[:2]
        pair = self._slot(inputs, T, T, group)
        if pair is None:  # another shape: reduced now
            ga = factors.f32_product(inputs, inputs.mT)
            self.square(_inner(ga, _summed_gram(grads, concat)), group)
            return
        ga, gb = pair
        factors.f32_product(inputs, inputs.mT, out=ga)
        _summed_gram(grads, concat, out=gb)

    def index_gram(self, p: Pair, group=None) -> None:
        """‖gᵢ‖² of an embedding's one-hot Pair in Gram form: ⟨[xₜ = xₜ'], B Bᵀ⟩."""
        idx, right = p.left, p.dense_right()
        T = idx.shape[1]
        pair = self._slot(right, T, T, group)
        if pair is None:
            self.square(factors.sq_norms([p]), group)
            return
        ga, gb = pair
        torch.eq(idx.unsqueeze(2), idx.unsqueeze(1), out=ga)
        factors.f32_product(right, right.mT, out=gb)

    # ------------------------------------------------------------------ materialized form
    def _columns_for(self, like: torch.Tensor, width: int, group) -> torch.Tensor | None:
        """(N, width) free columns of the block buffer, or None (wider than the buffer, or in a
        captured backward, which writes into no strided buffer)."""
        if torch.compiler.is_compiling():
            return None
        dtype = torch.promote_types(like.dtype, torch.float32)
        key = (like.device, dtype)
        cols = self._columns.get(key)
        if cols is None:
            cap = factors.setting("REDUCTION_BYTES") // (self.N * dtype.itemsize)
            P = min(self._want_columns, cap)
            if width > P:
                return None
            cols = self._columns[key] = _Columns(
                torch.empty(self.N, P, dtype=dtype, device=like.device))
        if width > cols.buf.shape[1]:
            return None
        if cols.used + width > cols.buf.shape[1] or (cols.used and cols.group != group):
            self._flush_columns(cols)
        cols.group = group
        cols.used += width
        return cols.buf[:, cols.used - width:cols.used]

    def _flush_columns(self, cols: _Columns) -> None:
        if cols.used:
            self.root(torch.linalg.vector_norm(cols.buf[:, :cols.used], dim=1), cols.group)
            cols.used = 0

    def block(self, p: Pair, group=None) -> None:
        """‖gᵢ‖² of a Pair materialized: Lᵀ R per example, written into the block buffer."""
        a, b = p.shape
        right = p.dense_right()
        out = self._columns_for(right, a * b * p.fold, group)
        if out is None:
            self.square(factors.materialized_sq_norms([p], []), group)
            return
        out = out.view(right.shape[0], a, b)  # N·fold rows: a folded group's blocks in turn
        if p.is_index:
            out.zero_().scatter_add_(1, p.left.unsqueeze(-1).expand(*right.shape),
                                     at_least_f32(right).to(out.dtype))
        else:
            factors.f32_product(p.left.transpose(1, 2), right, out=out)

    def materialized(self, m: Materialized, group=None) -> None:
        """‖gᵢ‖² of a materialized gradient (N, …): kept, with its scale (``m.scale``), to be
        reduced with the others of its group (at the end, when the group changes or the kept
        ones reach ``REDUCTION_BYTES``); a gradient given in blocks of examples now."""
        if not isinstance(m.grad, torch.Tensor):
            self.square(factors.sq_norms([m]), group)
            return
        g = m.grad.reshape(m.grad.shape[0], -1)
        size = g.numel() * max(g.element_size(), 4)
        if (self._scaled or self._plain) and (
                group != self._deferred_group
                or self._deferred_bytes + size > factors.setting("REDUCTION_BYTES")):
            self._flush_deferred()
        self._deferred_group = group
        self._deferred_bytes += size
        if m.scale is not None:
            self._scaled.append((g, m.scale.reshape(-1)))
        else:
            self._plain.append(g)

    def _flush_deferred(self) -> None:
        """The kept gradients' norm, one root: their columns side by side, the scaled ones
        multiplied by their scales (one product for them all), one norm per example."""
        parts = []
        if self._scaled:
            c = torch.cat([at_least_f32(c) for c, _ in self._scaled], dim=1)
            parts.append(c * _joined([s for _, s in self._scaled]))
        parts += [at_least_f32(g) for g in self._plain]
        if parts:
            x = parts[0] if len(parts) == 1 else torch.cat(
                [t.to(parts[0].dtype) for t in parts], dim=1)
            self.root(torch.linalg.vector_norm(x, dim=1), self._deferred_group)
        self._scaled, self._plain, self._deferred_bytes = [], [], 0

    # ------------------------------------------------------------------ pieces and the end
    def square(self, sq: torch.Tensor, group=None) -> None:
        """Add (N,) squared norms computed elsewhere."""
        self._squares.append((sq.unsqueeze(0), [group]))

    def root(self, norm: torch.Tensor, group=None) -> None:
        """Add (N,) norms (squared at the end)."""
        self._roots.append((norm, group))

    def result(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(total (N,), by group (N, G) or None without groups), on ``device`` in ``dtype``."""
        for s in self._slots.values():
            self._flush_slots(s)
        for c in self._columns.values():
            self._flush_columns(c)
        self._flush_deferred()
        move = lambda t: t.to(device=self.device, dtype=self.dtype)  # noqa: E731
        squares, roots = self._squares, self._roots
        self._squares, self._roots = [], []
        sq = None
        if squares:
            sq = move(squares[0][0] if len(squares) == 1 else
                      torch.cat([move(t) for t, _ in squares]))
        if self.groups is not None:
            return self._by_group(sq, [g for _, gs in squares for g in gs], roots)
        total = None if sq is None else sq.sum(0)
        if roots:
            r = (move(roots[0][0]) if len(roots) == 1 else
                 torch.linalg.vector_norm(torch.stack([move(r) for r, _ in roots]), dim=0))
            total = r * r if total is None else torch.addcmul(total, r, r)
        if total is None:
            total = torch.zeros(self.N, dtype=self.dtype, device=self.device)
        return total, None

    def _by_group(self, sq: torch.Tensor | None, sq_groups: list, roots: list
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(total, (N, G) by group): every row of squares and squared root added to its
        group's column."""
        rows, groups = [], list(sq_groups)
        if sq is not None:
            rows.append(sq)
        if roots:
            rows.append(torch.stack([r.to(device=self.device, dtype=self.dtype)
                                     for r, _ in roots]).square())
            groups += [g for _, g in roots]
        by = torch.zeros(self.N, self.groups, dtype=self.dtype, device=self.device)
        if rows:
            terms = rows[0] if len(rows) == 1 else torch.cat(rows)
            index = torch.tensor(groups, dtype=torch.long).to(self.device, non_blocking=True)
            by.index_add_(1, index, terms.T)
        return by.sum(1), by


#: the last scales joined (``_joined``): weak references to the tensors, and their
#: concatenation; a backward of the same model reads the same scale tensors (``norms.py`` keeps
#: 1/w per weight state)
_JOINED: list = [(), None]


def _joined(scales: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(scales), made once while the same scale tensors come back."""
    held, cat = _JOINED
    if len(held) == len(scales) and all(r() is t for r, t in zip(held, scales, strict=True)):
        return cat
    cat = torch.cat(scales)
    _JOINED[:] = [tuple(weakref.ref(t) for t in scales), cat]
    return cat


def _inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """⟨xₙ, yₙ⟩ (N,) of two (N, T, T') Grams: one batched (1 × TT')(TT' × 1) product."""
    N = x.shape[0]
    return torch.bmm(x.reshape(N, 1, -1), y.reshape(N, -1, 1)).view(N)


def _summed_gram(grads: list[torch.Tensor], concat: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Σₚ Bₚ Bₚᵀ (N, T, T) in float32 at least, into ``out`` when given: one product of the
    gradients side by side with ``concat``, else one product and one accumulation per Bₚ."""
    if concat and len(grads) > 1:
        g = torch.cat(grads, dim=-1)
        return factors.f32_product(g, g.mT, out=out)
    first = factors.f32_product(grads[0], grads[0].mT, out=out)
    for g in grads[1:]:
        g32 = at_least_f32(g)
        first.baddbmm_(g32, g32.mT)
    return first
