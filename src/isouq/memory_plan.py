"""Peak memory of :func:`isouq.score_sequences`, planned before anything runs.

:func:`estimate` predicts, in bytes, the peak resident memory of scoring one batch of N rows
padded to L tokens (``A`` of them answer tokens) with ``method="ghost"`` or ``"per_example"``
(the engines of ``isouq.engines``; ``"per_token"`` holds what ghost holds, older names such as
``"loop"`` are read as the engine they name), from
quantities read off the model without running it: parameter bytes, hidden size d, key/value
width, intermediate size I, layers, attention heads, vocabulary V, tied embeddings. The terms
follow what the code holds (``sequences.token_probs``, ``ghost/engine.py``, ``ghost/factors.py``):

- **activations** the forward saves for the backward (weights frozen: no weight gradients),
  counted per token and layer for a Llama-style decoder (RMSNorm, rotary attention through
  SDPA, gated MLP): ``11·d + 2·d_kv + 4·I + H + 2 + L`` elements for a padded batch (the last
  term is SDPA's ``(N, 1, L, L)`` mask; the key/value heads are repeated), ``9·d + 4·d_kv + 4·I
  + H + 2`` for one unpadded row, plus ``3·d`` per token outside the layers. In half precision
  the RMSNorm upcasts keep ``4·d + H + 2`` of them in float32.
- **logits**: kept from the first answer position only (``logits_to_keep``): the model output
  ``N × A' × V`` (A' = A + 1) in the model dtype, twice more for its gradient through the index
  and slice, and the answer rows' float32 log-softmax and its gradient (``2 × N·A × V × 4``).
- **ghost engine** (ghost only): per hooked Linear, the cost rule of ``factors.choose_gram``
  decides between Gram matrices ``N × T × T`` (float32; the Grams of the layer inputs are
  cached with their inputs until the backward ends: per token and layer ``(3·d + I)`` input
  elements and ``4·L`` Gram elements; an output gradient's Gram lives only during its layer's
  hook) and a materialized per-example gradient ``N × a × b``
  (float32, with its square: transient); the embedding the same way (index form), and the
  ``N × A' × V`` logit gradient the lm_head rule keeps to the end. Half-precision factors are
  multiplied as float32 copies made one at a time and not kept; the cache keeps the inputs in
  the model's dtype and their float32 Grams.
- **per_example** (per_example only): the batch's no-grad forward (its logits and one layer's intermediates,
  ``N·L·(4·I + 2·d + L)`` elements), then one row at a time: its activations, the weight
  gradients of every selected parameter, their concatenation and square (``3 × parameter
  bytes``), the embedding backward's dense ``V × d`` buffer (twice when tied: the lm_head's
  gradient is added to it), and from the second row on the parameter tensors below 32 MiB
  once more (the previous row's gradients are still referenced while the next row's backward
  allocates its own, and those blocks stay resident).

Resident memory is not live memory: ``isouq score`` keeps freed blocks below 32 MiB in the
process (``runtime.tune_allocator``), so what the forward held stays resident during the
backward, and only blocks of 32 MiB or more go back to the system when freed. The estimate
models this: the peak is the larger of the forward's end (everything live) and the backward's
worst moment: the forward's small blocks stay resident and what the backward holds reuses them
(in half precision it cannot: the float32 copies are twice the size of the freed blocks, and
resident memory grows through the backward, so the two add up).

Constant factors (``CALIBRATION``) were fitted on a tiny random Llama only
(``benchmarks/memory_plan.py``, the "calibrate" configurations) and checked on SmolLM2 and
other tiny-Llama configurations; ``docs/performance.md`` gives the table. Other families
(GPT-2, GPT-NeoX, ...) are estimated with the same counts: treat their numbers as rough.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .engines import engine_name
from .errors import InputError, MemoryBudgetError, ModelError
from .ghost.factors import gram_is_cheaper
from .ghost.registry import rule_for

Method = Literal["ghost", "per_example", "per_token", "loop"]


def _planned(method: str) -> str:
    """The engine whose memory is planned for ``method`` (``isouq.engines``; an older name such
    as ``"loop"`` resolved): ``"per_example"``, or ``"ghost"`` for ghost and per_token (one
    forward whose graph is retained for the backwards)."""
    name = engine_name(method, ("ghost", "per_example", "per_token"))
    return "per_example" if name == "per_example" else "ghost"

#: blocks of this size or more are returned to the system when freed (runtime.tune_allocator)
MMAP_THRESHOLD = 32 * 2**20

#: constant factors fitted on the "calibrate" configurations of benchmarks/memory_plan.py (a
#: tiny random Llama, ghost and loop, N·L from 64 to 8,192 tokens; least squares on the log
#: ratio): the counted terms are exact for what autograd saves (tests/test_memory_plan.py);
#: these factors absorb the allocator's fragmentation and the kernels' workspaces
CALIBRATION = {
    "activations": 1.21,  # × the counted activation bytes
    "logits": 1.03,  # × the counted logit bytes
    "loop_gradients": 0.82,  # × the counted loop gradient bytes
    "overhead": 4.3 * 2**20,  # bytes: the autograd graph, kernels' workspace, Python objects
    "runtime": 472 * 2**20,  # bytes: interpreter, torch, transformers (measured beside the model)
}


@dataclass(frozen=True)
class Shape:
    """What the estimate reads off a model (sizes in elements, ``param_bytes`` in bytes)."""

    hidden: int
    kv_hidden: int
    intermediate: int
    layers: int
    heads: int
    vocab: int
    param_bytes: int
    tied: bool
    dtype: torch.dtype
    small_param_bytes: int = 0  # bytes of the parameter tensors below MMAP_THRESHOLD


@dataclass(frozen=True)
class Estimate:
    """Predicted peak memory of one batch, in bytes, with the terms it is made of.

    Attributes:
        weights: parameter and buffer bytes of the model.
        runtime: interpreter and libraries (a calibrated constant, not scoring).
        activations: what the forward saves for the backward (all layers).
        logits: the logit tensors around the start of the backward.
        engine: ghost: the backward's worst moment beyond the activations (Grams, cached
            factors, materialized per-example gradients); per_example: one row's forward and backward
            with its weight gradients.
        working: the scoring's own peak (what a budget must leave room for beyond the model).
        total: weights + runtime + working.
    """

    weights: int
    runtime: int
    activations: int
    logits: int
    engine: int
    working: int

    @property
    def total(self) -> int:
        return self.weights + self.runtime + self.working


def _cfg_int(cfg, names: Iterable[str], default: int | None = None) -> int | None:
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def shape_of(model: nn.Module, dtype: torch.dtype | None = None) -> Shape:
    """Read the sizes the estimate needs from ``model.config`` and its parameters.

    Args:
        model: a Hugging Face causal LM (``config`` with hidden size, layers, heads, vocabulary).
        dtype: the dtype to plan for; default the model's floating-point parameter dtype.

    Returns:
        The model's :class:`Shape`; ``param_bytes`` counts parameters and buffers in ``dtype``.

    Raises:
        ModelError: the model has no config giving its hidden size, layers and vocabulary.
    """
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    d = _cfg_int(cfg, ("hidden_size", "n_embd", "d_model"))
    layers = _cfg_int(cfg, ("num_hidden_layers", "n_layer", "num_layers"))
    vocab = _cfg_int(cfg, ("vocab_size",))
    if cfg is None or d is None or layers is None or vocab is None:
        raise ModelError(
            f"cannot plan memory for a {type(model).__name__}: its config gives no hidden size, "
            "number of layers or vocabulary size; pass an explicit batch size instead")
    heads = _cfg_int(cfg, ("num_attention_heads", "n_head"), 1)
    kv = _cfg_int(cfg, ("num_key_value_heads",), heads)
    inter = _cfg_int(cfg, ("intermediate_size", "n_inner", "ffn_dim"), 4 * d)
    floats = [p for p in model.parameters() if p.is_floating_point()]
    want = dtype or (floats[0].dtype if floats else torch.float32)
    elt = torch.empty((), dtype=want).element_size()
    # what the process holds: an offloaded weight (accelerate, on meta) not at all, a sharded
    # one (FSDP2) as its local shard; plus what is materialized for one module's forward
    n = sum(_resident_numel(t) for t in [*model.parameters(), *model.buffers()]
            if t.is_floating_point()) + _transient_numel(model)
    emb, out = model.get_input_embeddings(), None
    try:
        out = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        pass
    tied = out is not None and getattr(out, "weight", None) is getattr(emb, "weight", 0)
    small = sum(p.numel() * elt for p in model.parameters()
                if p.is_floating_point() and p.numel() * elt < MMAP_THRESHOLD)
    return Shape(hidden=d, kv_hidden=d * kv // heads, intermediate=inter, layers=layers,
                 heads=heads, vocab=vocab, param_bytes=n * elt, tied=bool(tied), dtype=want,
                 small_param_bytes=small)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "device_mesh")


def _resident_numel(t: torch.Tensor) -> int:
    if t.device.type == "meta":
        return 0
    return t.to_local().numel() if _is_dtensor(t) else t.numel()


def _transient_numel(model: nn.Module) -> int:
    """Weights held only around a forward: accelerate's largest offloaded module (loaded on its
    forward, one at a time); FSDP2's root unit (gathered through the whole forward) and two
    layer units (the one running and the next, prefetched)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without distributed
        FSDPModule = ()  # noqa: N806
    units = [m for m in model.modules() if FSDPModule and isinstance(m, FSDPModule)]
    if units:
        inner = {id(p) for u in units if u is not model for p in u.parameters()}
        root = sum(p.numel() for p in model.parameters() if id(p) not in inner)
        sizes = sorted((sum(p.numel() for p in u.parameters()) for u in units if u is not model),
                       reverse=True)
        return root + sum(sizes[:2])
    offloaded = [sum(p.numel() for p in m.parameters(recurse=False) if p.device.type == "meta")
                 for m in model.modules()]
    return max(offloaded, default=0)


