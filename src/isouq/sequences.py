"""Uncertainty of generated answers: p̄, aleatoric and ‖∇θ p̄‖² for causal language models.

For an answer y = (y₁..y_T) to a prompt x: pₜ = p(yₜ | y<ₜ, x, θ*), p̄ = (1/T) Σₜ pₜ,
aleatoric = (1/T) Σₜ pₜ(1 − pₜ), epistemic = ‖∇θ p̄‖² (paper §3.4). Methods:
- ``"ghost"``: every answer of a batch from ONE backward pass of Σᵢ p̄ᵢ (exact; ghost norms);
- ``"per_example"`` (older name ``"loop"``): one backward pass per answer (the paper's way;
  the reference), which also accepts a non-identity covariance object (per-example gradients
  are materialized);
- ``"per_token"``: the paper's comparison (1/T²) Σₜ ‖∇θ pₜ‖², one batched backward per token
  position.

:func:`score_sequences` checks its arguments, prepares the pairs (``isouq.prepare``: tokenized
once, checked against the model, spans resolved) and runs the batch loop (``isouq.passes``;
span scores: ``isouq.spans``). The tokenizer helpers (``encode``, ``Encoded``, ``pad_id``) and
the batch pieces (``collate``, ``token_probs``, ``summarize``) are named here too, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import nn

from .blocks import block_map
from .covariance import Covariance, Identity
from .engines import engine_name
from .errors import CaptureRefused, InputError
from .ghost.weights import is_sharded, placement
from .hidden import StatesOfForward, mean_hidden_states
from .params import ParamSpec, param_info, select_params
from .passes import Batch, collate, input_device, score_encoded, summarize, token_probs
from .prepare import Limits, check_fit, context_window, encode_checked, resolve_one
from .quantized import is_quantized
from .scores import SequenceScores
from .spans import score_spans
from .tokens import Encoded, Prompt, check_counts, encode, given_encoding, pad_id

SeqMethod = Literal["auto", "ghost", "per_example", "per_token", "forward", "loop"]


def check_lengths(model: nn.Module, enc: list[Encoded]) -> None:
    """InputError naming the answer whose tokens do not fit the model (ids outside the
    vocabulary, longer than the context window): ``prepare.check_fit`` of each pair."""
    limits = Limits.of_model(model)
    for i, e in enumerate(enc):
        check_fit(e, limits, f"answer {i}")


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
    blocks: bool = False,
    hidden: bool = False,
    padding_side: Literal["right", "left"] = "left",
    progress: bool = False,
    spans=None,
    span_strategy: str | None = None,
    encoded: Sequence[Encoded] | None = None,
    compile: bool = False,
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
            paper's per-token comparison), ``"forward"`` (the forward pass only: p̄, the
            sequence log-probability, the aleatoric score and the hidden states, the gradient
            scores NaN; what a calibration that reads no gradient needs) or ``"auto"`` (ghost
            for the identity covariance).
        params: which parameters take part: ``"all"`` (default: every weight as the model
            computes with it), ``"trainable"``, ``"adapter"``, ``"last-layer"``, name patterns
            or tensors (see ``isouq.params.select_params``); recorded in ``params``.
        covariance: ``"identity"``, or a covariance object (``isouq.covariance.Covariance``;
            ``method="per_example"`` only).
        per_param: also return the (N, n_tensors) breakdown of ‖g‖² by parameter tensor.
        blocks: also return the (N, B) breakdown of ‖g‖² by block of the model
            (``SequenceScores.blocks``, ``block_names``: module paths such as
            ``model.embed_tokens``, ``model.layers.3``, ``lm_head``; ``isouq.blocks``), from
            the same backward; each row sums to ``epistemic`` (with spans: the whole answers'
            profile). The identity covariance only.
        hidden: also return each answer's mean hidden state at the probe's depths
            (``SequenceScores.hidden``, ``isouq.hidden``: what ``isouq calibrate --features ...
            hidden`` reads), from the scores' own forward (with spans: one more forward
            without gradients per batch).
        padding_side: ``"left"`` or ``"right"``; padding never changes a score.
        progress: show a progress bar.
        spans: also score parts of each answer (``isouq.spans``): ``"sentences"``, ``"lines"``,
            one list of (start, end) character ranges per answer, or one ``AnswerSpans`` per
            answer (``isouq.spans.resolve_spans``, already resolved); the result is then a
            ``SpanSequenceScores`` whose ``spans[i]`` lists answer i's span scores.
        span_strategy: how span scores are computed (``isouq.spans.STRATEGIES``): ``"retain"``
            (the default with ghost: one forward, a ghost backward per span index over its
            retained graph) or ``"rows"`` (the default otherwise: rows truncated at each
            span's end).
        encoded: the pairs' token ids when already made (:func:`encode`, one :class:`Encoded`
            per answer; e.g. measured to plan batches): used as given, nothing is tokenized
            again (``Encoded.scored_from`` is honoured). ``prompts`` and ``answers`` must be the
            pairs they were made from: spans read the answers' text; without spans they are
            only counted.
        compile: capture each batch's ghost backward as one graph (compiled autograd), with
            shapes set by the batch's (rows, length) alone; offered only where the checks of
            ``isouq.capture`` pass on the caller's first batch (the same operations and shapes
            for every batch of a bucket, no value read back, no graph break, the eager
            scores), else refused. Ghost, without spans, on an unsharded model.

    Returns:
        SequenceScores with, each (N,): ``epistemic`` ‖∇θ p̄‖² (probability² units),
        ``epistemic_log`` ‖∇θ log p̄‖² (= epistemic / p̄²), ``aleatoric`` (1/T) Σₜ pₜ(1 − pₜ),
        ``mean_prob`` p̄, ``seq_logprob`` Σₜ log pₜ and ``n_tokens`` T; and which parameters
        took part (``params``).

    Raises:
        InputError: prompts or answers of the wrong type or count, empty answers, token ids
            outside the vocabulary, an answer longer than the context window (a
            ``prepare.RowProblem`` with its reason code), a combination the engine cannot run.
        ModelError: ``blocks=True`` for a model whose blocks cannot be named.
        CaptureRefused: ``compile=True`` where graph capture is not offered: the message names
            the check that failed and what it found.
    """
    method = engine_name(method, ("auto", "ghost", "per_example", "per_token", "forward"))
    if method == "forward" and (blocks or per_param or spans is not None or compile):
        raise InputError("method='forward' computes no gradient, so no block profile, "
                         "per-parameter norms, span scores or captured backward: drop them or "
                         "use method='ghost'")
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
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
    if blocks and not isinstance(covariance, Identity):
        raise InputError("blocks=True splits ‖g‖² by block, which needs the identity "
                         "covariance; drop blocks or the covariance object")
    enc = prepared_pairs(model, tokenizer, prompts, answers, encoded, offsets=spans is not None)
    pad = pad_id(tokenizer)
    sel = select_params(model, params, run_forward=lambda: token_probs(
        model, collate(enc[:1], pad, padding_side)))
    check_engine(method, sel)
    sharded = is_sharded(model)
    if sharded and (method != "ghost" or spans is not None):
        raise InputError(
            "a model sharded with FSDP2 runs collectives in every forward and backward, so every "
            "rank must run as many of them: score it with method='ghost' and without spans (one "
            "backward per batch)")
    info = param_info(sel, model, params)
    options = dict(pad=pad, method=method, covariance=covariance, batch_size=batch_size,
                   per_param=per_param, padding_side=padding_side, progress=progress,
                   blocks=block_map(model, tuple(sel)) if blocks else None)
    if compile:
        if method != "ghost" or spans is not None or sharded:
            raise CaptureRefused("compile=True captures the ghost backward of whole answers on "
                                 "one process: use method='ghost' without spans on an unsharded "
                                 "model, or score without compile=True")
        from .capture import require_capture

        require_capture(model, enc, sel, info, options)
        states = StatesOfForward(len(enc)) if hidden else None
        res = score_encoded(model, enc, sel, info, on_states=states, capture=True, **options)
        if states is not None:
            res.hidden = states.result()
        return res
    if spans is not None:
        resolved = spans_of(tokenizer, answers, spans, enc)
        res = score_spans(model, enc, resolved, sel, info, strategy=span_strategy, **options)
        if hidden:  # the span paths' forwards are of truncated rows: a forward of its own
            res.hidden = mean_hidden_states(model, enc, pad=pad, batch_size=batch_size)
    else:
        states = StatesOfForward(len(enc)) if hidden else None
        res = score_encoded(model, enc, sel, info, lockstep=sharded, on_states=states, **options)
        if states is not None:
            res.hidden = states.result()
    return res


