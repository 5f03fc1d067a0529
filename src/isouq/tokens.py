"""Text ↔ token ids for scoring: a prompt (a string or chat messages) and an answer (a string or
token ids) tokenized once, into :class:`Encoded`.

The rules, in one place:

- a string prompt is tokenized with the tokenizer's special tokens, unless it already begins with
  the BOS token (a chat template often writes it into the text): BOS exactly once;
- chat messages are rendered with the tokenizer's chat template and a generation prompt, then
  tokenized without special tokens (the template wrote them); a template that refuses the
  messages is an :class:`~isouq.errors.InputError`, never a jinja traceback;
- an answer string is tokenized without special tokens; token ids are taken as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import torch

from .errors import InputError

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

    @property
    def length(self) -> int:
        """Prompt + answer tokens."""
        return len(self.prompt) + len(self.answer)


def is_messages(prompt) -> bool:
    """Whether ``prompt`` is chat messages: a non-empty list of ``{"role": str, "content": str}``."""
    return (isinstance(prompt, list | tuple) and len(prompt) > 0 and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt))


def adds_bos(tokenizer, text: str) -> bool:
    """Whether to let the tokenizer add its special tokens to ``text``: not when ``text`` begins
    with the BOS string already (a chat template wrote it), so BOS is there exactly once."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (bos and text.startswith(bos))


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt's text as the model sees it (BOS exactly once: :func:`adds_bos`)."""
    return list(tokenizer(text, add_special_tokens=adds_bos(tokenizer, text))["input_ids"])


def _at(where: str, text: str) -> str:
    """``text`` about the pair named ``where`` (``"answer 3: …"``; no name: ``text``)."""
    return f"{where}: {text}" if where else text


def render_chat(tokenizer, messages: Sequence[dict], where: str = "") -> str:
    """Chat messages rendered by the tokenizer's chat template with a generation prompt.

    Raises:
        InputError: the tokenizer has no chat template, or its template refuses the messages
            (any exception of the model's own jinja template: wrong roles, order, content).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(_at(where, "the prompt was given as chat messages but the model's "
                                    "tokenizer has no chat template; pass the prompt as a "
                                    "plain string instead"))
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - jinja2 errors of the model's own template
        first = str(e).splitlines()[0][:120] if str(e) else ""
        raise InputError(_at(where, f"the model's chat template cannot render these messages "
                                    f"({type(e).__name__}: {first}); check their roles and "
                                    "order")) from None


def prompt_ids(tokenizer, prompt: Prompt, where: str = "") -> list[int]:
    """Token ids of a prompt: a string (:func:`text_ids`) or chat messages (:func:`render_chat`,
    tokenized without special tokens).

    Raises:
        InputError: naming ``where``, for anything else or messages the template refuses.
    """
    if isinstance(prompt, str):
        return text_ids(tokenizer, prompt)
    if not is_messages(prompt):
        raise InputError(_at(where, f"the prompt must be a string or a non-empty list of "
                                    f"{{'role': str, 'content': str}} messages, got "
                                    f"{type(prompt).__name__} {str(prompt)[:40]}"))
    text = render_chat(tokenizer, prompt, where)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_tokens(tokenizer, answer, where: str = "", offsets: bool = False
                  ) -> tuple[list[int], list[tuple[int, int]] | None]:
    """(token ids, their character offsets or None) of an answer: one tokenizer call for a
    string answer (no special tokens); the offsets when asked for and the tokenizer is a fast
    one; token ids (a list or a 1-D integer tensor) as they are.

    Raises:
        InputError: naming ``where``, for anything but a string or whole numbers ≥ 0.
    """
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
    raise InputError(_at(where, f"the answer must be a string or a list of token ids (whole "
                                f"numbers ≥ 0), got {type(answer).__name__} {str(answer)[:40]}"
                                "; pass text as a string"))


def encode_pair(tokenizer, prompt: Prompt, answer, where: str = "", *,
                offsets: bool = False) -> Encoded:
    """One (prompt, answer) pair tokenized (:func:`prompt_ids`, :func:`answer_tokens`).

    Raises:
        InputError: naming ``where``: a prompt or answer of the wrong type, messages the chat
            template refuses, an empty answer.
    """
    ids, offs = answer_tokens(tokenizer, answer, where, offsets)
    if not ids:
        raise InputError(_at(where, "the answer is empty (no tokens); every answer needs ≥ 1 "
                                    "token"))
    return Encoded(prompt_ids(tokenizer, prompt, where), ids, offsets=offs)


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
    check_counts(prompts, answers)
    return [encode_pair(tokenizer, p, a, f"answer {i}", offsets=offsets)
            for i, (p, a) in enumerate(zip(prompts, answers, strict=True))]


def check_counts(prompts: Sequence, answers: Sequence) -> None:
    """InputError unless ``prompts`` and ``answers`` are lists of one entry per answer (≥ 1)."""
    if isinstance(prompts, str) or isinstance(answers, str):
        raise InputError("prompts and answers must be lists (one entry per answer), not a string")
    if len(prompts) != len(answers):
        raise InputError(f"got {len(prompts)} prompts but {len(answers)} answers; pass one each")
    if len(prompts) == 0:
        raise InputError("no answers to score: prompts and answers are empty")


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


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS token, else 0 (padded
    positions are masked, so which id it is never changes a score)."""
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, Integral) and not isinstance(v, bool):
            return int(v)
    return 0


__all__ = ["Encoded", "Prompt", "adds_bos", "answer_tokens", "check_counts", "encode",
           "encode_pair", "given_encoding", "is_messages", "pad_id", "prompt_ids",
           "render_chat", "text_ids"]