def _split(sizes: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(count, bytes of one block) pairs → (bytes that stay resident once freed, the rest).

    A freed block below the threshold stays in the process; a larger one goes back to the
    system. A block just over the threshold is counted resident up to the threshold, so the
    estimate never drops as a batch grows a block across it.
    """
    small = big = 0.0
    for count, size in sizes:
        small += count * min(size, MMAP_THRESHOLD)
        big += count * max(size - MMAP_THRESHOLD, 0)
    return small, big


def _gram_chosen(N: int, T: int, a: int, b: int, index: bool = False,
                 more: tuple[tuple[int, bool], ...] = ()) -> bool:
    """The engine's own cost rule (``factors.gram_is_cheaper``) for one parameter (a, b): a
    Pair of T positions (``index``: an embedding's one-hot rows) and, for a tied weight,
    ``more`` contributions (T, index); blocks counted in float32."""
    return gram_is_cheaper(N, a, b, [(T, index), *more], 4)


def _activation_blocks(s: Shape, N: int, L: int, e: int, padded: bool, per_row: bool = False):
    """(count, block bytes) of what the forward saves, all layers (Llama-style counts)."""
    d, kv, inter, H = s.hidden, s.kv_hidden, s.intermediate, s.heads
    tok = N * L
    # ghost: what autograd saves; Linear outputs only if their rule reads them (below)
    if per_row:  # one unpadded row, weights requiring grad, no hooks holding layer outputs
        n_d, n_kv = 8, 2
    else:
        n_d, n_kv = (8, 0) if padded else (6, 2)
    f32_d = 4 if e < 4 else 0  # RMSNorm upcasts kept in float32
    blocks = [
        (s.layers * (n_d - f32_d), tok * d * e),
        (s.layers * f32_d, tok * d * 4),
        (s.layers * n_kv, tok * kv * e),
        (s.layers * 4, tok * inter * e),
        (s.layers, tok * (H + 2) * 4),
        (3, tok * d * e),  # embedding output, final norm in and out
    ]
    if padded and not per_row:
        blocks.append((s.layers, tok * L * e))  # SDPA's attention mask, one per layer
    if not per_row and _linear_rule_reads_output():  # the hooks then keep q, k, v, o, down
        blocks += [(s.layers * 3, tok * d * e), (s.layers * 2, tok * kv * e)]
    return blocks


def _linear_rule_reads_output() -> bool:
    """Whether the registered nn.Linear rule reads its layer's output (its registration's
    ``uses_output``): the engine then keeps every Linear output until the backward."""
    rule = rule_for(nn.Linear(1, 1))
    return rule is not None and rule.uses_output


def _logit_blocks(s: Shape, N: int, A: int, e: int):
    kept = A + 1  # positions from the first answer-predicting one to the end
    # the answer rows in float32 (a copy in half precision), their log-softmax and gradient
    return [(3, N * kept * s.vocab * e), (2 if e >= 4 else 3, N * A * s.vocab * 4)]


def _ghost_backward_blocks(s: Shape, N: int, L: int, A: int, e: int):
    """What the ghost backward holds at its worst moment (the end, or a transient)."""
    d, kv, inter, V = s.hidden, s.kv_hidden, s.intermediate, s.vocab
    kept = A + 1
    f = max(e, 4)  # half-precision factors are multiplied as float32 copies (transient)
    linears = [(d, d), (kv, d), (d, d), (inter, d), (d, inter)]  # q; k and v; o; gate and up; down
    cached: list[tuple[float, float]] = []
    transient = 0.0
    for a, b in linears:
        if _gram_chosen(N, L, a, b):
            # the output gradient's float32 copy (half precision) and its Gram, one layer at a
            # time (only inputs' Grams are cached); the input and its Gram once per shared input
            transient = max(transient, N * L * a * (f if f > e else 0) + N * L * L * 4)
        else:
            transient = max(transient, 2 * N * a * b * 4)
    # inputs kept (in the model's dtype: a half-precision input is upcast only while its Gram
    # is computed) with their float32 Grams: norm outputs (q/k/v and gate/up), o_proj's and
    # down's inputs
    if _gram_chosen(N, L, d, d):
        cached += [(s.layers * 3, N * L * d * e), (s.layers * 3, N * L * L * 4)]
    if _gram_chosen(N, L, d, inter):
        cached += [(s.layers, N * L * inter * e), (s.layers, N * L * L * 4)]
        transient = max(transient, N * L * inter * (f if f > e else 0) + N * L * L * 4)
    cached.append((1, N * kept * V * f))  # the lm_head's output gradient, kept to the end
    if s.tied:
        cached.append((1, N * kept * V * e))  # its output too (released only at the end)
    # the embedding (index form), with the lm_head's contribution when tied
    if _gram_chosen(N, L, V, d, index=True, more=((kept, False),) if s.tied else ()):
        cached += [(2, N * L * L * 4), (2, N * kept * L * 4)]
    else:
        transient = max(transient, (3 if s.tied else 2) * N * V * d * 4)
    return cached, transient


def estimate(
    model: nn.Module | Shape,
    *,
    batch: int,
    length: int,
    answer_length: int,
    dtype: torch.dtype | None = None,
    method: Method = "ghost",
    param_bytes: int | None = None,
) -> Estimate:
    """Predicted peak memory of scoring one batch with :func:`isouq.score_sequences`.

    Args:
        model: the causal LM (or its :class:`Shape`).
        batch: N, rows in the batch.
        length: L, tokens per row after padding (prompt + answer of the longest row).
        answer_length: A, answer tokens of the longest answer (logits are kept from the first
            answer position on; at most ``length − 1`` count).
        dtype: the model's dtype when scored; default its parameters' dtype.
        method: the engine (``isouq.engines``): ``"ghost"`` (one backward per batch; also
            ``"per_token"``) or ``"per_example"`` (one backward per answer; ``"loop"``).
        param_bytes: bytes of the selected parameters (loop gradients); default all of them.

    Returns:
        An :class:`Estimate` in bytes; ``.total`` is the process's predicted peak resident
        memory, ``.working`` the part scoring adds beyond the loaded model.

    Raises:
        InputError: batch or answer length not positive, a length below 2, or an unknown
            method.
    """
    method = _planned(method)
    for name, v in (("batch", batch), ("length", length), ("answer_length", answer_length)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{name} must be a whole number ≥ 1, got {v!r}")
    if length < 2:
        raise InputError(f"length={length}: a scored row holds at least 2 tokens (the first "
                         "answer token is predicted from the one before it)")
    answer_length = min(answer_length, length - 1)  # the first token is never predicted
    s = model if isinstance(model, Shape) else shape_of(model, dtype)
    e = torch.empty((), dtype=s.dtype).element_size()
    N, L, A = batch, length, answer_length
    cal = CALIBRATION
    if method == "per_example":
        # the batch's no-grad forward holds only its logits; then one unpadded row at a time:
        # its activations, and the weight gradients of every selected parameter with their
        # concatenation and square (3 × parameter bytes) and the embedding's dense V × d buffer
        p_sel = s.param_bytes if param_bytes is None else param_bytes
        logit_blocks = [(1, N * (A + 1) * s.vocab * e), (2, N * A * s.vocab * 4)]
        # one layer's intermediates at a time (gated MLP, residual, attention mask)
        layer_blocks = [(4, N * L * s.intermediate * e), (2, N * L * s.hidden * e),
                        (1 if N > 1 else 0, N * L * L * e)]
        b_small, b_big = _split(logit_blocks + layer_blocks)
        logit = cal["logits"] * sum(c * b for c, b in logit_blocks)
        act = cal["activations"] * sum(c * b for c, b in _activation_blocks(
            s, 1, L, e, padded=False, per_row=True))
        # rows after the first: the previous row's gradients are still referenced while the
        # next backward allocates its own, so their small blocks are resident twice
        vd = s.vocab * s.hidden * e * (2 if s.tied else 1)  # embedding buffer (+ tied sum)
        grads = cal["loop_gradients"] * (3 * p_sel + vd + (s.small_param_bytes if N > 1 else 0))
        # the batch forward's small blocks stay resident while the rows run
        working = max(b_small + b_big, b_small + act + grads) + cal["overhead"]
        return Estimate(weights=s.param_bytes, runtime=int(cal["runtime"]), activations=int(act),
                        logits=int(logit), engine=int(grads), working=int(working))
    acts = _activation_blocks(s, N, L, e, padded=N > 1)
    logits = _logit_blocks(s, N, A, e)
    a_small, a_big = (cal["activations"] * x for x in _split(acts))
    l_small, l_big = (cal["logits"] * x for x in _split(logits))
    start = a_small + a_big + l_small + l_big  # the forward's end: everything live
    resident = a_small + l_small  # small blocks stay resident for the rest of the call
    cached, transient = _ghost_backward_blocks(s, N, L, A, e)
    c_small, c_big = _split(cached)
    # the backward's worst moment: its blocks reuse the forward's freed ones, except in half
    # precision, where the float32 copies are twice the size of the blocks freed
    worst = (max(resident, c_small) if e >= 4 else resident + c_small) + c_big + transient
    working = int(max(start, worst) + cal["overhead"])
    return Estimate(weights=s.param_bytes, runtime=int(cal["runtime"]),
                    activations=int(a_small + a_big), logits=int(l_small + l_big),
                    engine=int(max(0.0, worst - start)), working=working)


def peak_bytes(
    model: nn.Module | Shape,
    *,
    batch: int,
    length: int,
    answer_length: int,
    dtype: torch.dtype | None = None,
    method: Method = "ghost",
) -> int:
    """Predicted peak resident memory (bytes) of a process scoring one batch.

    Weights + interpreter and libraries + the scoring's own peak (:func:`estimate`).

    Args:
        model: the causal LM (or its :class:`Shape`).
        batch: N rows.
        length: L tokens per padded row.
        answer_length: A answer tokens of the longest answer.
        dtype: the dtype scored in; default the model's.
        method: the engine (``isouq.engines``): ``"ghost"``, ``"per_token"`` or ``"per_example"``.

    Returns:
        Bytes.
    """
    return estimate(model, batch=batch, length=length, answer_length=answer_length,
                    dtype=dtype, method=method).total


_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """A memory size written for people, in bytes.

    ``"8GB"`` = 8·10⁹ and ``"512MiB"`` = 512·2²⁰ (SI and IEC units as written); a bare letter
    (``"8G"``, ``"512m"``) is a power of 1024, as in ``ulimit`` and Docker; a plain number is
    bytes. Case and a space before the unit do not matter.

    Args:
        text: e.g. ``"8GB"``, ``"1.5 GiB"``, ``"512MiB"``, ``"800M"``, ``"1000000"``, or an int.

    Returns:
        Bytes (int, ≥ 1).

    Raises:
        InputError: not a positive number followed by one of B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
            T/TB/TiB.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise InputError(f"a memory size must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InputError(
            f"cannot read {text!r} as a memory size; write a number and a unit, e.g. '8GB', "
            "'512MiB', '1.5G' (B, KB/MB/GB/TB = powers of 1000, KiB/MiB/GiB/TiB or K/M/G/T = "
            "powers of 1024)")
    n = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(n) or n < 1:
        raise InputError(f"a memory size must be at least 1 byte, got {text!r}")
    return int(n)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def plan_batch_size(
    model: nn.Module | Shape,
    lengths: int | Iterable[int],
    budget_bytes: int | str,
    *,
    answer_length: int | None = None,
    method: Method = "ghost",
    dtype: torch.dtype | None = None,
    max_batch: int = 256,
) -> int:
    """The largest batch size whose predicted peak (:func:`peak_bytes`) fits the budget.

    Args:
        model: the causal LM (or its :class:`Shape`).
        lengths: the rows' total token counts (prompt + answer), or one length; batches are
            planned for the longest, to which every row is padded.
        budget_bytes: the process's memory budget, in bytes or as text (``"8GB"``, see
            :func:`parse_bytes`); it covers the weights, the runtime and the scoring.
        answer_length: answer tokens of the longest answer; default ``min(L − 1, 64)``.
        method: the engine (``isouq.engines``): ``"ghost"``, ``"per_token"`` or ``"per_example"``.
        dtype: the dtype scored in; default the model's.
        max_batch: the largest batch size to return.

    Returns:
        A batch size in ``[1, max_batch]``.

    Raises:
        MemoryBudgetError: even one row does not fit; the message gives the budget and the
            predicted need.
        InputError: no lengths, a length below 2, a bad budget or ``max_batch`` < 1.
    """
    budget = parse_bytes(budget_bytes)
    ls = [lengths] if isinstance(lengths, int) else list(lengths)
    if not ls:
        raise InputError("plan_batch_size needs at least one row length")
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 2 for x in ls):
        raise InputError("row lengths must be whole numbers ≥ 2 (a prompt token and an answer "
                         "token)")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise InputError(f"max_batch must be a whole number ≥ 1, got {max_batch!r}")
    L = max(ls)
    A = min(L - 1, 64) if answer_length is None else min(answer_length, L - 1)
    s = model if isinstance(model, Shape) else shape_of(model, dtype)

    def need(n: int) -> int:
        return peak_bytes(s, batch=n, length=L, answer_length=A, method=method)

    one = need(1)
    if one > budget:
        raise MemoryBudgetError(
            f"one row of {L} tokens needs about {_gib(one)} with method={method!r} "
            f"(weights {_gib(s.param_bytes)}), more than the memory budget of {_gib(budget)}; "
            "raise the budget, shorten the prompts, or score in a smaller dtype")
    lo, hi = 1, max_batch  # need() grows with n: largest n with need(n) ≤ budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _floor_size(n: int) -> str:
    """A size accelerate reads, rounded down: "1536MiB", "700KiB"."""
    return f"{n // 2**20}MiB" if n >= 2**20 else f"{max(1, n // 2**10)}KiB"


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else _gib(n)


