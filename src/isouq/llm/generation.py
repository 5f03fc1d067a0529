"""Batched decoding for QA: greedy answers, K sampled completions, next-token option probabilities.

An own decoding loop (KV cache, left padding, explicit position ids) instead of ``generate``:
it keeps only the chosen token's log-probabilities (never the (steps, rows, vocab) score
tensors ``generate`` returns, gigabytes for 256k vocabularies), gives every sampled row its own
random stream, and stops each row on EOS or a stop string.

Conventions (Farquhar et al. 2024, ``HuggingfaceModel.predict``):
- the answer is the text before the first stop string, stripped; its tokens are the fewest
  that spell it, so the stop string, blanks before it and EOS are not part of it; when the
  answer is empty the first generated token stands in (their "taking stop word instead"), so
  T ≥ 1 always;
- ``logprobs`` are log-probabilities under the distribution the token was drawn from
  (log_softmax of logits / T after top-k / top-p), as ``compute_transition_scores(...,
  normalize_logits=True)`` gives them; ``model_logprobs`` are under the model itself (T = 1,
  no truncation). Greedy answers have ``logprobs == model_logprobs``.
- sampling defaults are ``generate``'s (top_k = 50, top_p = 1), which both Farquhar et al. and
  LM-Polygraph sample with, at T = 1.0.

Determinism: row j of prompt p draws from a generator seeded by (seed, key_p, j), key_p = the
prompt string by default, so samples do not depend on batch size or on which other questions
share the batch (up to floating-point differences of padded batches).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

from ..errors import InputError, ModelError
from ..tokens import pad_id as tokenizer_pad_id
from .packed_logits import (
    PrefixKV,
    cache_kwarg,
    can_pack,
    last_only_kwargs,
    packed_last_logits,
    returned_cache,
    shared_prefix_len,
)
from .prompts import DEFAULT_STOP, encode_prompt


@dataclass
class Generation:
    """One decoded answer.

    text: the answer, stripped (what is judged and clustered).
    raw_text: the continuation up to the stop string with its leading blank kept and trailing
        blanks dropped (``prompt + raw_text`` spells what the model generated).
    token_ids: (T,) the answer's tokens, T ≥ 1.
    logprobs: (T,) log p of each token under the sampling distribution (greedy: the model's).
    model_logprobs: (T,) log p of each token under the model at temperature 1.
    stop_reason: "eos", "stop" (a stop string) or "length" (max_new_tokens reached).
    seconds: this row's share of its batch's wall-clock time.
    """

    text: str
    raw_text: str
    token_ids: list[int]
    logprobs: list[float]
    model_logprobs: list[float]
    stop_reason: str
    seconds: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_logprob(self) -> float:
        """Length-normalized sequence log-prob (1/T) Σ_t logprobs[t]."""
        return sum(self.logprobs) / max(len(self.logprobs), 1)

    @property
    def mean_model_logprob(self) -> float:
        """(1/T) Σ_t model_logprobs[t]."""
        return sum(self.model_logprobs) / max(len(self.model_logprobs), 1)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Sampled:
    """K sampled completions of one prompt (shared by naive/semantic entropy and P(True))."""

    prompt: str
    completions: list[Generation]
    temperature: float
    top_k: int | None
    top_p: float
    seed: int
    key: str
    extra: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return len(self.completions)

    @property
    def passes(self) -> int:
        """Generation passes spent: one per completion."""
        return len(self.completions)

    @property
    def seconds(self) -> float:
        """Wall-clock seconds spent sampling these completions."""
        return sum(c.seconds for c in self.completions)

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.completions]

    def mean_logprobs(self, which: str = "sampling") -> list[float]:
        """(K,) length-normalized log-probs; ``which``: "sampling" (Farquhar) or "model"."""
        if which == "sampling":
            return [c.mean_logprob for c in self.completions]
        if which == "model":
            return [c.mean_model_logprob for c in self.completions]
        raise InputError(f"which={which!r} is not known; use 'sampling' or 'model'")

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- helpers


def model_device(model) -> torch.device:
    """Device of the model's first parameter (where inputs go)."""
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover - parameterless model
        return torch.device("cpu")


def eos_token_ids(model, tokenizer) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models end turns with
    their own token, e.g. <|im_end|>, listed there)."""
    ids: set[int] = set()
    cands = [tokenizer.eos_token_id]
    gc = getattr(model, "generation_config", None)
    if gc is not None:
        cands.append(gc.eos_token_id)
    for c in cands:
        if c is None:
            continue
        ids.update(int(x) for x in (c if isinstance(c, (list, tuple)) else [c]))
    return ids


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """(N, L) ids, attention mask and position ids for left-padded rows."""
    if any(len(r) == 0 for r in rows):
        raise InputError("a prompt tokenized to zero tokens; give every question non-empty text")
    n, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, width - len(r) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _row_seed(seed: int, key: str, j: int) -> int:
    h = hashlib.sha256(f"{seed}|{key}|{j}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def _check_finite(logits: torch.Tensor) -> None:
    if not bool(torch.isfinite(logits).all()):
        raise ModelError(
            "the model returned NaN/inf logits while decoding; load it in float32/bfloat16 "
            "rather than float16, or check the weights"
        )


# A picker gets the active rows' float32 logits (n, V), their log_softmax, and the row indices;
# it returns the chosen ids (n,) and their log-probs under the distribution drawn from (n,).
Picker = Callable[[torch.Tensor, torch.Tensor, list[int]], tuple[torch.Tensor, torch.Tensor]]


def _greedy_pick(logits, model_logp, rows):
    nxt = logits.argmax(-1)
    return nxt, model_logp.gather(-1, nxt[:, None]).squeeze(-1)


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Top-k then nucleus (top-p) filtering of (n, V) logits; removed entries become -inf."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_l, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = before > top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _sampling_picker(
    gens: list[torch.Generator], temperature: float, top_k: int | None, top_p: float
) -> Picker:
    def pick(logits, model_logp, rows):
        logp = torch.log_softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
        probs = logp.exp()
        nxt = torch.cat(
            [torch.multinomial(probs[j], 1, generator=gens[r]) for j, r in enumerate(rows)]
        )
        return nxt, logp.gather(-1, nxt[:, None]).squeeze(-1)

    return pick


@torch.inference_mode()
def _decode(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    pick: Picker,
    *,
    max_new_tokens: int,
    stop: Sequence[str],
    eos_ids: set[int],
    share_prefill: bool = True,
) -> list[tuple[list[int], list[float], list[float], str]]:
    """Decode each row until EOS, a stop string or max_new_tokens.

    Rows with the same prompt (the K samples of one question) share one prefill: the distinct
    prompts run once and their key/value cache is copied to every row (K times less prompt
    compute; rows still draw their own tokens). A cache that cannot select rows (a legacy
    tuple cache), or ``share_prefill=False``, gets one prefill per row.

    Returns per row (generated ids incl. a final EOS, sampling log-probs, model log-probs,
    stop reason).
    """
    n = len(prompt_ids)
    device = model_device(model)
    pad = tokenizer_pad_id(tokenizer)
    if share_prefill:
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
        firsts = [list(p) for p in distinct]
    else:
        row_of, firsts = list(range(n)), list(prompt_ids)
    ids, mask, pos = _left_pad(firsts, pad, device)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                **last_only_kwargs(model))
    cache, last = returned_cache(out), out.logits[:, -1, :]
    if len(firsts) < n:
        if hasattr(cache, "batch_select_indices"):
            sel = torch.as_tensor(row_of, device=device)
            cache.batch_select_indices(sel)
            last, mask, pos = last[sel], mask[sel], pos[sel]
        else:
            ids, mask, pos = _left_pad(prompt_ids, pad, device)
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                        **last_only_kwargs(model))
            cache, last = returned_cache(out), out.logits[:, -1, :]
    cache_name = cache_kwarg(model)
    gen: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    mlps: list[list[float]] = [[] for _ in range(n)]
    reason: list[str | None] = [None] * n
    for step in range(max_new_tokens):
        active = [i for i in range(n) if reason[i] is None]
        logits = last.float()[torch.as_tensor(active, device=device)]
        _check_finite(logits)
        model_logp = torch.log_softmax(logits, dim=-1)
        nxt, lp = pick(logits, model_logp, active)
        mlp = model_logp.gather(-1, nxt[:, None]).squeeze(-1)
        for i, t, a, b in zip(active, nxt.tolist(), lp.tolist(), mlp.tolist(), strict=True):
            gen[i].append(t)
            lps[i].append(a)
            mlps[i].append(b)
            if t in eos_ids:
                reason[i] = "eos"
        check = [i for i in active if reason[i] is None]
        if stop and check:
            texts = tokenizer.batch_decode([gen[i] for i in check], skip_special_tokens=True)
            for i, text in zip(check, texts, strict=True):
                if any(s in text for s in stop):
                    reason[i] = "stop"
        if all(r is not None for r in reason) or step == max_new_tokens - 1:
            break
        feed = torch.full((n, 1), pad, dtype=torch.long, device=device)
        feed[torch.as_tensor(active, device=device), 0] = nxt
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=feed, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{cache_name: cache})
        cache, last = returned_cache(out), out.logits[:, -1, :]
    return [(g, a, b, r or "length") for g, a, b, r in zip(gen, lps, mlps, reason, strict=True)]


def _finalize(tokenizer, prompt_ids, gen, lps, mlps, reason, stop) -> Generation:
    """Cut at the first stop string; keep the tokens that spell the answer (≥ 1)."""
    content = gen[:-1] if reason == "eos" else gen
    base = tokenizer.decode(prompt_ids, skip_special_tokens=True)

    def cont(m: int) -> str:  # text of content[:m], decoded in the prompt's context
        full = tokenizer.decode(list(prompt_ids) + content[:m], skip_special_tokens=True)
        if full.startswith(base):
            return full[len(base) :]
        return tokenizer.decode(content[:m], skip_special_tokens=True)

    text = cont(len(content))
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    raw = text[:cut].rstrip()  # trailing blanks belong to the stop (" Question:"), not the answer
    m = len(content)
    while m > 0 and len(cont(m - 1)) >= len(raw):
        m -= 1
    m = max(m, 1)  # empty answer: the stop/EOS token stands in, as in Farquhar et al.
    return Generation(
        text=raw.strip(),
        raw_text=raw,
        token_ids=gen[:m],
        logprobs=lps[:m],
        model_logprobs=mlps[:m],
        stop_reason=reason,
    )


def _check_common(prompts: Sequence[str], max_new_tokens: int, batch_size: int) -> None:
    if isinstance(prompts, str):
        raise InputError("prompts must be a list of strings, not one string; wrap it: [prompt]")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens={max_new_tokens} must be ≥ 1")
    if batch_size < 1:
        raise InputError(f"batch_size={batch_size} must be ≥ 1")


# ----------------------------------------------------------------------------- public API


def generate_greedy(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 50,
    stop: Sequence[str] = DEFAULT_STOP,
    batch_size: int = 16,
) -> list[Generation]:
    """Greedy (argmax) answer per prompt, batched with left padding.

    prompts: N prompt strings (see ``prompts.qa_prompt``). Returns N Generations; their
    ``seconds`` are each row's share of its batch's wall-clock time.
    """
    _check_common(prompts, max_new_tokens, batch_size)
    eos = eos_token_ids(model, tokenizer)
    out: list[Generation] = []
    for s in range(0, len(prompts), batch_size):
        chunk = [encode_prompt(tokenizer, p) for p in prompts[s : s + batch_size]]
        t0 = time.perf_counter()
        rows = _decode(model, tokenizer, chunk, _greedy_pick, max_new_tokens=max_new_tokens,
                       stop=stop, eos_ids=eos)
        gens = [_finalize(tokenizer, pid, *r, stop) for pid, r in zip(chunk, rows, strict=True)]
        dt = (time.perf_counter() - t0) / len(chunk)
        for g in gens:
            g.seconds = dt
        out += gens
    return out


def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    k: int = 10,
    temperature: float = 1.0,
    top_k: int | None = 50,
    top_p: float = 1.0,
    max_new_tokens: int = 50,
    stop: Sequence[str] = DEFAULT_STOP,
    seed: int = 0,
    keys: Sequence[str] | None = None,
    batch_size: int = 32,
    share_prefill: bool = True,
) -> list[Sampled]:
    """K sampled completions per prompt at ``temperature``, with per-token log-probs.

    prompts: N prompt strings; keys: N stable ids seeding each prompt's rows (default: the
    prompt text). ``batch_size`` counts rows (prompt × sample) decoded together. Returns N
    ``Sampled``, each with K Generations. Defaults: Farquhar et al. (K = 10, T = 1.0, 50 new
    tokens) with ``generate``'s top_k = 50, top_p = 1. ``share_prefill``: the samples of one
    prompt share its prefill (False: one prefill per row; the same samples, for comparison).
    """
    _check_common(prompts, max_new_tokens, batch_size)
    if k < 1:
        raise InputError(f"k={k} must be ≥ 1")
    if not temperature > 0:
        raise InputError(f"temperature={temperature} must be > 0; use generate_greedy for T = 0")
    if not 0 < top_p <= 1:
        raise InputError(f"top_p={top_p} must be in (0, 1]")
    keys = list(prompts) if keys is None else [str(x) for x in keys]
    if len(keys) != len(prompts):
        raise InputError(f"got {len(keys)} keys for {len(prompts)} prompts; give one key each")
    eos = eos_token_ids(model, tokenizer)
    device = model_device(model)
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    rows = [(i, j) for i in range(len(prompts)) for j in range(k)]
    done: dict[tuple[int, int], Generation] = {}
    for s in range(0, len(rows), batch_size):
        chunk = rows[s : s + batch_size]
        gens = [torch.Generator(device=device).manual_seed(_row_seed(seed, keys[i], j))
                for i, j in chunk]
        pick = _sampling_picker(gens, temperature, top_k, top_p)
        pids = [encoded[i] for i, _ in chunk]
        t0 = time.perf_counter()
        dec = _decode(model, tokenizer, pids, pick, max_new_tokens=max_new_tokens, stop=stop,
                      eos_ids=eos, share_prefill=share_prefill)
        res = [_finalize(tokenizer, pid, *r, stop) for pid, r in zip(pids, dec, strict=True)]
        dt = (time.perf_counter() - t0) / len(chunk)
        for rc, g in zip(chunk, res, strict=True):
            g.seconds = dt
            done[rc] = g
    return [
        Sampled(prompt=p, completions=[done[(i, j)] for j in range(k)], temperature=temperature,
                top_k=top_k, top_p=top_p, seed=seed, key=keys[i])
        for i, p in enumerate(prompts)
    ]


def option_token_ids(tokenizer, prompt: str, variants: Sequence[str]) -> list[int]:
    """Distinct token ids that spell a variant (e.g. " A", "A") in one token right after ``prompt``.

    Each variant is tokenized as ``prompt + variant`` (so merges across the boundary are as the
    model would see them; if that does not extend the prompt's own tokens, the variant alone).
    Variants that need several tokens are skipped, since a generic first piece ("n") is no
    evidence for the word ("no"); when no variant is a single token, the first token of the
    first variant is used.
    """
    base = encode_prompt(tokenizer, prompt)
    ids: list[int] = []
    first: int | None = None
    for v in variants:
        full = encode_prompt(tokenizer, prompt + v)
        if len(full) > len(base) and full[: len(base)] == base:
            cont = full[len(base) :]
        else:
            cont = list(tokenizer(v, add_special_tokens=False)["input_ids"])
        if not cont:
            continue
        if first is None:
            first = int(cont[0])
        if len(cont) == 1 and int(cont[0]) not in ids:
            ids.append(int(cont[0]))
    return ids if ids or first is None else [first]


MIN_SHARED_PREFIX = 16
"""Shortest common prompt prefix (tokens) worth one extra forward pass to encode once."""


@torch.inference_mode()
def _last_logits(model, rows: Sequence[Sequence[int]], pad_id: int, device, *,
                 share_prefix: bool = True) -> torch.Tensor:
    """(N, V) next-token logits after each row of token ids.

    When the rows share a prefix of ≥ ``MIN_SHARED_PREFIX`` tokens and the model keeps a
    transformers ``Cache``, the prefix is encoded once and its keys/values are repeated for the
    rows' own suffixes (left-padded after the prefix, positions continuing from it): the same
    logits as encoding every row whole, up to float rounding, for a fraction of the work when
    the prefix is long (judge and entailment prompts of one question).
    """
    from transformers import Cache, PreTrainedModel

    p = shared_prefix_len(rows) if share_prefix and len(rows) > 1 else 0
    if p >= MIN_SHARED_PREFIX and isinstance(model, PreTrainedModel):
        head = torch.as_tensor([list(rows[0][:p])], dtype=torch.long, device=device)
        cache = returned_cache(model(input_ids=head, attention_mask=torch.ones_like(head),
                                     use_cache=True, **last_only_kwargs(model)))  # keys/values
        if isinstance(cache, Cache) and hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(len(rows))
            ids, mask, pos = _left_pad([r[p:] for r in rows], pad_id, device)
            full_mask = torch.cat([torch.ones((len(rows), p), dtype=mask.dtype,
                                              device=device), mask], dim=1)
            return model(input_ids=ids, attention_mask=full_mask, position_ids=pos + p,
                         use_cache=True, **{cache_kwarg(model): cache},
                         **last_only_kwargs(model)).logits[:, -1, :].float()
    ids, mask, pos = _left_pad(rows, pad_id, device)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos,
                 **last_only_kwargs(model)).logits[:, -1, :].float()


def _logit_passes(model, encoded, order, pad_id: int, device, *, batch_size: int,
                  share_prefix: bool, pack: bool, prefix: PrefixKV | None):
    """(prompt indices, (m, V) next-token logits) per forward pass, prompts taken in ``order``."""
    rows = [encoded[i] for i in order]
    if share_prefix and pack and can_pack(model, rows, device):
        at = 0
        for logits in packed_last_logits(model, rows, device, batch_size=batch_size,
                                         prefix=prefix):
            yield order[at : at + len(logits)], logits
            at += len(logits)
        return
    n_batches = -(-len(order) // batch_size)
    size = max(-(-len(order) // max(n_batches, 1)), 1)  # balanced: 9 at batch_size 8 -> 5 + 4
    for s in range(0, len(order), size):
        chunk = order[s : s + size]
        yield chunk, _last_logits(model, [encoded[i] for i in chunk], pad_id, device,
                                  share_prefix=share_prefix)


@torch.inference_mode()
def option_probs(
    model,
    tokenizer,
    prompts: Sequence[str],
    options: Mapping[str, Sequence[str]],
    *,
    batch_size: int = 8,
    share_prefix: bool = True,
    pack: bool = True,
    prefix: PrefixKV | None = None,
) -> torch.Tensor:
    """Next-token probability mass of each option after each prompt, ≤ batch_size per pass.

    options: name -> surface variants, e.g. {"yes": [" yes", "yes", " Yes", "Yes"], ...}; an
    option's mass is the sum of p(token) over the distinct single tokens spelling its variants
    (see ``option_token_ids``).
    Prompts go in sorted token order, so prompts that share a beginning (one question's judge
    or entailment prompts) share a pass and that beginning is encoded once: with ``pack``
    (models where ``packed_logits.can_pack``) the prompts' own tokens are packed without
    padding after the call's common beginning, which ``prefix`` keeps between calls
    (``packed_logits``); otherwise batches are left-padded, each encoding its common beginning
    once (``_last_logits``). ``share_prefix=False`` encodes every prompt whole, padded.
    Returns (N, n_options) float64 on CPU, in ``options`` order (not renormalized). Raises
    ModelError when two options start with the same token (their masses would be confounded).
    """
    _check_common(prompts, 1, batch_size)
    names = list(options)
    tok_ids = []
    for prompt in prompts:
        per = [option_token_ids(tokenizer, prompt, options[nm]) for nm in names]
        flat = [t for ids in per for t in ids]
        if len(flat) != len(set(flat)) or any(not ids for ids in per):
            raise ModelError(
                f"options {names} do not start with distinct tokens for this tokenizer "
                f"(ids {per}); give variants whose first tokens differ"
            )
        tok_ids.append(per)
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: encoded[i])
    out = torch.zeros((len(prompts), len(names)), dtype=torch.float64)
    for chunk, logits in _logit_passes(model, encoded, order, tokenizer_pad_id(tokenizer),
                                       model_device(model), batch_size=batch_size,
                                       share_prefix=share_prefix, pack=pack, prefix=prefix):
        _check_finite(logits)
        probs = torch.softmax(logits, dim=-1).double().cpu()
        for r, i in enumerate(chunk):
            for c, ids_c in enumerate(tok_ids[i]):
                out[i, c] = probs[r, ids_c].sum()
    return out
