"""Next-token logits of many prompts that share beginnings: no padding, beginnings encoded once.

The judge and entailment prompts of one question share a long beginning (instructions, the
question, for entailment often answer 1), then differ in a few dozen tokens. Batched the usual
way, every prompt is left-padded to the longest and the beginning is encoded per batch; on a CPU
those padded and repeated tokens are 15-30% of the judge's work (measured on the kept QA runs'
entailment prompts, ``benchmarks/semantic_entropy_cost.py``). Here instead:

1. the common beginning (prefix, p tokens) of a call's prompts is encoded once; a
   ``PrefixKV`` keeps its keys/values between calls, so the next call (the next clustering
   round of the same question) encodes only the tokens where its prefix differs;
2. the prompts' own tokens (suffixes) are packed end to end into one row of at most
   ``batch_size`` prompts, with positions continuing from p and a 4-D mask that lets each
   suffix token see the prefix and the earlier tokens of its own suffix only.

The logits equal those of encoding each prompt alone, up to float rounding (tests compare
them). It needs a transformers ``PreTrainedModel`` with full causal attention in every layer
(no sliding window), rotary or learned positions read from ``position_ids``, eager or SDPA
attention: ``supports_packing`` checks this, and callers (``generation.option_probs``) fall
back to padded batches otherwise.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import InputError

PACKABLE_ATTENTION = ("sdpa", "eager")
"""Attention implementations that read a custom 4-D additive mask."""


def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get(decoder=True) if callable(get) else cfg


def supports_packing(model) -> bool:
    """Whether ``packed_last_logits`` gives a model's true logits (structure only: a
    ``PreTrainedModel`` decoder, eager/SDPA attention, no sliding-window layer, and a forward
    taking ``position_ids``, a key/value cache and a mask)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return False
    cfg = _text_config(model)
    if getattr(cfg, "is_encoder_decoder", False):
        return False
    if getattr(cfg, "_attn_implementation", None) not in PACKABLE_ATTENTION:
        return False
    if getattr(cfg, "sliding_window", None) or getattr(cfg, "attention_chunk_size", None):
        return False
    types = getattr(cfg, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return False
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return ("position_ids" in params and "attention_mask" in params
            and ("cache" in params or "past_key_values" in params))


def takes_logits_to_keep(model) -> bool:
    """Whether the model's forward (or, under a PEFT wrapper, its base model's) names
    ``logits_to_keep`` (Hugging Face causal LMs): then its head can skip the positions whose
    logits nobody reads (the head over the whole vocabulary is a large share of a small LM's
    forward)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def cache_kwarg(model) -> str:
    """The forward's name for a key/value cache argument: ``cache`` (transformers >= 5.24)
    or ``past_key_values`` (earlier versions, and most custom models)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out):
    """The key/value cache a forward returned: ``out.cache`` (transformers >= 5.24), else
    ``out.past_key_values``."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def shared_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    """Tokens all rows start with, leaving every row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for i in range(max(n, 0)):
        if any(r[i] != first[i] for r in rows):
            return i
    return max(n, 0)


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _as_pairs(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(key, value) per layer of a transformers cache, (batch, heads, tokens, head_dim) each."""
    return [(entry[0], entry[1]) for entry in cache]


def _cache_of(pairs: list[tuple[torch.Tensor, torch.Tensor]]):
    """A fresh ``DynamicCache`` holding copies of ``pairs`` (the caller's stay untouched)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(ddp_cache_data=pairs)  # transformers >= 5
    except TypeError:  # pragma: no cover  (transformers 4.x)
        return DynamicCache.from_legacy_cache(tuple(pairs))


@dataclass
class PrefixKV:
    """Keys/values of an encoded token prefix, kept between calls for one model.

    ids: the prefix's tokens; pairs: (key, value) per layer. ``encoded_tokens`` counts the
    tokens this object ran through the model (prefix tokens reused are not counted).
    """

    ids: list[int] = field(default_factory=list)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    encoded_tokens: int = 0

    def extend_to(self, model, prefix: Sequence[int], device) -> None:
        """Hold ``prefix``: keep the tokens it shares with the held one, encode the rest."""
        prefix = list(prefix)
        c = _common_len(self.ids, prefix) if self.pairs else 0
        kept = [(k[..., :c, :], v[..., :c, :]) for k, v in self.pairs] if c else []
        if c < len(prefix):
            new = torch.as_tensor([prefix[c:]], dtype=torch.long, device=device)
            pos = torch.arange(c, len(prefix), device=device).unsqueeze(0)
            mask = torch.ones((1, len(prefix)), dtype=torch.long, device=device)
            out = model(input_ids=new, position_ids=pos, attention_mask=mask, use_cache=True,
                        **{cache_kwarg(model): _cache_of(kept) if kept else None},
                        **last_only_kwargs(model))
            kept = _as_pairs(returned_cache(out))
            self.encoded_tokens += len(prefix) - c
        self.ids, self.pairs = prefix, kept


def last_only_kwargs(model) -> dict:
    """``logits_to_keep=1`` when the model supports it (no (N, L, V) logits for a prompt)."""
    return {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}


def _packed_mask(lengths: Sequence[int], p: int, dtype, device) -> torch.Tensor:
    """(1, 1, T, p + T) additive mask: each suffix token sees the prefix and its own suffix's
    tokens up to itself; 0 where seen, the dtype's minimum elsewhere."""
    t = sum(lengths)
    seen = torch.zeros((t, p + t), dtype=torch.bool, device=device)
    seen[:, :p] = True
    at = 0
    for n in lengths:
        seen[at : at + n, p + at : p + at + n] = torch.ones((n, n), dtype=torch.bool,
                                                            device=device).tril()
        at += n
    mask = torch.zeros((t, p + t), dtype=dtype, device=device)
    mask.masked_fill_(~seen, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def packed_last_logits(model, rows: Sequence[Sequence[int]], device, *, batch_size: int = 8,
                       prefix: PrefixKV | None = None) -> Iterator[torch.Tensor]:
    """Next-token logits after each row of token ids, rows packed without padding.

    rows: N token-id lists, in the order to pack them (sorted rows pack common beginnings
    together); batch_size: rows per forward pass; prefix: a ``PrefixKV`` reused across calls
    (default: a new one). Yields one (m, V) float tensor per forward pass, rows in order.
    Only for models where ``supports_packing`` holds.
    """
    if not rows or any(len(r) == 0 for r in rows):
        raise InputError("a prompt tokenized to zero tokens; give every question non-empty text")
    held = prefix if prefix is not None else PrefixKV()
    p = shared_prefix_len(rows) if len(rows) > 1 else len(rows[0]) - 1
    if p > 0:
        held.extend_to(model, rows[0][:p], device)
    dtype = model.dtype
    keep_param = takes_logits_to_keep(model)
    cache_name = cache_kwarg(model)
    n_passes = -(-len(rows) // batch_size)
    size = max(-(-len(rows) // n_passes), 1)  # balanced: 9 rows at batch_size 8 -> 5 + 4
    for s in range(0, len(rows), size):
        suffixes = [list(r[p:]) for r in rows[s : s + size]]
        lengths = [len(x) for x in suffixes]
        ids = torch.as_tensor([[t for x in suffixes for t in x]], dtype=torch.long,
                              device=device)
        pos = torch.cat([torch.arange(p, p + n) for n in lengths]).unsqueeze(0).to(device)
        last = torch.as_tensor(lengths, device=device).cumsum(0) - 1
        kw = {"logits_to_keep": last} if keep_param else {}
        logits = model(input_ids=ids, position_ids=pos,
                       attention_mask=_packed_mask(lengths, p, dtype, device),
                       **{cache_name: _cache_of(held.pairs) if p > 0 else None},
                       use_cache=p > 0, **kw).logits[0]
        yield (logits if keep_param else logits[last]).float()


_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    """Same logits up to the rounding of ``dtype`` (relative to the largest logit)."""
    rtol = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    return bool((a - b).abs().max() <= rtol * max(1.0, float(b.abs().max())))


@torch.inference_mode()
def can_pack(model, rows: Sequence[Sequence[int]], device) -> bool:
    """``supports_packing``, confirmed once per model on two of ``rows``: packed logits must
    match each row encoded alone (otherwise a warning, and this model is never packed)."""
    if not supports_packing(model):
        return False
    if model in _VERIFIED:
        return _VERIFIED[model]
    if len(rows) < 2:
        return True  # nothing packed yet: confirm on a later call with two rows
    pair = [list(rows[0]), list(rows[-1])]
    (packed,) = packed_last_logits(model, pair, device, batch_size=2)
    alone = torch.cat([model(input_ids=torch.as_tensor([r], device=device),
                             **last_only_kwargs(model)).logits[:, -1].float() for r in pair])
    ok = _close(packed, alone, model.dtype)
    if not ok:
        warnings.warn(f"{type(model).__name__}: packed prompts do not give the logits of each "
                      "prompt alone; encoding prompts in padded batches instead", stacklevel=2)
    _VERIFIED[model] = ok
    return ok
