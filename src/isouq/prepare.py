"""A row made ready to score, one way for every caller: ``score_sequences``, ``isouq score``'s
runner and the server.

Preparing a row means: its prompt (given, or the QA prompt of a question) rendered and
tokenized once with its answer (``isouq.tokens``), its fit checked against the model and the
caller's limits (vocabulary, context window, a server's prompt and answer limits, a memory
budget), its spans resolved onto its tokens (``isouq.spans``), and the rows planned into
batches (:func:`plan_batches`). A row that cannot be scored raises :class:`RowProblem`, an
:class:`~isouq.errors.InputError` carrying one reason code of :data:`REASONS`; each caller only
translates it: ``score_sequences`` raises it, the runner writes an error row with the reason,
the server answers with an HTTP status (413 for the reasons of :data:`TOO_LARGE`, else 422) and
the reason as OpenAI's error ``code``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .errors import InputError
from .spans import AnswerSpans, resolve_spans
from .tokens import Encoded, answer_tokens, is_messages, prompt_ids, render_chat, text_ids

#: reason code -> what it means (one code per way a row can fail to be scorable)
REASONS: dict[str, str] = {
    "invalid_prompt": "a prompt that is neither text nor chat messages, or messages the model's "
                      "chat template refuses",
    "empty_prompt": "a prompt with no token",
    "invalid_answer": "an answer that is neither text nor token ids",
    "empty_answer": "an answer with no token",
    "token_out_of_vocabulary": "a token id outside the model's vocabulary",
    "prompt_too_long": "a prompt over the caller's prompt limit (a server's --max-prompt-tokens)",
    "answer_too_long": "an answer over the caller's answer limit (a server's "
                       "--max-answer-tokens, --max-new-tokens)",
    "context_length_exceeded": "prompt + answer longer than the model's context window",
    "over_memory_budget": "the row alone is predicted to need more memory than the budget",
    "invalid_spans": "spans that are not ranges of the answer or hold no token of their own",
}
#: the reasons that say a row is too large (HTTP 413 on the server)
TOO_LARGE = frozenset({"prompt_too_long", "answer_too_long", "context_length_exceeded",
                       "over_memory_budget"})


class RowProblem(InputError):
    """A row that cannot be scored: ``reason`` (a key of :data:`REASONS`), ``where`` (the row's
    name in the message, e.g. ``answer 3`` or ``pairs[2]``; may be empty) and a message that
    names the problem and the fix."""

    def __init__(self, reason: str, message: str, where: str = ""):
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}")
        super().__init__(f"{where}: {message}" if where else message)
        self.reason, self.where, self.detail = reason, where, message


# ------------------------------------------------------------------ limits
@dataclass(frozen=True)
class Limit:
    """A caller's own limit on tokens: ``tokens``, and ``option``, how the user raises it (for
    the message, e.g. ``"--max-prompt-tokens"``)."""

    tokens: int
    option: str


@dataclass(frozen=True)
class MemoryFit:
    """A memory budget: the model's sizes (``memory_plan.Shape``), ``budget`` bytes, the engine
    the rows are scored with, and ``option``, how the user raises the budget."""

    shape: Any
    budget: int
    method: str = "ghost"
    option: str = "--memory-budget"

    def need(self, rows: int, length: int, answer_length: int) -> int:
        """Predicted peak bytes of scoring ``rows`` rows of ``length`` tokens, ``answer_length``
        of them answer tokens (``memory_plan.peak_bytes``)."""
        from .memory_plan import peak_bytes

        return peak_bytes(self.shape, batch=rows, length=max(length, 2),
                          answer_length=max(answer_length, 1), method=self.method)

    def fits(self, items: Sequence[Prepared]) -> bool:
        """Whether one batch of ``items`` fits the budget."""
        return self.need(sum(it.n_rows for it in items), max(it.length for it in items),
                         max(len(it.encoded.answer) for it in items)) <= self.budget


@dataclass(frozen=True)
class Limits:
    """What a row must fit: the model's vocabulary and context window (None: unknown), and the
    caller's own limits on the prompt and the answer and its memory budget (None: none)."""

    vocab: int | None = None
    window: int | None = None
    prompt: Limit | None = None
    answer: Limit | None = None
    memory: MemoryFit | None = None

    @classmethod
    def of_model(cls, model, *, prompt: Limit | None = None, answer: Limit | None = None,
                 memory_budget: int | None = None, method: str = "ghost") -> Limits:
        """The limits of ``model`` (its input embedding's rows, its config's context window),
        with the caller's own."""
        memory = None
        if memory_budget is not None:
            from .memory_plan import shape_of

            memory = MemoryFit(shape_of(model), int(memory_budget), method)
        return cls(vocab=vocab_size(model), window=context_window(model), prompt=prompt,
                   answer=answer, memory=memory)


