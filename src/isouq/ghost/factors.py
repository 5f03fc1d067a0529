"""Per-example gradient contributions and their exact squared norms.

A hooked layer call contributes to a parameter's per-example gradient either
- a :class:`Pair`: gᵢ = Lᵢᵀ Rᵢ with L (N, T, a) dense, or L an index tensor (N, T) standing for
  one-hot rows of width ``index_size`` (embeddings), and R (N, T, b): the parameter is (a, b); or
- a :class:`Materialized` per-example gradient (N, *param.shape) (norm layers, fallbacks).
A grouped layer (grouped convolution) folds its g groups into the batch: a Pair with
``fold`` = g has N·g rows, row (i, j) the block of group j, and ‖gᵢ‖² = Σⱼ ‖gᵢⱼ‖².

A parameter used by several calls (tied embedding/lm_head, a reused module) has gradient
Σₖ gᵢ⁽ᵏ⁾; :func:`sq_norms` returns ‖Σₖ gᵢ⁽ᵏ⁾‖² with every cross term, choosing per parameter
and per batch between the Gram form Σₖₗ⟨Lₖ Lₗᵀ, Rₖ Rₗᵀ⟩ (cost ~ N T² (a + b)) and
materializing Σₖ LₖᵀRₖ (cost ~ N T a b, memory N a b), whichever is cheaper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..runtime import env_int

#: The ghost settings an environment variable may change, each read where it is used (never
#: at import): ``factors.NAME`` gives its value now. Assigning one (``factors.GRAM_BLOCKS = 2``:
#: a test, a benchmark) holds that value in place of the environment's.
#: name -> (environment variable, default, what it is)
SETTINGS: dict[str, tuple[str, int, str]] = {
    "MATERIALIZE_BYTES": (
        "ISOUQ_GHOST_MATERIALIZE_BYTES", 256 * 2**20,
        "the largest per-example gradient block (bytes) the cost rule may materialize for one "
        "parameter"),
    "GRAM_BLOCKS": (
        "ISOUQ_GHOST_GRAM_BLOCKS", 1,
        "symmetric Grams X Xᵀ of layers sharing an input (``shared.py``): T split into this "
        "many blocks, only the blocks on and above the diagonal multiplied ((k + 1) / 2k of the "
        "products); 1: the whole Gram in one product"),
    "REDUCTION_BYTES": (
        "ISOUQ_GHOST_REDUCTION_BYTES", 64 * 2**20,
        "the most bytes each buffer of a backward's batched reduction (``reduction.py``: the "
        "Gram pairs, the materialized blocks) may take; when one is full it is reduced and "
        "reused"),
    "TOKEN_MULTIPLE": (
        "ISOUQ_TOKEN_MULTIPLE", 8,
        # cuBLAS runs its tensor-core kernels on 16-byte-aligned matrices only, and a T × T
        # Gram of odd T is written with an unaligned leading dimension (the kept profile of
        # Llama 3.2 3B at T = 69 spends 85% of its Gram time in an unaligned fallback kernel).
        "token positions per row on CUDA are padded to a multiple of this (the batch in "
        "``sequences.collate``, the lm_head's compacted positions in :meth:`Pair.compacted`); "
        "padded positions carry no gradient, so every norm is unchanged; elsewhere, and with "
        "1 (or less), no padding"),
}


def setting(name: str) -> int:
    """The value of ghost setting ``name`` (:data:`SETTINGS`) now: an assigned
    ``factors.NAME``, else its environment variable, else its default.

    Raises:
        InputError: naming the variable, when it is not a whole number.
    """
    if name in globals():  # assigned over the environment (a test, a benchmark)
        return globals()[name]
    var, default, _ = SETTINGS[name]
    value = env_int(var, default)
    return max(1, value) if name == "TOKEN_MULTIPLE" else value


def constant_settings() -> None:
    """Mark :func:`setting` as a constant to a captured backward
    (``torch.compiler.assume_constant_result``: read once while the graph is made), before a
    backward is captured (``passes.captured``). Done then, not at import: marking it imports
    torch's compiler, seconds that every ``import isouq`` would pay."""
    torch.compiler.assume_constant_result(setting)