def prepared_pairs(model: nn.Module, tokenizer, prompts: Sequence, answers: Sequence,
                   encoded: Sequence[Encoded] | None, *, offsets: bool = False
                   ) -> list[Encoded]:
    """The pairs' token ids, made once (``prepare.encode_checked``) or as given, each checked
    against the model (``prepare.check_fit``): a ``RowProblem`` names the answer and the fix."""
    if encoded is None:
        check_counts(prompts, answers)
        enc = [encode_checked(tokenizer, p, a, f"answer {i}", offsets=offsets)
               for i, (p, a) in enumerate(zip(prompts, answers, strict=True))]
    else:
        enc = given_encoding(encoded, prompts, answers)
    check_lengths(model, enc)
    return enc


def spans_of(tokenizer, answers: Sequence, spans, enc: list[Encoded]) -> list:
    """Each answer's spans resolved on its tokens (``prepare.resolve_one``), or a RowProblem
    naming the answer."""
    if isinstance(spans, str) or not isinstance(spans, Sequence):
        given = [spans] * len(answers)
    elif len(spans) == len(answers):
        given = list(spans)
    else:
        raise InputError(f"spans must be 'sentences', 'lines' or one list of (start, end) ranges "
                         f"per answer; got {len(spans)} for {len(answers)} answers")
    return [resolve_one(tokenizer, a, s, e, key=i)
            for i, (a, s, e) in enumerate(zip(answers, given, enc, strict=True))]


def check_engine(method: str, sel: dict) -> None:
    """InputError when the per_example engine cannot differentiate the selected weights
    (quantized, offloaded to ``meta``, or sharded)."""
    if method != "per_example":
        return
    if any(is_quantized(q) for q in sel.values()):
        raise InputError(
            f"method={method!r} differentiates the weights themselves, and quantized (4/8-bit) "
            "weights cannot be; use method='ghost' (exact for them) or params='trainable'")
    if any(placement(q) != "local" for q in sel.values()):
        raise InputError(
            "method='per_example' differentiates the weights themselves, and this model's are "
            "offloaded (accelerate keeps them on 'meta') or sharded (FSDP2); use method='ghost' "
            "(exact for them)")


__all__ = ["Batch", "Encoded", "SeqMethod", "check_lengths", "collate", "context_window",
           "encode", "given_encoding", "input_device", "pad_id", "score_sequences",
           "summarize", "token_probs"]