def context_window(model) -> int | None:
    """The model's context window in tokens (its config's ``max_position_embeddings`` or the
    like), None when it names none."""
    cfg = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def vocab_size(model) -> int | None:
    """Rows of the model's input embedding (the ids it can read), None when it has none."""
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    return getattr(emb, "num_embeddings", None)


def check_fit(enc: Encoded, limits: Limits, where: str = "", *,
              answer_what: str = "the answer is") -> None:
    """RowProblem unless the pair's tokens fit: ids inside the vocabulary, the prompt and the
    answer within the caller's limits, both within the context window.

    Args:
        enc: the pair's token ids (for a generation: the prompt's, and as many answer tokens
            as may be generated).
        limits: what it must fit.
        where: the row's name in the message.
        answer_what: how the message speaks of the answer's length (a generation: "max_tokens
            asks for").
    """
    ids = enc.prompt + enc.answer
    if limits.vocab is not None and ids and max(ids) >= limits.vocab:
        raise RowProblem("token_out_of_vocabulary",
                         f"token id {max(ids)} is outside the model's vocabulary of "
                         f"{limits.vocab}; pass ids of this model's tokenizer", where)
    p, a = len(enc.prompt), len(enc.answer)
    if limits.prompt is not None and p > limits.prompt.tokens:
        raise RowProblem("prompt_too_long",
                         f"the prompt is {p} tokens, over the limit of {limits.prompt.tokens} "
                         f"({limits.prompt.option}); shorten it", where)
    if limits.answer is not None and a > limits.answer.tokens:
        raise RowProblem("answer_too_long",
                         f"{answer_what} {a} tokens, over the limit of {limits.answer.tokens} "
                         f"({limits.answer.option}); shorten it", where)
    if limits.window is not None and p + a > limits.window:
        raise RowProblem("context_length_exceeded",
                         f"prompt ({p} tokens) + answer ({a}) are {p + a} tokens, longer than "
                         f"the model's context window of {limits.window}; shorten the prompt "
                         "or the answer", where)


def check_memory(items: Sequence[Prepared], memory: MemoryFit | None, where: str = "") -> None:
    """RowProblem when one batch of ``items`` (a row alone: its own batch) is predicted to need
    more memory than the budget."""
    if memory is None or memory.fits(items):
        return
    need = memory.need(sum(it.n_rows for it in items), max(it.length for it in items),
                       max(len(it.encoded.answer) for it in items))
    n = max(it.length for it in items)
    raise RowProblem("over_memory_budget",
                     f"{n} tokens need about {need / 2**30:.2f} GiB to score (predicted), over "
                     f"the memory budget of {memory.budget / 2**30:.2f} GiB ({memory.option}); "
                     f"shorten the row or raise {memory.option}", where)


# ------------------------------------------------------------------ rows
@dataclass(frozen=True)
class Prepared:
    """A row ready for its batch: ``prompt`` and ``answer`` as scored, ``encoded`` their token
    ids (the row's one tokenization, used by its batch and by a retry alone), ``spans``
    (resolved; None without spans), ``n_rows`` (the rows it counts as in a memory plan: 1, or
    1 + its spans when span rows are rows of their own) and ``source``, the caller's own record
    of it (an input row, a request's pair)."""

    prompt: str | list
    answer: str | list[int]
    encoded: Encoded
    spans: AnswerSpans | None = None
    n_rows: int = 1
    source: Any = None

    @property
    def length(self) -> int:
        """Prompt + answer tokens."""
        return self.encoded.length


def prompt_for(tokenizer, prompt=None, question: str | None = None):
    """The prompt to score or answer: ``prompt`` as given (text or chat messages), else the QA
    prompt of ``question`` (``llm.prompts.qa_prompt``, as ``isouq ask`` asks it)."""
    if prompt is not None:
        return prompt
    from .llm.prompts import qa_prompt

    return qa_prompt(tokenizer, question)