def __getattr__(name: str) -> int:
    """``factors.MATERIALIZE_BYTES``, ``GRAM_BLOCKS``, ``REDUCTION_BYTES``,
    ``TOKEN_MULTIPLE``: :func:`setting`."""
    if name in SETTINGS:
        return setting(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: dtypes whose products and sums are accumulated in float32 (a bf16 Gram loses digits)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def at_least_f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in float32 when it is half or bfloat16 (indices and float32/64 unchanged)."""
    return t.float() if t is not None and t.dtype in LOW_PRECISION else t


def token_multiple(device: torch.device | str | None) -> int:
    """The multiple token positions are padded to on ``device``: ``TOKEN_MULTIPLE`` on CUDA,
    else 1."""
    if device is None or torch.device(device).type != "cuda":
        return 1
    return setting("TOKEN_MULTIPLE")


def round_up(n: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is ≥ n."""
    return -(-n // multiple) * multiple


@dataclass
class Pair:
    """gᵢ = Lᵢᵀ Rᵢ. left: (N, T, a) float or (N, T) int64 indices; right: (N, T, b)."""

    left: torch.Tensor
    right: torch.Tensor
    index_size: int | None = None  # a, when ``left`` holds indices
    fold: int = 1  # groups folded into dim 0: N·fold rows, example-major
    # a rule may give R Rᵀ (N·fold, T, T) directly, and build R only if asked (right_fn; then
    # ``right`` may be a zero-stride placeholder of R's shape and dtype)
    right_gram: torch.Tensor | None = None
    right_fn: Callable[[], torch.Tensor] | None = None
    # which factor is the layer's input ("right" for nn.Linear's Pair(B, A), "left" for GPT-2's
    # Conv1D): only its Gram is cached over a backward (an input may feed several layers, as
    # q/k/v share theirs); an output gradient serves one layer and is freed after its hook
    input_side: str = "right"
    # what the input factor's values are, when a rule knows: equal sources of one layer input
    # are equal values (``("input", dtype)``: the recorded input as it is, or cast to dtype);
    # None: told apart by storage (``shared.py``)
    source: tuple | None = None

    def dense_right(self) -> torch.Tensor:
        """R itself (built now when the rule gave it lazily)."""
        return self.right_fn() if self.right_fn is not None else self.right

    @property
    def is_index(self) -> bool:
        return self.index_size is not None

    @property
    def shape(self) -> tuple[int, int]:
        a = self.index_size if self.is_index else self.left.shape[-1]
        return a, self.right.shape[-1]

    def compacted(self, by: str, positions: torch.Tensor | None = None) -> Pair:
        """Drop token positions where the gradient factor (``by``: "left"/"right") is zero.

        Such positions add nothing to gᵢ (the lm_head outside the answer, padding). Rows keep
        their own nonzero positions, padded to the longest row with zero positions.

        Args:
            by: the factor whose zero positions are dropped.
            positions: (N, K) the positions to keep, when the caller knows them (each row's
                positions that may carry gradient, padded with ones that carry none: the batch
                loop's answer positions): nothing is read back from the device. None: they are
                read from the factor (one host synchronization).
        """
        g = self.left if by == "left" else self.right
        if positions is not None:
            if positions.shape[1] > 0.75 * g.shape[1]:
                return self
            return self._taken(positions.to(g.device))
        # (N, T): a position is kept if its largest or smallest entry is not 0 (NaN kept): two
        # reductions and no temporary as large as g (g.ne(0).any(-1) writes an N·T·V mask,
        # g.abs() an N·T·V copy: 0.17 s of fresh pages for SmolLM2's logits at batch 32)
        keep = g.amax(-1).ne(0) | g.amin(-1).ne(0)
        T = keep.shape[1]
        Tk = int(keep.sum(1).max()) if T else 0
        if Tk > 0.75 * T:
            return self
        Tk = min(T, round_up(max(Tk, 1), token_multiple(g.device)))  # the extra ones are zero
        return self._taken(torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :Tk])

    def _taken(self, order: torch.Tensor) -> Pair:
        """The pair at the (N, K) positions ``order`` of each row."""

        def take(t):
            if t.ndim == 2:
                return torch.gather(t, 1, order)
            return torch.gather(t, 1, order.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

        return Pair(take(self.left), take(self.dense_right()), self.index_size, self.fold,
                    input_side=self.input_side)

    def materialize(self) -> torch.Tensor:
        """(N·fold, a, b) per-example (per-group) gradients (float32 at least when dense)."""
        right = self.dense_right()
        N, T, b = right.shape
        if not self.is_index:
            return bmm_f32(self.left.transpose(1, 2), right)
        out = right.new_zeros(N, self.index_size, b)
        return out.scatter_add_(1, self.left.unsqueeze(-1).expand(N, T, b), right)


@dataclass
class Materialized:
    """A per-example gradient (N, *param.shape), or its consecutive blocks of examples.

    A rule that builds the gradient in chunks of examples (convolutions) gives the blocks as a
    tuple: when the parameter has no other contribution, its norms are taken block by block,
    with no concatenated copy (:func:`sq_norms`). ``scale`` (broadcast over the trailing
    dims, e.g. a norm layer's 1/w): the gradient is ``grad ⊙ scale``, multiplied where it is
    read (``reduction.py`` scales every norm layer's at once).
    """

    grad: torch.Tensor | tuple[torch.Tensor, ...]
    scale: torch.Tensor | None = None

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The gradient's blocks of examples, in order (one block when it is whole)."""
        grads = (self.grad,) if isinstance(self.grad, torch.Tensor) else self.grad
        return grads if self.scale is None else tuple(g * self.scale for g in grads)

    def dense(self) -> torch.Tensor:
        """The whole (N, *param.shape) gradient, its blocks concatenated."""
        blocks = self.blocks()
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


Contribution = Pair | Materialized


#: (device type, dtype) -> whether torch.bmm(..., out_dtype=torch.float32) runs there
_F32_OUT: dict[tuple[str, torch.dtype], bool] = {}


def _f32_out_supported(t: torch.Tensor) -> bool:
    """Whether half-precision ``t``'s device multiplies it with a float32 result natively
    (CUDA's tensor cores: products exact in float32, sums accumulated in float32), into a new
    tensor and into a given one (``out=``); probed once per device type and dtype."""
    key = (t.device.type, t.dtype)
    if key not in _F32_OUT:
        ok = t.device.type == "cuda"
        if ok:
            try:
                z = torch.ones(1, 2, 2, dtype=t.dtype, device=t.device)
                into = torch.empty(1, 2, 2, dtype=torch.float32, device=t.device)
                made = torch.bmm(z, z, out_dtype=torch.float32)
                torch.bmm(z, z, out_dtype=torch.float32, out=into)
                ok = bool(made.dtype == torch.float32 and torch.equal(made, into))
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _F32_OUT[key] = ok
    return _F32_OUT[key]


def _transpose_of(y: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``y`` is ``x.mT`` (the same values, the last two dims swapped)."""
    return (y.data_ptr() == x.data_ptr() and y.dtype == x.dtype and x.ndim == y.ndim >= 2
            and y.shape == x.mT.shape and y.stride() == x.mT.stride())


def f32_product(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """x @ y (batched) in float32 at least, written into ``out`` when given (a buffer of the
    result's dtype: float32 for half-precision factors). Half-precision factors of one dtype are
    multiplied as they are, into a float32 result, where the device can (no upcast copies, the
    tensor cores' speed); elsewhere they are upcast first, once for a Gram x xᵀ. Both are exact
    to float32 summation."""
    if x.dtype in LOW_PRECISION and x.dtype == y.dtype and _f32_out_supported(x):
        if out is None:
            return torch.bmm(x, y, out_dtype=torch.float32)
        return torch.bmm(x, y, out_dtype=torch.float32, out=out)
    x32 = at_least_f32(x)
    y32 = x32.mT if x32 is not x and _transpose_of(y, x) else at_least_f32(y)
    return torch.bmm(x32, y32) if out is None else torch.bmm(x32, y32, out=out)


def bmm_f32(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y (batched) in float32 at least (:func:`f32_product` into a new tensor)."""
    return f32_product(x, y)


def _left_gram(p: Pair, q: Pair) -> torch.Tensor:
    """Lₚ Lqᵀ per example: (N, Tp, Tq)."""
    if p.is_index and q.is_index:
        return (p.left.unsqueeze(2) == q.left.unsqueeze(1)).to(
            torch.promote_types(p.right.dtype, torch.float32))
    if p.is_index:
        return _left_gram(q, p).transpose(1, 2)
    if q.is_index:  # dense p (N,Tp,a) against one-hot q: gather columns q.left
        N, Tp, _ = p.left.shape
        idx = q.left.unsqueeze(1).expand(N, Tp, q.left.shape[1])
        return at_least_f32(torch.gather(p.left, 2, idx))
    return _dense_gram(p.left, q.left, None)


def storage_key(t: torch.Tensor) -> tuple:
    """What makes two live tensors the same values: device, address, shape, strides, dtype."""
    return (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


def gram_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """⟨xₙ, yₙ⟩ per example of two (N, T, T') Grams → (N,): one vecdot (~25× faster than a
    (1×T²)·(T²×1) bmm)."""
    N = x.shape[0]
    return torch.linalg.vecdot(x.reshape(N, -1), y.reshape(N, -1))


def block_gram(x: torch.Tensor, k: int) -> list[torch.Tensor]:
    """The blocks on and above the diagonal of x xᵀ per example (float32 at least).

    Args:
        x: (N, T, d).
        k: the T positions split into k near-equal consecutive blocks (1 ≤ k ≤ T).

    Returns:
        k (k + 1) / 2 blocks (N, Tᵢ, Tⱼ), i ≤ j, row by row: the rest of the symmetric Gram is
        their transposes, so (k + 1) / 2k of the whole Gram's products.
    """
    T = x.shape[1]
    edges = [T * i // k for i in range(k + 1)]
    parts = [x[:, edges[i]:edges[i + 1]] for i in range(k)]
    return [bmm_f32(parts[i], parts[j].transpose(1, 2)) for i in range(k) for j in range(i, k)]


def block_gram_inner(xs: list[torch.Tensor], ys: list[torch.Tensor], k: int) -> torch.Tensor:
    """⟨X, Y⟩ per example (N,) of two symmetric Grams given as :func:`block_gram` blocks: the
    diagonal blocks once, those above it twice (for the ones below)."""
    total, n = None, 0
    for i in range(k):
        for j in range(i, k):
            term = gram_inner(xs[n], ys[n])
            term = term if i == j else 2 * term
            total = term if total is None else total + term
            n += 1
    return total


def _dense_gram(x: torch.Tensor, y: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """x yᵀ per example (N, Tx, Ty), in float32 at least (``bmm_f32``: half-precision factors
    multiplied natively into float32, or upcast here, one at a time, and not kept); with a
    ``cache``, x xᵀ is cached by storage (q/k/v share one input)."""
    if cache is None or x is not y:
        return bmm_f32(x, y.transpose(1, 2))
    k = storage_key(x)
    if k not in cache:  # keep x alive with its Gram so its address cannot be reused meanwhile
        cache[k] = (x, bmm_f32(x, x.transpose(1, 2)))
    return cache[k][1]


def _gram_sq_norm(pairs: list[Pair], cache: dict | None = None) -> torch.Tensor:
    total = None
    for k, p in enumerate(pairs):
        for q in pairs[k:]:
            left = _dense_gram(p.left, q.left, cache if p.input_side == "left" else None) \
                if not (p.is_index or q.is_index) else _left_gram(p, q)
            if q is p and p.right_gram is not None:
                right = at_least_f32(p.right_gram)
            else:
                right = _dense_gram(p.dense_right(), q.dense_right(),
                                    cache if p.input_side == "right" else None)
            term = gram_inner(left, right)
            term = term if q is p else 2 * term
            total = term if total is None else total + term
    return total


def gram_is_cheaper(N: int, a: int, b: int, positions: list[tuple[int, bool]],
                    elem_bytes: int, gram_cost: float | None = None) -> bool:
    """The cost rule on shapes alone (``choose_gram`` on a batch; ``memory_plan`` ahead).

    Args:
        N: examples; a, b: the parameter's shape (a, b).
        positions: one (T, is_index) per contribution: its token positions, and whether its
            left factor is one-hot indices (embeddings).
        elem_bytes: bytes per element of a materialized block.
        gram_cost: the Gram form's cost per example when a rule computes R Rᵀ its own way.

    Returns:
        True for the Gram form: cheaper (~ N T² (a + b)) than materializing (~ N T a b), or the
        materialized (N, a, b) block would exceed ``MATERIALIZE_BYTES``.
    """
    gram, mat = form_costs(a, b, positions)
    if gram_cost is not None:
        gram = gram_cost
    return gram <= mat or N * a * b * elem_bytes > setting("MATERIALIZE_BYTES")


def form_costs(a: int, b: int, positions: list[tuple[int, bool]]) -> tuple[float, float]:
    """(Gram form, materialized form) cost per example of one parameter (a, b), in
    multiply-adds: Σₖₗ Tₖ Tₗ (a + b) for the Grams, Σₖ Tₖ a b (+ a b for the sum) to
    materialize; ``positions`` as in :func:`gram_is_cheaper`."""
    gram = sum(tp * tq * ((1 if (ip and iq) else a) + b)
               for tp, ip in positions for tq, iq in positions)
    mat = sum(t * (b if i else a * b) for t, i in positions) + a * b
    return gram, mat


def choose_gram(pairs: list[Pair], gram_cost: float | None = None) -> bool:
    """The cost rule, decided per parameter per batch (T may change between batches).

    ``gram_cost`` (per example) replaces the Gram form's default cost when a rule computes
    R Rᵀ its own way (convolutions: from the input's channel Gram).
    """
    a, b = pairs[0].shape
    return gram_is_cheaper(pairs[0].right.shape[0], a, b,
                           [(p.right.shape[1], p.is_index) for p in pairs],
                           pairs[0].right.element_size(), gram_cost)


def _f32_pair(p: Pair) -> Pair:
    """The pair with its dense factors in float32 when they are half precision."""
    if p.right.dtype not in LOW_PRECISION and (p.is_index or p.left.dtype not in LOW_PRECISION):
        return p
    fn = p.right_fn
    right = p.right if fn is not None else p.right.float()  # a lazy R: only its placeholder
    return Pair(at_least_f32(p.left), right, p.index_size, p.fold, at_least_f32(p.right_gram),
                None if fn is None else (lambda: fn().float()), p.input_side)


def sq_norms(contribs: list[Contribution], cache: dict | None = None) -> torch.Tensor:
    """‖Σₖ gᵢ⁽ᵏ⁾‖² per example (N,) for one parameter's contributions, exactly; half-precision
    factors are multiplied and summed in float32 (the result is float32 or float64).

    ``cache`` (a dict shared over one backward) reuses Grams of inputs several layers share.
    """
    if len(contribs) == 1 and isinstance(contribs[0], Materialized):
        rows = [row_sq_norms(at_least_f32(g).reshape(g.shape[0], -1))
                for g in contribs[0].blocks()]
        return rows[0] if len(rows) == 1 else torch.cat(rows)
    pairs = [c for c in contribs if isinstance(c, Pair)]  # upcast when multiplied
    mats = [at_least_f32(c.dense()) for c in contribs if isinstance(c, Materialized)]
    folds = {p.fold for p in pairs}
    if pairs and not mats and len(folds) == 1 and choose_gram(pairs):
        sq = _gram_sq_norm(pairs, cache)
        fold = pairs[0].fold
        return sq if fold == 1 else sq.view(-1, fold).sum(1)
    return materialized_sq_norms(pairs, mats)


def materialized_sq_norms(pairs: list[Pair], mats: list[torch.Tensor]) -> torch.Tensor:
    """‖Σₖ gᵢ⁽ᵏ⁾‖² (N,) of one parameter by materializing every Pair's per-example block and
    adding the ``mats`` (N, *shape) already materialized (float32 at least)."""
    N = mats[0].shape[0] if mats else pairs[0].right.shape[0] // pairs[0].fold
    G = None
    for g in mats + [(_f32_pair(p) if p.is_index else p).materialize() for p in pairs]:
        g = g.reshape(N, -1)  # a folded block (N·g, a, b) is example-major: (N, g·a·b)
        G = g if G is None else G + g
    return row_sq_norms(G)


def row_sq_norms(g: torch.Tensor) -> torch.Tensor:
    """‖gᵢ‖² of every row of g (N, P) → (N,): one fused norm kernel (a third of the time of
    ``g.pow(2).sum(1)``, which writes the squares out first, on CPU)."""
    return torch.linalg.vector_norm(g, dim=1).square()