#: the ways a model can be held for scoring, smallest change first
PLACEMENTS = ("memory", "fsdp", "device_map")


@dataclass(frozen=True)
class Placement:
    """Where a model must live to be scored within a memory budget (:func:`plan_placement`).

    Attributes:
        kind: ``"memory"`` (the whole model in one process), ``"fsdp"`` (its weights sharded
            over ``ranks`` processes, one device each: ``torchrun --nproc-per-node W isouq
            score --shard fsdp``) or ``"device_map"`` (accelerate keeps what does not fit on
            the device in CPU memory or on disk: ``--device-map auto --max-memory``).
        ranks: W for ``"fsdp"``; the fewest ranks whose share fits, if any does (else None).
        max_memory: for ``"device_map"``: bytes the weights may take on the device (the rest
            of the budget is the scoring's own), None when not even one layer fits.
        need: predicted peak bytes of one process with the whole model in memory.
        per_rank: predicted peak bytes of one rank under FSDP over ``ranks`` (None: no W fits).
        budget: the budget, in bytes.
        advice: one line saying what to run.
    """

    kind: str
    ranks: int | None
    max_memory: int | None
    need: int
    per_rank: int | None
    budget: int
    advice: str


def _root_layer_bytes(s: Shape) -> tuple[float, float]:
    """(embedding + head + final norm, one decoder layer) weight bytes of an unplaced model."""
    e = torch.empty((), dtype=s.dtype).element_size()
    root = s.vocab * s.hidden * e * (1 if s.tied else 2) + s.hidden * e
    return root, max(0.0, (s.param_bytes - root) / max(1, s.layers))