def span_rows(method: str, spans: AnswerSpans | None) -> int:
    """Rows a pair counts as in a memory plan: 1, or 1 + its spans with an engine that scores
    a span as a row of its own (per_example, per_token)."""
    if spans is None or method in ("ghost", "auto"):
        return 1
    return 1 + len(spans.ranges)


def prepare_pair(tokenizer, prompt, answer, limits: Limits, *, where: str = "",
                 spans=None, encoded: Encoded | None = None, method: str = "ghost",
                 key: str | int | None = None, source: Any = None) -> Prepared:
    """One (prompt, answer) pair made ready to score.

    Args:
        tokenizer: the model's tokenizer.
        prompt: text or chat messages (rendered with the chat template and a generation prompt).
        answer: text or token ids.
        limits: what the pair must fit (:class:`Limits`).
        where: the pair's name in a problem's message.
        spans: ``"sentences"``, ``"lines"``, a list of (start, end) character ranges, an
            :class:`~isouq.spans.AnswerSpans` already resolved, or None (no spans).
        encoded: its token ids when already made (nothing is tokenized again).
        method: the engine (its memory plan; spans as rows of their own or not).
        key: the pair's name in a spans problem's message (default ``where``).
        source: the caller's own record of the pair, kept in :attr:`Prepared.source`.

    Raises:
        RowProblem: the reason and the fix.
    """
    enc = encoded if encoded is not None else encode_checked(tokenizer, prompt, answer, where,
                                                             offsets=spans is not None)
    check_fit(enc, limits, where)
    resolved = (None if spans is None
                else resolve_one(tokenizer, answer, spans, enc, key if key is not None else where))
    item = Prepared(prompt, answer, enc, resolved, span_rows(method, resolved), source)
    check_memory([item], limits.memory, where)
    return item


def encode_checked(tokenizer, prompt, answer, where: str = "", *,
                   offsets: bool = False) -> Encoded:
    """The pair's token ids (``isouq.tokens``), or a RowProblem with its reason."""
    try:
        ids = prompt_ids(tokenizer, prompt)
    except InputError as e:
        raise RowProblem("invalid_prompt", str(e), where) from None
    try:
        answer_ids, offs = answer_tokens(tokenizer, answer, offsets=offsets)
    except InputError as e:
        raise RowProblem("invalid_answer", str(e), where) from None
    if not answer_ids:
        raise RowProblem("empty_answer", "the answer is empty (no tokens); every answer needs "
                         "≥ 1 token", where)
    return Encoded(ids, answer_ids, offsets=offs)


def resolve_one(tokenizer, answer, spans, enc: Encoded, key: str | int = 0) -> AnswerSpans:
    """The answer's spans (``spans.resolve_spans``) placed on its tokens, or a RowProblem whose
    message names the answer by ``key`` (its row key, or its place)."""
    try:
        return resolve_spans(tokenizer, [answer],
                             spans if isinstance(spans, str) else [spans], [enc],
                             keys=[key])[0]
    except InputError as e:
        raise RowProblem("invalid_spans", str(e)) from None
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot decode the ids
        name = f"answer {key!r}" if isinstance(key, str) else f"answer {key}"
        raise RowProblem("invalid_spans", f"{name}: its spans cannot be placed on its tokens "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         "score it without spans") from None


def prepare_prompt(tokenizer, prompt, limits: Limits, *, max_new_tokens: int,
                   where: str = "") -> tuple[str, list[int]]:
    """A prompt to answer made ready: its text (chat messages rendered with the chat template
    and a generation prompt) and its token ids, checked with room for ``max_new_tokens``.

    Raises:
        RowProblem: an empty or unrenderable prompt, over the prompt limit, ``max_new_tokens``
            over the answer limit, both over the context window or the memory budget.
    """
    if is_messages(prompt):
        try:
            text = render_chat(tokenizer, prompt)
        except InputError as e:
            raise RowProblem("invalid_prompt", str(e), where) from None
    elif isinstance(prompt, str):
        text = prompt
    else:
        raise RowProblem("invalid_prompt", f"the prompt must be text or chat messages, got "
                         f"{type(prompt).__name__}", where)
    ids = text_ids(tokenizer, text)
    if not ids:
        raise RowProblem("empty_prompt", "the prompt is empty; give the prompt text", where)
    check_fit(Encoded(ids, []), limits, where)  # the vocabulary, the prompt limit
    room = Encoded(ids, [0] * max_new_tokens)  # the answer limit and the window, generated
    check_fit(room, replace(limits, vocab=None), where, answer_what="max_tokens asks for")
    check_memory([Prepared(text, [], room)], limits.memory, where)
    return text, ids


