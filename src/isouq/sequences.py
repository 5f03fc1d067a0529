"""Uncertainty of generated answers: p̄, aleatoric and ‖∇θ p̄‖² for causal language models.

For an answer y = (y₁..y_T) to a prompt x: pₜ = p(yₜ | y<ₜ, x, θ*), p̄ = (1/T) Σₜ pₜ,
aleatoric = (1/T) Σₜ pₜ(1 − pₜ), epistemic = ‖∇θ p̄‖² (paper §3.4). Methods:
- ``"ghost"``: every answer of a batch from ONE backward pass of Σᵢ p̄ᵢ (exact; ghost norms);
- ``"per_example"`` (older name ``"loop"``): one backward pass per answer (the paper's way;
  the reference), which also accepts a non-identity covariance object (per-example gradients
  are materialized);
- ``"per_token"``: the paper's comparison (1/T²) Σₜ ‖∇θ pₜ‖², one batched backward per token
  position.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from numbers import Integral
from typing import Literal

import torch
from torch import nn

from .covariance import Covariance, Identity
from .engines import engine_name
from .errors import InputError, check_finite
from .estimators import eval_mode
from .ghost.engine import GhostNorms
from .ghost.factors import round_up, token_multiple
from .ghost.weights import execution_device, is_offloaded, is_sharded
from .params import ParamSpec, param_info, select_params
from .quantized import autograd_ready, is_quantized
from .scores import SequenceScores

SeqMethod = Literal["auto", "ghost", "per_example", "per_token", "loop"]
Prompt = str | Sequence[dict]


@dataclass
class Encoded:
    """Token ids of one (prompt, answer) pair; ``scored_from``: answer tokens before it are
    context only, not in p̄ (``isouq.spans``: a span's row); ``offsets``: the (start, end)
    character range of each answer token in the answer's text, when the tokenizer gave them
    (``encode(..., offsets=True)``; read by ``isouq.spans``), else None."""

    prompt: list[int]
    answer: list[int]
    scored_from: int = 0
    offsets: list[tuple[int, int]] | None = None


def _is_messages(prompt) -> bool:
    return (isinstance(prompt, list | tuple) and len(prompt) > 0 and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt))


def _prompt_ids(tokenizer, prompt: Prompt, i: int) -> list[int]:
    if isinstance(prompt, str):
        bos = getattr(tokenizer, "bos_token", None)
        add = not (bos and prompt.startswith(bos))
        return list(tokenizer(prompt, add_special_tokens=add)["input_ids"])
    if not _is_messages(prompt):
        raise InputError(f"prompt {i} must be a string or a non-empty list of "
                         f"{{'role': str, 'content': str}} messages, got {type(prompt).__name__}"
                         f" {str(prompt)[:40]}")
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "a prompt was given as chat messages but the tokenizer has no chat template; "
            "pass the prompt as a plain string instead"
        )
    try:
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - jinja2 errors of the model's own template
        raise InputError(f"prompt {i}: the tokenizer's chat template cannot render these "
                         f"messages ({type(e).__name__}: {e}); check their roles and order"
                         ) from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _answer_ids(tokenizer, answer, i: int) -> list[int]:
    return _answer_tokens(tokenizer, answer, i)[0]


def _answer_tokens(tokenizer, answer, i: int, offsets: bool = False
                   ) -> tuple[list[int], list[tuple[int, int]] | None]:
    """(token ids, their character offsets or None) of an answer: one tokenizer call for a
    string answer; the offsets when asked for and the tokenizer is a fast one."""
    if isinstance(answer, str):
        if not answer:
            return [], None
        if offsets and getattr(tokenizer, "is_fast", False):
            enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
            return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]
        return list(tokenizer(answer, add_special_tokens=False)["input_ids"]), None
    if isinstance(answer, torch.Tensor) and not answer.is_floating_point() and answer.ndim == 1:
        answer = answer.tolist()
    if isinstance(answer, list | tuple) and all(
            isinstance(t, Integral) and not isinstance(t, bool) and t >= 0 for t in answer):
        return [int(t) for t in answer], None
    raise InputError(f"answer {i} must be a string or a list of token ids (whole numbers ≥ 0), "
                     f"got {type(answer).__name__} {str(answer)[:40]}; pass text as a string")


def encode(tokenizer, prompts: Sequence[Prompt], answers: Sequence, *,
           offsets: bool = False) -> list[Encoded]:
    """Tokenize pairs, each prompt and each answer text in one tokenizer call.

    Args:
        tokenizer: the model's tokenizer.
        prompts: N strings or chat messages ([{"role", "content"}, ...]), rendered with the
            chat template and a generation prompt.
        answers: N strings (tokenized without special tokens) or lists of token ids (e.g. the
            ids a generation produced).
        offsets: also keep each string answer's character offsets (``Encoded.offsets``), from
            the same call, when the tokenizer is a fast one (span scores read them).

    Returns:
        N :class:`Encoded`, to pass as ``score_sequences(..., encoded=...)``.
    """
    if isinstance(prompts, str) or isinstance(answers, str):
        raise InputError("prompts and answers must be lists (one entry per answer), not a string")
    if len(prompts) != len(answers):
        raise InputError(f"got {len(prompts)} prompts but {len(answers)} answers; pass one each")
    if len(prompts) == 0:
        raise InputError("no answers to score: prompts and answers are empty")
    out = []
    for i, (p, a) in enumerate(zip(prompts, answers, strict=False)):
        ids, offs = _answer_tokens(tokenizer, a, i, offsets)
        if not ids:
            raise InputError(f"answer {i} is empty (no tokens); every answer needs ≥ 1 token")
        out.append(Encoded(_prompt_ids(tokenizer, p, i), ids, offsets=offs))
    return out


def given_encoding(encoded: Sequence[Encoded], prompts: Sequence, answers: Sequence
                   ) -> list[Encoded]:
    """``encoded`` as ``score_sequences(..., encoded=...)`` takes it: one :class:`Encoded` with
    ≥ 1 answer token per (prompt, answer) pair, else an InputError naming the fix."""
    if isinstance(encoded, Encoded) or not isinstance(encoded, Sequence):
        raise InputError(f"encoded must be a list of Encoded (one per answer), got "
                         f"{type(encoded).__name__}; make it with isouq.sequences.encode")
    if not len(encoded) == len(prompts) == len(answers):
        raise InputError(f"got {len(encoded)} encoded pairs for {len(prompts)} prompts and "
                         f"{len(answers)} answers; pass one Encoded per pair "
                         "(isouq.sequences.encode of the same pairs)")
    if not encoded:
        raise InputError("no answers to score: prompts and answers are empty")
    for i, e in enumerate(encoded):
        if not isinstance(e, Encoded) or not e.answer:
            raise InputError(f"encoded pair {i} is not an Encoded with ≥ 1 answer token; make "
                             "it with isouq.sequences.encode")
    return list(encoded)


def context_window(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def check_lengths(model: nn.Module, enc: list[Encoded]) -> None:
    """InputError naming the answer whose tokens do not fit the model (context window, ids
    outside the vocabulary)."""
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    vocab = getattr(emb, "num_embeddings", None)
    for i, e in enumerate(enc):
        if vocab is not None and max(e.prompt + e.answer) >= vocab:
            raise InputError(f"answer {i}: token id {max(e.prompt + e.answer)} is outside the "
                             f"model's vocabulary of {vocab}; pass ids of this model's tokenizer")
    window = context_window(model)
    if window is None:
        return
    for i, e in enumerate(enc):
        n = len(e.prompt) + len(e.answer)
        if n > window:
            raise InputError(
                f"answer {i}: prompt + answer are {n} tokens, longer than the model's context "
                f"window of {window}; shorten the prompt or the answer"
            )


@dataclass
class Batch:
    """Padded batch. input_ids/attention_mask/position_ids: (N, L); answer_mask: (N, L−1),
    true where logits[:, j] predict an answer token input_ids[:, j + 1]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    answer_mask: torch.Tensor


def collate(enc: list[Encoded], pad_id: int, side: Literal["right", "left"] = "right",
            multiple: int = 1) -> Batch:
    """The encoded pairs as one padded batch.

    Args:
        enc: the pairs' token ids.
        pad_id: the id that fills the padding (masked out).
        side: where the padding goes.
        multiple: rows padded to a multiple of this many positions (``ghost.factors.
            token_multiple``: 8 on CUDA, where aligned Grams run on tensor cores).

    Returns:
        Batch of (N, L) tensors, L the longest pair rounded up to ``multiple``.
    """
    L = round_up(max(len(e.prompt) + len(e.answer) for e in enc), multiple)
    N = len(enc)
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    att = torch.zeros((N, L), dtype=torch.long)
    ans = torch.zeros((N, L), dtype=torch.bool)
    for i, e in enumerate(enc):
        seq = e.prompt + e.answer
        start = 0 if side == "right" else L - len(seq)
        ids[i, start : start + len(seq)] = torch.tensor(seq)
        att[i, start : start + len(seq)] = 1
        ans[i, start + len(e.prompt) + e.scored_from : start + len(seq)] = True
    pos = (att.cumsum(1) - 1).clamp(min=0)
    return Batch(ids, att, pos, ans[:, 1:])


def input_device(model: nn.Module) -> torch.device:
    """Where the input ids go: the embedding's device; for one accelerate offloads (weight on
    ``meta``), the device its hook runs it on."""
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    if dev.type != "meta":
        return dev
    return execution_device(emb) or execution_device(model) or torch.device("cpu")


def token_probs(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass; returns (p (N, L−1) probability of each next token, zero off-answer; mask)."""
    dev = input_device(model)  # with device_map="auto": the first layer's
    mask = batch.answer_mask.to(dev)
    # logits only from the first position that predicts an answer token (lm_head is a large
    # share of a small LM's forward); models without ``logits_to_keep`` compute them all
    start = int(mask.any(0).nonzero()[0])
    L = batch.input_ids.shape[1]
    inputs = dict(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
                  position_ids=batch.position_ids.to(dev))
    try:
        out = model(**inputs, logits_to_keep=L - start)
    except TypeError:
        out = model(**inputs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    logits = logits[:, -(L - start) :]  # positions start .. L−1
    mask_k = mask[:, start:]
    rows, cols = mask_k.nonzero(as_tuple=True)
    sel = logits[:, :-1][rows, cols].float()  # only answer positions: (n_tok, V)
    target = batch.input_ids[:, 1:].to(dev)[:, start:][rows, cols]
    lp = torch.log_softmax(sel, dim=-1).gather(1, target[:, None])[:, 0]
    # a NaN or +inf logit anywhere in a row makes its log-softmax NaN/inf: checking the n_tok
    # values read is as strict as checking all n_tok·V logits (a tenth of a second per batch)
    check_finite(lp.detach(), "the log-probabilities of the model's logits",
                 "Check the model's weights (NaN/inf) or dtype.")
    p = torch.zeros(mask.shape, dtype=lp.dtype, device=dev)
    p = p.index_put((rows, cols + start), lp.exp())
    return p, mask


def summarize(p: torch.Tensor, mask: torch.Tensor):
    """(p̄, aleatoric, T) per row from token probabilities p (N, L−1) and mask."""
    T = mask.sum(1)
    mean = p.sum(1) / T
    alea = (p * (1 - p) * mask).sum(1) / T
    return mean, alea, T


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS token, else 0 (padded
    positions are masked, so which id it is never changes a score)."""
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, Integral) and not isinstance(v, bool):
            return int(v)
    return 0


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


def _loop_batch(model, params, batch: Batch, cov) -> tuple[torch.Tensor, torch.Tensor]:
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


def score_sequences(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    answers: Sequence,
    *,
    batch_size: int = 16,
    method: SeqMethod = "ghost",
    params: ParamSpec = None,
    covariance="identity",
    per_param: bool = False,
    padding_side: Literal["right", "left"] = "left",
    progress: bool = False,
    spans=None,
    encoded: Sequence[Encoded] | None = None,
    _on_probs=None,
) -> SequenceScores:
    """Score N answers of a causal LM (any Hugging Face ``AutoModelForCausalLM``).

    Args:
        model: the causal LM at its trained θ*; scored in eval mode.
        tokenizer: its tokenizer (a chat template is needed for chat-message prompts).
        prompts: N strings, or N chat-message lists ``[{"role": str, "content": str}, ...]``
            rendered with the chat template and a generation prompt.
        answers: N strings (tokenized without special tokens) or N lists of token ids.
        batch_size: answers per forward/backward pass.
        method: the engine (``isouq.engines.ENGINES``): ``"ghost"`` (default: every answer of
            a batch from one backward pass), ``"per_example"`` (one backward per answer, the
            paper's way; any covariance; ``"loop"`` is its older name), ``"per_token"`` (the
            paper's per-token comparison) or ``"auto"`` (ghost for the identity covariance).
        params: which parameters take part: ``"all"`` (default: every weight as the model
            computes with it), ``"trainable"``, ``"adapter"``, ``"last-layer"``, name patterns
            or tensors (see ``isouq.params.select_params``); recorded in ``params``.
        covariance: ``"identity"``, or a covariance object (``isouq.covariance.Covariance``;
            ``method="per_example"`` only).
        per_param: also return the (N, n_tensors) breakdown of ‖g‖² by parameter tensor.
        padding_side: ``"left"`` or ``"right"``; padding never changes a score.
        progress: show a progress bar.
        spans: also score parts of each answer (``isouq.spans``): ``"sentences"``, ``"lines"``,
            one list of (start, end) character ranges per answer, or one ``AnswerSpans`` per
            answer (``isouq.spans.resolve_spans``, already resolved); the result is then a
            ``SpanSequenceScores`` whose ``spans[i]`` lists answer i's span scores.
        encoded: the pairs' token ids when already made (:func:`encode`, one :class:`Encoded`
            per answer; e.g. measured to plan batches): used as given, nothing is tokenized
            again (``Encoded.scored_from`` is honoured). ``prompts`` and ``answers`` must be the
            pairs they were made from: spans read the answers' text; without spans they are
            only counted.
        _on_probs: internal (``isouq.spans``): with the ghost and per-token engines, called as
            ``_on_probs(ghost, p, mask, rows)`` after each batch's forward, before its
            backward; it may run ghost backwards with ``retain_graph=True``.

    Returns:
        SequenceScores with, each (N,): ``epistemic`` ‖∇θ p̄‖² (probability² units),
        ``epistemic_log`` ‖∇θ log p̄‖² (= epistemic / p̄²), ``aleatoric`` (1/T) Σₜ pₜ(1 − pₜ),
        ``mean_prob`` p̄ and ``n_tokens`` T; and which parameters took part (``params``).

    Raises:
        InputError: prompts or answers of the wrong type or count, empty answers, token ids
            outside the vocabulary, an answer longer than the context window.
    """
    if spans is not None:
        from .spans import score_spans

        return score_spans(model, tokenizer, prompts, answers, spans, batch_size=batch_size,
                           method=method, params=params, covariance=covariance,
                           per_param=per_param, padding_side=padding_side, progress=progress,
                           encoded=encoded)
    method = engine_name(method, ("auto", "ghost", "per_example", "per_token"))
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    enc = (encode(tokenizer, prompts, answers) if encoded is None
           else given_encoding(encoded, prompts, answers))
    check_lengths(model, enc)
    if isinstance(covariance, str) and covariance == "identity":
        covariance = Identity()
    if not isinstance(covariance, Covariance):
        raise InputError(f"covariance={covariance!r}: use 'identity' or a covariance object "
                         "(isouq.covariance: name and quadratic(J))")
    if method == "auto":
        method = "ghost" if isinstance(covariance, Identity) else "per_example"
    if not isinstance(covariance, Identity) and method != "per_example":
        raise InputError(
            f"method={method!r} computes ‖g‖² (covariance='identity'); a covariance object "
            "needs method='per_example' (per-answer gradients are materialized)"
        )
    pad, multiple = pad_id(tokenizer), token_multiple(input_device(model))
    first = collate(enc[:1], pad, padding_side, multiple)
    sel = select_params(model, params, run_forward=lambda: token_probs(model, first))
    if method == "per_example" and any(is_quantized(q) for q in sel.values()):
        raise InputError(
            f"method={method!r} differentiates the weights themselves, and quantized (4/8-bit) "
            "weights cannot be; use method='ghost' (exact for them) or params='trainable'")
    if method == "per_example" and any(is_offloaded(q) or type(q).__name__ == "DTensor"
                                       for q in sel.values()):
        raise InputError(
            "method='per_example' differentiates the weights themselves, and this model's are "
            "offloaded (accelerate keeps them on 'meta') or sharded (FSDP2); use method='ghost' "
            "(exact for them)")
    sharded = is_sharded(model)
    if sharded and (method != "ghost" or _on_probs is not None):
        raise InputError(
            "a model sharded with FSDP2 runs collectives in every forward and backward, so every "
            "rank must run as many of them: score it with method='ghost' and without spans (one "
            "backward per batch)")
    n = len(enc)
    epi = torch.zeros(n)
    alea, mean, T = torch.zeros(n), torch.zeros(n), torch.zeros(n, dtype=torch.long)
    per = torch.zeros(n, len(sel))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"scoring ({method})", unit="answer")
    # one set of hooks for every batch (set up once: milliseconds per call on an LLM)
    hooks = GhostNorms(model, sel) if method != "per_example" else nullcontext()
    with eval_mode(model), autograd_ready(model), hooks as ghost:
        starts = range(0, n, batch_size)
        for k in range(_lockstep(len(starts)) if sharded else len(starts)):
            if k >= len(starts):  # FSDP2: another rank's batch needs this rank's collectives
                _filler_batch(model, ghost, collate(enc[:1], pad, padding_side, multiple))
                continue
            s = starts[k]
            rows = slice(s, min(s + batch_size, n))
            batch = collate(enc[rows], pad, padding_side, multiple)
            if method == "per_example":
                with torch.no_grad():
                    p, mask = token_probs(model, batch)
                with _only_selected_require_grad(model, sel):
                    e, pp = _loop_batch(model, sel, batch, covariance)
            else:
                ghost.seq_len = batch.input_ids.shape[1]
                with torch.enable_grad():
                    p, mask = token_probs(model, batch)
                    if _on_probs is not None:  # isouq.spans: backwards over the same graph
                        _on_probs(ghost, p, mask, rows)
                    if method == "ghost":  # without per_param, the shared groups' summed form
                        res = ghost.backward_detailed(summarize(p, mask)[0], per_param=per_param)
                        e, pp = res.total, res.per_param
                    else:
                        e, pp = _per_token(ghost, p, mask)
                    e = covariance.scale * e  # loop applied the covariance already
            m, a, t = summarize(p.detach(), mask)
            epi[rows] = e.detach().cpu()
            if pp is not None:
                per[rows] = pp.detach().cpu()
            mean[rows], alea[rows], T[rows] = m.cpu(), a.cpu(), t.cpu()
            if bar is not None:
                bar.update(rows.stop - rows.start)
    if bar is not None:
        bar.close()
    return SequenceScores(
        epistemic=epi,
        aleatoric=alea,
        mean_prob=mean,
        n_tokens=T,
        params=param_info(sel, model, params),
        method=method,
        covariance=getattr(covariance, "name", "custom"),
        per_param=per if per_param else None,
    )


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
    with torch.enable_grad():
        p, mask = token_probs(model, batch)
        ghost.backward_detailed(summarize(p, mask)[0], per_param=False)


def _per_token(ghost: GhostNorms, p: torch.Tensor, mask: torch.Tensor):
    """(1/T²) Σₜ ‖∇θ pₜ‖²: one batched backward per answer-token index k."""
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
