"""The batch loop of :func:`isouq.score_sequences`: token ids in, scores out, one forward and the
engine's backward(s) per batch.

:func:`score_encoded` is the kernel: for each batch of already prepared pairs (``isouq.prepare``)
it pads them (:func:`collate`), runs the forward (:func:`forward_probs`: the probability of every
answer token, and the hidden states when ``on_states`` asks for them), then the engine's
backward — ``"ghost"``: ONE backward of Σᵢ p̄ᵢ whose hooks give every answer's ‖∇θ p̄ᵢ‖²
(``isouq.ghost``); ``"per_example"``: one backward per answer, the paper's way, any covariance;
``"per_token"``: the paper's per-token comparison. A caller that needs more from the same
forward (span scores: one ghost backward per span index over the retained graph) passes
``after_forward``, called between the forward and the engine's backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import nn

from .blocks import Blocks
from .covariance import Covariance
from .errors import ModelError
from .estimators import eval_mode
from .ghost.engine import GhostNorms
from .ghost.factors import round_up, token_multiple
from .ghost.weights import execution_device
from .llm.packed_logits import takes_logits_to_keep
from .quantized import autograd_ready
from .scores import ParamInfo, SequenceScores
from .tokens import Encoded

#: called after a batch's forward, before the engine's backward, as
#: ``after_forward(ghost, p, mask, rows)``: the batch's GhostNorms (None with per_example), the
#: token probabilities (N, L−1) and answer mask of its rows ``rows`` (a slice of the pairs); it
#: may run ghost backwards over the same graph with ``retain_graph=True``
AfterForward = Callable[[GhostNorms | None, torch.Tensor, torch.Tensor, slice], None]


@dataclass
class Batch:
    """Padded batch. input_ids/attention_mask/position_ids: (N, L); answer_mask: (N, L−1),
    true where logits[:, j] predict an answer token input_ids[:, j + 1].

    :func:`collate` also gives what the host knows of the batch, so that no step has to read it
    back from the device (a host sync on a GPU): ``first``, the first column of
    ``answer_mask`` holding an answer token in any row; ``answer_index`` (4, n) of its n
    answer tokens: row, column counted from ``first``, column, and the token id predicted;
    ``n_tokens`` (N,) float32, each row's answer tokens; ``answer_positions`` (N, K), each
    row's answer columns counted from ``first``, padded with the last one, L − 1 − first, which
    predicts no token (K a multiple of ``collate``'s ``multiple``); ``packed`` (3, N, L), the
    three id tensors in one (moved to a device in one copy). A batch made by hand may leave
    them None: they are then read from the masks."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    answer_mask: torch.Tensor
    first: int | None = None
    answer_index: torch.Tensor | None = None
    n_tokens: torch.Tensor | None = None
    answer_positions: torch.Tensor | None = None
    packed: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself when it is there): one copy per host tensor, queued
        without waiting for the device (``non_blocking``: a blocking host→device copy would
        wait for every kernel queued before it)."""
        if self.input_ids.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        if self.packed is not None:
            ids, att, pos = move(self.packed)
        else:
            ids, att, pos = (move(t) for t in (self.input_ids, self.attention_mask,
                                                self.position_ids))
        return Batch(ids, att, pos, move(self.answer_mask), self.first,
                     move(self.answer_index), move(self.n_tokens), move(self.answer_positions))


def collate(enc: list[Encoded], pad_id: int, side: Literal["right", "left"] = "right",
            multiple: int = 1) -> Batch:
    """The encoded pairs as one padded batch, made on the host (Python lists, one tensor each:
    no operation per row).

    Args:
        enc: the pairs' token ids.
        pad_id: the id that fills the padding (masked out).
        side: where the padding goes.
        multiple: rows padded to a multiple of this many positions (``ghost.factors.
            token_multiple``: 8 on CUDA, where aligned Grams run on tensor cores).

    Returns:
        Batch of (N, L) tensors, L the longest pair rounded up to ``multiple``, with its
        host-side facts (``first``, ``answer_index``, ``n_tokens``).
    """
    L = round_up(max(len(e.prompt) + len(e.answer) for e in enc), multiple)
    ids, att, pos, ans = [], [], [], []
    rows, cols, targets, counts = [], [], [], []
    for i, e in enumerate(enc):
        seq = e.prompt + e.answer
        n = len(seq)
        start = 0 if side == "right" else L - n
        after = L - start - n
        ids.append([pad_id] * start + seq + [pad_id] * after)
        att.append([0] * start + [1] * n + [0] * after)
        pos.append([0] * start + list(range(n)) + [n - 1] * after)
        # logits[:, j] predicts token j + 1: the answer tokens scored are predicted by
        # columns from the one before the first scored token to the one before the last
        lo = start + len(e.prompt) + e.scored_from - 1
        hi = start + n - 1
        ans.append([False] * lo + [True] * (hi - lo) + [False] * (L - 1 - hi))
        rows += [i] * (hi - lo)
        cols += range(lo, hi)
        targets += seq[lo - start + 1:]
        counts.append(float(hi - lo))
    first = min(cols) if cols else 0
    packed = torch.tensor([ids, att, pos], dtype=torch.long)
    index = torch.tensor([rows, [c - first for c in cols], cols, targets], dtype=torch.long)
    K = min(L - first, round_up(max(int(max(counts, default=1)), 1), multiple))
    kept = [[] for _ in enc]
    for i, c in zip(rows, cols, strict=True):
        kept[i].append(c - first)
    last = L - 1 - first  # predicts no token: its logits carry no gradient
    kept = torch.tensor([k + [last] * (K - len(k)) for k in kept], dtype=torch.long)
    return Batch(packed[0], packed[1], packed[2], torch.tensor(ans, dtype=torch.bool), first,
                 index, torch.tensor(counts, dtype=torch.float32), kept, packed)


def input_device(model: nn.Module) -> torch.device:
    """Where the input ids go: the embedding's device; for one accelerate offloads (weight on
    ``meta``), the device its hook runs it on."""
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    if dev.type != "meta":
        return dev
    return execution_device(emb) or execution_device(model) or torch.device("cpu")


#: called after a batch's forward with the model's ``hidden_states`` (a tuple of (N, L, d)
#: tensors, detached) and the batch and its rows: ``on_states(hidden_states, batch, rows)``
OnStates = Callable[[tuple[torch.Tensor, ...], Batch, slice], None]


class ForwardProbs(NamedTuple):
    """What :func:`forward_probs` gives."""

    #: (N, L−1) probability of each next token, zero off the answer
    p: torch.Tensor
    #: (N, L−1) true where p holds an answer token's probability
    mask: torch.Tensor
    #: the model's ``hidden_states`` (detached), when asked for; else None
    hidden_states: tuple[torch.Tensor, ...] | None


def answer_index(batch: Batch) -> tuple[int, torch.Tensor]:
    """(``first``, (4, n) ``answer_index``) of the batch: as :func:`collate` gave them, or, for
    a batch made by hand, read from its masks (a host sync)."""
    if batch.first is not None and batch.answer_index is not None:
        return batch.first, batch.answer_index
    mask = batch.answer_mask
    first = int(mask.any(0).nonzero()[0])
    rows, cols = mask.nonzero(as_tuple=True)
    targets = batch.input_ids[:, 1:][rows, cols]
    return first, torch.stack([rows, cols - first, cols, targets])


def forward_probs(model: nn.Module, batch: Batch, *, hidden_states: bool = False,
                  fixed_shapes: bool = False) -> ForwardProbs:
    """Forward pass: the probability of each answer token, and with ``hidden_states`` the
    model's hidden states from the same forward (no second pass).

    No value or size is read back from the device: the answer positions, the first of them and
    the tokens they predict come from the host (:func:`collate`), and a NaN in the model's
    log-probabilities shows in the scores (``score_encoded`` checks them on the host).

    ``fixed_shapes``: every tensor's shape set by the batch's (rows, length) alone (graph
    capture, ``isouq.capture``): the logits of every position, each token's probability, the
    answer mask applied; else only the answer positions' logits are read (less memory)."""
    dev = input_device(model)  # with device_map="auto": the first layer's
    if fixed_shapes:  # only the tensors whose shapes the (rows, length) sets
        batch = Batch(batch.input_ids, batch.attention_mask, batch.position_ids,
                      batch.answer_mask, packed=batch.packed)
    b = batch.to(dev)
    L = b.input_ids.shape[1]
    if fixed_shapes:
        inputs = dict(input_ids=b.input_ids, attention_mask=b.attention_mask,
                      position_ids=b.position_ids, output_hidden_states=hidden_states)
        out = model(**inputs)
        logits = (out.logits if hasattr(out, "logits") else out[0])[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
        states = getattr(out, "hidden_states", None) if hidden_states else None
        return ForwardProbs(lp.exp() * b.answer_mask, b.answer_mask,
                            tuple(h.detach() for h in states) if states else None)
    first, index = answer_index(b)
    rows, rel, cols, targets = index
    # logits only from the first position that predicts an answer token (lm_head is a large
    # share of a small LM's forward); models without ``logits_to_keep`` compute them all
    inputs = dict(input_ids=b.input_ids, attention_mask=b.attention_mask,
                  position_ids=b.position_ids)
    if hidden_states:
        inputs["output_hidden_states"] = True
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = L - first
    out = model(**inputs)
    states = getattr(out, "hidden_states", None) if hidden_states else None
    if hidden_states and not states:
        raise ModelError(f"{type(model).__name__} returns no hidden_states; the hidden-state "
                         "probe needs a Hugging Face causal LM")
    logits = out.logits if hasattr(out, "logits") else out[0]
    logits = logits[:, -(L - first):]  # positions first .. L−1
    sel = logits[rows, rel].float()  # only answer positions: (n_tok, V)
    lp = torch.log_softmax(sel, dim=-1).gather(1, targets[:, None])[:, 0]
    p = lp.new_zeros(b.answer_mask.shape).index_put((rows, cols), lp.exp())
    return ForwardProbs(p, b.answer_mask, tuple(h.detach() for h in states) if states else None)


def token_probs(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass; returns (p (N, L−1) probability of each next token, zero off-answer; mask)."""
    p, mask, _ = forward_probs(model, batch)
    return p, mask


def summarize(p: torch.Tensor, mask: torch.Tensor):
    """(p̄, aleatoric, T) per row from token probabilities p (N, L−1) and mask."""
    T = mask.sum(1)
    mean = p.sum(1) / T
    alea = (p * (1 - p) * mask).sum(1) / T
    return mean, alea, T


def log_prob(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) Σₜ log pₜ over the masked tokens of each row (nats): the answer's log-probability
    (a probability that underflowed to 0 counts as the smallest positive one)."""
    tiny = torch.finfo(p.dtype).tiny
    return (torch.log(p.clamp_min(tiny)) * mask).sum(1)


class _only_selected_require_grad:
    """Context: the selected parameters require grad, every other one does not."""

    def __init__(self, model: nn.Module, params: dict):
        self.model, self.ids = model, {id(p) for p in params.values()}

    def __enter__(self):
        self.saved = [(p, p.requires_grad) for p in self.model.parameters()]
        for p, _ in self.saved:
            p.requires_grad_(id(p) in self.ids)

    def __exit__(self, *exc):
        for p, flag in self.saved:
            p.requires_grad_(flag)


def _per_example_batch(model, params, batch: Batch, cov) -> tuple[torch.Tensor, torch.Tensor]:
    """One backward per answer: ((N,) gᵀCg, (N, n_tensors) ‖g‖² per parameter tensor)."""
    tensors = list(params.values())
    totals, per = [], []
    for i in range(batch.input_ids.shape[0]):
        keep = batch.attention_mask[i].bool()
        one = Batch(
            batch.input_ids[i : i + 1, keep],
            batch.attention_mask[i : i + 1, keep],
            batch.position_ids[i : i + 1, keep],
            batch.answer_mask[i : i + 1, keep[:-1] & keep[1:]],
        )
        with torch.enable_grad():
            p, mask = token_probs(model, one)
            mean, _, _ = summarize(p, mask)
            gs = torch.autograd.grad(mean[0], tensors, allow_unused=True)
        gs = [torch.zeros_like(t) if g is None else g for g, t in zip(gs, tensors, strict=False)]
        per.append(torch.stack([g.float().pow(2).sum() for g in gs]))
        flat = torch.cat([g.reshape(-1) for g in gs])
        totals.append(cov.quadratic(flat[None])[0])
    return torch.stack(totals), torch.stack(per)


def _per_token(ghost: GhostNorms, p: torch.Tensor, mask: torch.Tensor):
    """(1/T²) Σₜ ‖∇θ pₜ‖²: one batched backward per answer-token index k; (total (N,),
    per parameter (N, n))."""
    N = p.shape[0]
    T = mask.sum(1)
    # position of the k-th answer token in each row
    order = torch.cumsum(mask.long(), 1) - 1
    total = torch.zeros(N, dtype=p.dtype, device=p.device)
    per = None
    kmax = int(T.max())
    for k in range(kmax):
        sel = mask & (order == k)
        s = (p * sel).sum(1)
        res = ghost.backward_detailed(s, retain_graph=k < kmax - 1)
        total = total + res.total
        per = res.per_param if per is None else per + res.per_param
    T2 = T.to(p.dtype).pow(2)
    return total / T2, per / T2[:, None]


def _lockstep(n_batches: int) -> int:
    """The most batches any rank runs (a model sharded with FSDP2: every rank runs as many)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return n_batches
    from .distributed import DistEnv, lockstep_steps

    return lockstep_steps(n_batches, DistEnv(dist.get_rank(), dist.get_world_size()))


def _filler_batch(model: nn.Module, ghost: GhostNorms, batch: Batch) -> None:
    """One forward and backward whose scores are dropped (a rank short of batches)."""
    ghost.seq_len = batch.input_ids.shape[1]
    ghost.head_positions = _head_positions(model, batch)
    with torch.enable_grad():
        p, mask = token_probs(model, batch)
        ghost.backward_detailed(summarize(p, mask)[0], per_param=False)


def score_encoded(
    model: nn.Module,
    enc: Sequence[Encoded],
    params: dict[str, nn.Parameter],
    info: ParamInfo,
    *,
    pad: int,
    method: str = "ghost",
    covariance: Covariance,
    batch_size: int = 16,
    per_param: bool = False,
    blocks: Blocks | None = None,
    padding_side: Literal["right", "left"] = "left",
    lockstep: bool = False,
    progress: bool = False,
    after_forward: AfterForward | None = None,
    on_states: OnStates | None = None,
    fixed_shapes: bool = False,
    capture: bool = False,
) -> SequenceScores:
    """Score prepared pairs, batch after batch (the kernel of :func:`isouq.score_sequences`,
    which checks everything first).

    Args:
        model: the causal LM.
        enc: the pairs' token ids (``isouq.prepare``: checked against the model).
        params: name -> parameter of those that take part (``params.select_params``).
        info: their :class:`ParamInfo`.
        pad: the padding id (``tokens.pad_id``).
        method: ``"ghost"``, ``"per_example"``, ``"per_token"`` or ``"forward"`` (no backward:
            the gradient score is NaN) (resolved, ``engines``).
        covariance: a :class:`Covariance` (anything but the identity: ``per_example`` only).
        batch_size: answers per forward/backward.
        per_param: also the (N, n_tensors) norms by parameter tensor.
        blocks: also the (N, B) norms by block (``isouq.blocks``; ghost: from the same
            backward, summed by block).
        padding_side: where the padding goes (it never changes a score).
        lockstep: the weights are sharded (FSDP2): every rank runs as many batches.
        progress: show a progress bar.
        after_forward: called after each batch's forward, before its engine's backward
            (:data:`AfterForward`).
        on_states: given each batch's hidden states from its forward (:data:`OnStates`; the
            forward then asks the model for them).
        fixed_shapes: each batch with shapes set by its (rows, length) alone
            (``forward_probs``'s ``fixed_shapes``, the LM head not compacted).
        capture: with fixed shapes, each batch's ghost backward captured as one graph
            (compiled autograd, :func:`captured`; ``isouq.capture``'s checks decide that it is
            offered).

    Returns:
        :class:`SequenceScores` of the pairs, in their order.
    """
    n = len(enc)
    multiple = token_multiple(input_device(model))
    n_per = len(params) if per_param or (blocks and method != "ghost") else 0
    n_blocks = len(blocks.names) if blocks is not None else 0
    groups = blocks.of_param if blocks is not None else None
    scale = getattr(covariance, "scale", 1.0)  # the identity's scale (per_example applies C)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"scoring ({method})", unit="answer")
    host: list[torch.Tensor] = []  # per batch, its scores copied to the host in one copy
    # one set of hooks for every batch (set up once: milliseconds per call on an LLM)
    hooks = GhostNorms(model, params) if method not in ("per_example", "forward") \
        else nullcontext()
    with eval_mode(model), autograd_ready(model), hooks as ghost:
        starts = range(0, n, batch_size)
        for k in range(_lockstep(len(starts)) if lockstep else len(starts)):
            if k >= len(starts):  # FSDP2: another rank's batch needs this rank's collectives
                _filler_batch(model, ghost, collate(list(enc[:1]), pad, padding_side, multiple))
                continue
            s = starts[k]
            rows = slice(s, min(s + batch_size, n))
            batch = collate(list(enc[rows]), pad, padding_side, multiple)
            if method != "per_example":  # on the device once, before the forward: nothing
                batch = batch.to(input_device(model))  # is copied there once it has begun
            pb = None
            want = on_states is not None
            if method == "forward":  # no backward: no gradient score
                with torch.no_grad():
                    p, mask, states = forward_probs(model, batch, hidden_states=want)
                    T = batch.n_tokens.to(p.device)
                    mean = p.sum(1) / T
                    e = torch.full_like(mean, float("nan"))
                if after_forward is not None:
                    after_forward(None, p, mask, rows)
            elif method == "per_example":
                with torch.no_grad():
                    p, mask, states = forward_probs(model, batch, hidden_states=want)
                    T = batch.n_tokens.to(p.device)
                    mean = p.sum(1) / T
                if after_forward is not None:
                    after_forward(None, p, mask, rows)
                with _only_selected_require_grad(model, params):
                    e, pp = _per_example_batch(model, params, batch, covariance)
            else:
                ghost.seq_len = batch.input_ids.shape[1]
                fixed = fixed_shapes or capture
                ghost.head_positions = _head_positions(model, batch, every=fixed)
                with torch.enable_grad():
                    p, mask, states = forward_probs(model, batch, hidden_states=want,
                                                    fixed_shapes=fixed)
                    T = batch.n_tokens.to(p.device)
                    mean = p.sum(1) / T  # p̄, what the backward differentiates
                    if after_forward is not None:  # e.g. span backwards over the same graph
                        after_forward(ghost, p, mask, rows)
                    if method == "ghost":  # without per_param, the shared groups' summed form
                        with captured() if capture else nullcontext():
                            res = ghost.backward_detailed(mean, per_param=per_param,
                                                          groups=groups)
                        e, pp, pb = res.total, res.per_param, res.per_group
                    else:
                        e, pp = _per_token(ghost, p, mask)
                    if covariance.scale != 1:  # per_example applied the covariance already
                        e = covariance.scale * e
            if want:
                on_states(states, batch, rows)
            host.append(_to_host(e, mean, p.detach(), mask, T, pp if n_per else None,
                                 None if not n_blocks else
                                 pb if pb is not None
                                 else pp.float() @ blocks.indicator().to(pp.device),
                                 scale))
            _check_finite(host[-1], rows)
            if bar is not None:
                bar.update(rows.stop - rows.start)
    if bar is not None:
        bar.close()
    out = host[0] if len(host) == 1 else torch.cat(host, dim=1)  # on the host
    per = out[4:4 + n_per].T if n_per else None
    return SequenceScores(
        epistemic=out[0],
        aleatoric=out[2],
        mean_prob=out[1],
        n_tokens=torch.tensor([len(e.answer) - e.scored_from for e in enc]),
        params=info,
        method=method,
        covariance=getattr(covariance, "name", "custom"),
        per_param=per if per_param else None,
        blocks=out[4 + n_per:].T if n_blocks else None,
        block_names=blocks.names if blocks is not None else None,
        seq_logprob=out[3],
    )


def _head_positions(model: nn.Module, batch: Batch, every: bool = False
                    ) -> tuple[torch.Tensor, int]:
    """(positions (N, K), T) of the model's head output (N, T, V) that may carry gradient: the
    batch's answer positions (``GhostNorms.head_positions``), counted from ``first`` when the
    forward keeps only the logits from there on (``logits_to_keep``); with ``every``, all T
    positions (no compaction: shapes set by the batch's length alone)."""
    L = batch.input_ids.shape[1]
    if every:
        return torch.arange(L, device=batch.input_ids.device).expand(batch.input_ids.shape[0],
                                                                      L), L
    if takes_logits_to_keep(model):
        return batch.answer_positions, L - batch.first
    return batch.answer_positions + batch.first, L


#: the torch.compile backend a captured backward runs on (``isouq.capture`` checks with it)
CAPTURE_BACKEND = "aot_eager"


def captured():
    """The context a captured batch's backward runs in: compiled autograd, one graph of the
    whole backward (hooks included, ``fullgraph``: a graph break is an error) on
    :data:`CAPTURE_BACKEND`."""
    from torch._dynamo import compiled_autograd

    from .ghost.factors import constant_settings

    constant_settings()

    return compiled_autograd._enable(torch.compile(backend=CAPTURE_BACKEND, fullgraph=True))


def _to_host(total: torch.Tensor, mean: torch.Tensor, p: torch.Tensor, mask: torch.Tensor,
             T: torch.Tensor, per: torch.Tensor | None, by_block: torch.Tensor | None,
             scale: float) -> torch.Tensor:
    """One batch's scores in one float32 tensor on the host, made with one device→host copy:
    rows ‖g‖², p̄, aleatoric, Σ log p, then the per-parameter norms and the block profile (each
    (N, ·) transposed) when asked for."""
    with torch.no_grad():
        return _stacked(total, mean, p, mask, T, per, by_block, scale).cpu()


def _stacked(total, mean, p, mask, T, per, by_block, scale) -> torch.Tensor:
    """:func:`_to_host`'s tensor, on the device."""
    alea = torch.addcmul(p, p, p, value=-1).sum(1) / T  # (1/T) Σₜ pₜ(1 − pₜ)
    cols = torch.stack([total.to(torch.float32), mean.detach().to(torch.float32), alea,
                        log_prob(p, mask).to(torch.float32)])
    extra = [t.T.to(torch.float32) for t in (per, by_block) if t is not None]
    if by_block is not None and scale != 1.0:
        extra[-1] = scale * extra[-1]
    return torch.cat([cols, *extra]) if extra else cols


def _check_finite(scores: torch.Tensor, rows: slice) -> None:
    """ModelError when a batch's p̄ (on the host) is NaN or inf: a NaN or +inf logit anywhere
    in a row makes its log-softmax NaN. Read with numpy, on the copy already made."""
    bad = ~np.isfinite(scores[1].numpy())
    if bad.any():
        raise ModelError(
            f"the log-probabilities of the model's logits hold NaN/inf values (answers "
            f"{[rows.start + int(i) for i in np.flatnonzero(bad)]}). Check the model's weights "
            "(NaN/inf) or dtype.")


__all__ = ["AfterForward", "Batch", "ForwardProbs", "OnStates", "collate", "forward_probs",
           "input_device", "log_prob", "score_encoded", "summarize", "token_probs"]