# ------------------------------------------------------------------ batches
def plan_batches(lengths: list[int], batch_size: int, max_tokens: int | None,
                 bucket: bool = True,
                 fits: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """Group item indices into batches: sorted by length when ``bucket``, each batch at most
    ``batch_size`` items, (max length × items) ≤ ``max_tokens`` padded tokens, and, given
    ``fits`` (indices -> whether that batch fits a memory budget), a batch that fits."""
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if bucket \
        else list(range(len(lengths)))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        full = len(cur) >= batch_size or (max_tokens is not None and cur
                                          and grown * (len(cur) + 1) > max_tokens) or (
            fits is not None and cur and not fits([*cur, i]))
        if full:
            batches.append(cur)
            cur, grown = [], lengths[i]
        cur.append(i)
        longest = grown
    if cur:
        batches.append(cur)
    return batches


def split_padded(lengths: Sequence[int], pass_tokens: float, max_rows: int | None = None,
                 fits: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """One batch's rows split into passes of the least predicted time: sorted by length, cut
    where a pass's padding would cost more than another pass.

    A pass of rows ``r`` is predicted to cost ``pass_tokens + len(r) × max(lengths[r])`` token
    units: its fixed cost (weights read, launches, hooks; ``pass_tokens`` tokens' worth) and its
    padded tokens. The cuts of the rows sorted by length that minimise the sum are found
    exactly (dynamic programming over the sorted rows, O(n²)). A large ``pass_tokens`` (a GPU,
    where a pass costs far more than a row) keeps the batch whole; a small one (a CPU, where
    time grows with the padded tokens) splits rows of very different lengths apart.

    Args:
        lengths: (n,) tokens of each row (prompt + answer).
        pass_tokens: the fixed cost of one pass, in tokens (≥ 0; ``math.inf``: as few passes as
            the other bounds allow).
        max_rows: the most rows in one pass (None: no bound).
        fits: indices -> whether one pass of those rows fits (a memory budget); a pass that
            does not is never chosen (a single row always is).

    Returns:
        The passes, each a list of indices into ``lengths``, shortest rows first.
    """
    n = len(lengths)
    order = sorted(range(n), key=lambda i: lengths[i])
    if n <= 1:
        return [order] if n else []
    # an infinite pass cost: the fewest passes, then the least padding among them
    per_pass = pass_tokens if pass_tokens < float("inf") else float(n * max(lengths) + 1) * n
    best = [0.0] + [float("inf")] * n  # best[j]: the least cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j - 1, -1, -1):  # the last pass holds sorted rows i .. j-1
            if i < j - 1 and ((max_rows is not None and j - i > max_rows)
                              or (fits is not None and not fits(order[i:j]))):
                break  # a larger pass of these rows fits no better
            cost = best[i] + per_pass + (j - i) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    passes, j = [], n
    while j > 0:
        passes.append(order[cut[j]:j])
        j = cut[j]
    return passes[::-1]


def plan(items: Sequence[Prepared], batch_size: int, *, max_tokens: int | None = None,
         bucket: bool = True, memory: MemoryFit | None = None) -> list[list[Prepared]]:
    """The batches of ``items`` (:func:`plan_batches`: ``batch_size``, ``max_tokens`` padded
    tokens, length buckets, the memory budget); items with spans and items without are batched
    apart (one ``score_sequences`` call scores spans of all or none)."""
    batches = []
    for with_spans in (False, True):
        group = [it for it in items if (it.spans is not None) == with_spans]
        if not group:
            continue
        fits = None
        if memory is not None:
            def fits(idx: list[int], group=group) -> bool:
                return memory.fits([group[i] for i in idx])
        batches += [[group[i] for i in idx] for idx in plan_batches(
            [it.length for it in group], batch_size, max_tokens, bucket, fits=fits)]
    return batches


__all__ = ["REASONS", "TOO_LARGE", "Limit", "Limits", "MemoryFit", "Prepared", "RowProblem",
           "check_fit", "check_memory", "context_window", "encode_checked", "plan",
           "plan_batches", "prepare_pair", "prepare_prompt", "prompt_for", "resolve_one",
           "span_rows", "split_padded", "vocab_size"]