def fsdp_rank_bytes(s: Shape, ranks: int, *, batch: int = 1, length: int = 64,
                    answer_length: int = 16, method: Method = "ghost") -> int:
    """Predicted peak bytes of one of ``ranks`` FSDP2 processes (``--shard fsdp``): its 1/W
    shard of the weights, the root unit (embeddings, head) gathered through the forward, two
    decoder layers gathered (the one running, the next prefetched), and the scoring's own
    peak, which sharding does not divide (activations and output gradients are per row)."""
    est = estimate(s, batch=batch, length=length, answer_length=answer_length, method=method)
    root, layer = _root_layer_bytes(s)
    gathered = root * (ranks - 1) / ranks + 2 * layer
    return int(s.param_bytes / ranks + gathered + est.runtime + est.working)


def plan_placement(model: nn.Module | Shape, budget: int | str, *, batch: int = 1,
                   length: int = 64, answer_length: int = 16, devices: int = 1,
                   max_ranks: int = 64, method: Method = "ghost",
                   dtype: torch.dtype | None = None, device: str = "cpu") -> Placement:
    """Which way of holding ``model`` lets one process stay within ``budget`` while it scores
    a batch of ``batch`` rows of ``length`` tokens: in memory, FSDP over W ranks, or a device
    map offloading to CPU memory / disk.

    In memory when the predicted peak (:func:`peak_bytes`) fits. Otherwise FSDP over the
    fewest W ranks whose share fits (:func:`fsdp_rank_bytes`), when ``devices`` ≥ W processes
    (GPUs, or CPU processes) are available; otherwise a device map whose ``max_memory`` leaves
    room for the scoring and one offloaded layer loaded at a time. The budget is per process
    (a device's memory under torchrun).

    Args:
        model: the causal LM held in memory (or its :class:`Shape`).
        budget: bytes, or text such as ``"8GB"`` (:func:`parse_bytes`).
        batch, length, answer_length: the batch planned for (rows, padded tokens, answer
            tokens).
        devices: processes (one device each) a run may use: FSDP is chosen only if W ≤ it.
        max_ranks: the largest W considered.
        method: the engine: ``"ghost"`` (FSDP and offloading score with it) or ``"per_example"``.
        dtype: the dtype scored in; default the model's.
        device: the device scored on (``cpu``, ``cuda:N``): names it in ``--max-memory``.

    Returns:
        A :class:`Placement`, with a one-line ``advice``.

    Raises:
        MemoryBudgetError: no placement fits: even one offloaded layer and the scoring's own
            memory exceed the budget.
    """
    b = parse_bytes(budget)
    s = model if isinstance(model, Shape) else shape_of(model, dtype)
    est = estimate(s, batch=batch, length=length, answer_length=answer_length, method=method)
    need = est.total
    if need <= b:
        return Placement("memory", None, None, need, None, b,
                         f"the model fits in memory: {_size(need)} predicted within "
                         f"{_size(b)}; no placement needed")
    ranks = per_rank = None
    for w in range(2, max(2, max_ranks) + 1):
        got = fsdp_rank_bytes(s, w, batch=batch, length=length, answer_length=answer_length,
                              method=method)
        if got <= b:
            ranks, per_rank = w, got
            break
    # accelerate loads one offloaded module at a time: a decoder layer, or the embedding/head
    _, layer = _root_layer_bytes(s)
    layer = max(layer, s.vocab * s.hidden * torch.empty((), dtype=s.dtype).element_size())
    room = int(b - est.runtime - est.working - layer)
    max_memory = room if room > 0 else None
    key = "cpu" if not str(device).startswith("cuda") else (str(device).partition(":")[2] or "0")
    offload = (f"--device-map auto --max-memory {key}={_floor_size(room)} (accelerate keeps "
               "the other layers in CPU memory or on disk and loads each for its forward)"
               ) if max_memory else None
    fsdp = (f"torchrun --nproc-per-node {ranks} -m isouq score ... --shard fsdp (each rank "
            f"holds 1/{ranks} of the weights: {_size(per_rank)} per rank)") if ranks else None
    head = (f"the model needs about {_size(need)} in memory (weights {_size(s.param_bytes)}), more "
            f"than the budget of {_size(b)}")
    if ranks is not None and ranks <= devices:
        return Placement("fsdp", ranks, max_memory, need, per_rank, b,
                         f"{head}: shard it, {fsdp}" + (f"; or offload: {offload}"
                                                        if offload else ""))
    if max_memory is not None:
        more = f"; or, with {ranks} processes, {fsdp}" if fsdp else ""
        return Placement("device_map", ranks, max_memory, need, per_rank, b,
                         f"{head}: offload it, {offload}{more}")
    if ranks is not None:  # not enough devices for FSDP and nothing to offload into
        return Placement("fsdp", ranks, None, need, per_rank, b,
                         f"{head}, and one layer with the scoring does not fit either: "
                         f"{fsdp}")
    raise MemoryBudgetError(
        f"{head}; even one layer loaded at a time with the scoring ({_size(b - room)}) does not "
        f"fit, nor a share of it on up to {max_ranks} ranks: raise the budget, shorten the "
        "rows, or score in a smaller dtype")
