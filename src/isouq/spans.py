"""Span-level uncertainty of generated answers: which sentence, line or claim to check.

For an answer y = (y₁..y_T) to a prompt x and a span k of it (a set of its tokens Sₖ, e.g. one
sentence): p̄ₖ = (1/|Sₖ|) Σ_{t∈Sₖ} p(yₜ | y<ₜ, x, θ*) — each token conditioned on the prompt and
on the whole answer before it —, aleatoric (1/|Sₖ|) Σ_{t∈Sₖ} pₜ(1 − pₜ), epistemic ‖∇θ p̄ₖ‖² and
epistemic_log = epistemic / p̄ₖ². The whole-answer scores of :func:`isouq.score_sequences` are
computed beside them, unchanged.

Spans (``spans=`` of :func:`isouq.score_sequences`):

- ``"sentences"``: :func:`split_sentences`, a small documented regex splitter;
- ``"lines"``: :func:`split_lines`, one span per non-blank line;
- per answer, a list of character ranges ``(start, end)`` (end exclusive) in the answer's text
  (claims), in any order, non-empty, inside the text and not overlapping.

A span's text and character range are reported with stripped blanks. Tokens are mapped to spans
by their character offsets (the tokenizer's ``offset_mapping`` for a string answer and a fast
tokenizer; otherwise by decoding each prefix of the answer's token ids, and then the text is that
decoding): **a token belongs to the span that holds its first non-blank character** (a token of
blanks only: its first character), so a token straddling a boundary goes to the span where it
begins, and a token outside every span (e.g. the blank between two sentences, or text between
two claims) enters only the whole-answer score. A sentence or line that gets no token of its own
(a token began before it and runs into it) is merged into the span before it; a given range that
gets none is an error.

How it is computed (:func:`score_spans`, the ``span_strategy`` of ``score_sequences``). With the
ghost method (the default, ``"retain"``): one forward of a batch's answers, then, over the
retained graph, one ghost backward per span index k (p̄ of span k of every answer of the batch
at once) and the whole answers' own backward: exact, and the memory of the whole-answer score.
With ``method="per_example"`` or ``"per_token"`` (or ``span_strategy="rows"``): rows truncated
at each span's end, span k of an answer being the row (prompt, answer tokens up to span k's
last one) whose p̄ reads span k's tokens only (a causal LM sees nothing after them); the 1 + S
rows of a batch's answers go through one batch of the batch loop (``isouq.passes``; about
(1 + S)-fold memory); ``method="per_example"`` is then one backward per row, the reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from .choices import SPAN_SPLITTERS as SPLITTERS
from .errors import InputError
from .passes import log_prob, score_encoded, summarize
from .scores import ParamInfo, SequenceScores
from .tokens import Encoded, answer_tokens

#: how span scores are computed: one forward whose graph is retained for a ghost backward per
#: span index (ghost only), or rows truncated at each span's end (any engine)
STRATEGIES = ("retain", "rows")

# ------------------------------------------------------------------ splitting
#: words after which a period never ends a sentence (titles, Latin; lower-case, no final dot)
ABBREVIATIONS = frozenset("mr mrs ms dr prof sr jr st mt e.g i.e cf vs al approx ca".split())
#: words whose period ends a sentence only when a capital letter follows ("made in the U.S. It
#: was" splits, "the U.S. dollar" and "No. 5" do not)
ENDING_ABBREVIATIONS = frozenset(
    "etc u.s u.k u.n a.m p.m inc ltd co corp no nos fig figs eq eqs vol pp dept univ jan feb "
    "mar apr jun jul aug sep sept oct nov dec".split())
_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|\n")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character ranges ``[start, end)`` of the sentences of ``text``, blanks stripped.

    A sentence ends at ``.``, ``!``, ``?`` or ``…`` (repeated, then optional closing quotes or
    brackets) followed by a blank or the end of the text, and at every line break (list items and
    paragraphs are sentences of their own). A period does not end a sentence after a title or
    Latin abbreviation (:data:`ABBREVIATIONS`: "Dr.", "Mr.", "e.g.", "i.e.", "vs.", …), a single
    letter (an initial: "J. K. Rowling") or digits that begin a line (a numbered item: "1. "); after
    an abbreviation that can end a sentence (:data:`ENDING_ABBREVIATIONS`: "etc.", "U.S.",
    "p.m.", "Inc.", "No.", months, …) it ends one only when the next word begins with a capital
    letter. Decimals ("3.14") and dotted names have no blank after the dot and never split. Blank
    text gives no sentence.
    """
    cuts, start = [], 0
    for m in _END.finditer(text):
        if m.group().rstrip("\"'”’)]") == ".":  # a lone period: maybe not an end
            begin = max(text.rfind(" ", 0, m.start()), text.rfind("\n", 0, m.start())) + 1
            word = text[begin:m.start()].lstrip("\"'“‘([").lower()
            after = text[m.end():m.end() + 80].lstrip().lstrip("\"'“‘([")
            if (word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())
                    or (word.isdigit() and not text[text.rfind("\n", 0, begin) + 1:begin].strip())
                    or (word in ENDING_ABBREVIATIONS and not after[:1].isupper())):
                continue
        cuts.append((start, m.end()))
        start = m.end()
    cuts.append((start, len(text)))
    return [r for a, b in cuts if (r := _strip(text, a, b)) is not None]


def split_lines(text: str) -> list[tuple[int, int]]:
    """Character ranges ``[start, end)`` of the non-blank lines of ``text``, blanks stripped."""
    out, start = [], 0
    for line in text.split("\n"):
        r = _strip(text, start, start + len(line))
        if r is not None:
            out.append(r)
        start += len(line) + 1
    return out


def _strip(text: str, a: int, b: int) -> tuple[int, int] | None:
    seg = text[a:b]
    if not seg.strip():
        return None
    return a + len(seg) - len(seg.lstrip()), b - (len(seg) - len(seg.rstrip()))


# ------------------------------------------------------------------ tokens ↔ characters
def answer_offsets(tokenizer, answer, ids: list[int],
                   offsets: Sequence[tuple[int, int]] | None = None
                   ) -> tuple[str, list[tuple[int, int]]]:
    """(text, one (start, end) character range per answer token) of an answer.

    A string answer with a fast tokenizer: the text itself and the tokenizer's
    ``offset_mapping`` (``offsets`` when given: those the tokenization of ``ids`` returned,
    ``Encoded.offsets``; nothing is tokenized again). Otherwise (token ids, or a slow
    tokenizer): the text is the decoded ids and token k covers the characters that
    ``decode(ids[:k + 1])`` adds to ``decode(ids[:k])`` (the common beginning with the full
    decoding, so a token that completes a character split over several tokens holds it and the
    tokens before it are empty).
    """
    if isinstance(answer, str) and offsets is not None and len(offsets) == len(ids):
        return answer, [(int(a), int(b)) for a, b in offsets]
    if isinstance(answer, str) and getattr(tokenizer, "is_fast", False):
        enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == list(ids):
            return answer, [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def dec(t):
        return tokenizer.decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    text = dec(ids)
    bounds = [0]
    for k in range(1, len(ids)):
        pre = dec(ids[:k])
        n = next((j for j, (x, y) in enumerate(zip(pre, text, strict=False)) if x != y),
                 min(len(pre), len(text)))
        bounds.append(max(bounds[-1], n))
    bounds.append(len(text))
    return text, list(zip(bounds[:-1], bounds[1:], strict=True))


def _anchor(text: str, a: int, b: int) -> int:
    """The character that places a token: its first non-blank one, else its first one."""
    for j in range(a, min(b, len(text))):
        if not text[j].isspace():
            return j
    return a


@dataclass(frozen=True)
class AnswerSpans:
    """The spans of one answer: its ``text``, the character ``ranges`` [start, end) and, per
    span, the indices of the answer tokens it holds (``tokens``, ascending)."""

    text: str
    ranges: tuple[tuple[int, int], ...]
    tokens: tuple[tuple[int, ...], ...]


def _assign(text: str, offsets: list[tuple[int, int]], ranges: list[tuple[int, int]]
            ) -> list[list[int]]:
    """Token indices of each range (a token goes where its anchor character lies)."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k])
    out: list[list[int]] = [[] for _ in ranges]
    for t, (a, b) in enumerate(offsets):
        j = _anchor(text, a, b)
        for k in order:
            s, e = ranges[k]
            if s <= j < e:
                out[k].append(t)
                break
    return out


def _name(key) -> str:
    return f"answer {key!r}" if isinstance(key, str) else f"answer {key}"


def check_ranges(given, text: str | None, key) -> list[tuple[int, int]]:
    """The (start, end) character ranges ``given`` for the answer named ``key``, checked.

    Args:
        given: a list of (start, end) pairs of whole numbers (end exclusive).
        text: the answer's text the ranges index; None when it is not known yet (an answer of
            token ids before its tokenizer loads): then only what needs no text is checked
            (pairs of whole numbers, 0 ≤ start < end, no overlap).
        key: the answer's name in the messages (its key, or its place).

    Returns:
        The ranges as (start, end) tuples, in the given order.

    Raises:
        InputError: naming the answer and the fix, for anything but a non-empty list of
            pairs, a range outside the text, an empty or blank range, overlapping ranges.
    """
    name = _name(key)
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise InputError(f"{name}: spans must be a list of (start, end) character ranges, got "
                         f"{type(given).__name__}; pass e.g. [(0, 12), (13, 40)]")
    if len(given) == 0:
        raise InputError(f"{name}: no spans given; pass at least one (start, end) range, or "
                         "spans='sentences'")
    out = []
    for r in given:
        if (not isinstance(r, Sequence) or isinstance(r, str) or len(r) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)):
            raise InputError(f"{name}: span {r!r} is not a (start, end) pair of whole numbers; "
                             "give character ranges such as (0, 12)")
        s, e = int(r[0]), int(r[1])
        if s < 0 or (text is not None and e > len(text)):
            n = "n" if text is None else len(text)
            raise InputError(f"{name}: span ({s}, {e}) lies outside the answer's {n} characters; "
                             f"give 0 ≤ start < end ≤ {n}")
        if s >= e or (text is not None and not text[s:e].strip()):
            raise InputError(f"{name}: span ({s}, {e}) is empty (start ≥ end, or only blanks); "
                             "give each span start < end around some text, or drop it")
        out.append((s, e))
    srt = sorted(out)
    for (s1, e1), (s2, e2) in zip(srt, srt[1:], strict=False):
        if s2 < e1:
            raise InputError(f"{name}: spans ({s1}, {e1}) and ({s2}, {e2}) overlap; give "
                             "disjoint ranges (merge them, or end the first where the next "
                             "begins)")
    return out


def resolve_spans(tokenizer, answers: Sequence, spans, enc: Sequence[Encoded] | None = None,
                  keys: Sequence | None = None) -> list[AnswerSpans]:
    """The spans of each answer, checked, with the tokens each holds.

    Args:
        tokenizer: the model's tokenizer.
        answers: N strings or token-id lists (as :func:`isouq.score_sequences` takes them).
        spans: ``"sentences"``, ``"lines"``, or per answer a list of (start, end) character
            ranges or an :class:`AnswerSpans` already resolved (returned as it is).
        enc: the answers' encoding (``sequences.encode``), when already made: its ids (and
            offsets, ``encode(..., offsets=True)``) are used, nothing is tokenized again.
        keys: N names for the messages (default: the answers' places 0..N−1).

    Raises:
        InputError: naming the answer's key and the fix, for an unknown splitter, a count of
            span lists other than N, a range outside the answer, an empty or overlapping range,
            a range that holds no token, or a splitter that finds no sentence (blank text).
    """
    n = len(answers)
    keys = list(range(n)) if keys is None else list(keys)
    if isinstance(spans, str):
        if spans not in SPLITTERS:
            raise InputError(f"spans={spans!r} is not one of {', '.join(SPLITTERS)}; or pass "
                             "one list of (start, end) character ranges per answer")
        split = split_sentences if spans == "sentences" else split_lines
    elif isinstance(spans, Sequence) and len(spans) == n:
        split = None
    else:
        got = len(spans) if isinstance(spans, Sequence) else type(spans).__name__
        raise InputError(f"spans must be 'sentences', 'lines' or one list of (start, end) ranges "
                         f"per answer; got {got} for {n} answers")
    if enc is not None and len(enc) != n:
        raise InputError(f"got {len(enc)} encoded pairs for {n} answers; pass one each")
    out = []
    for i, a in enumerate(answers):
        if split is None and isinstance(spans[i], AnswerSpans):
            out.append(spans[i])
            continue
        if enc is None:
            t, given_offsets = answer_tokens(tokenizer, a, _name(keys[i]), offsets=True)
        else:
            t, given_offsets = enc[i].answer, enc[i].offsets
        text, offsets = answer_offsets(tokenizer, a, t, given_offsets)
        if split is not None:
            ranges = split(text)
            if not ranges:
                raise InputError(f"{_name(keys[i])}: the {spans} splitter found no "
                                 f"{spans[:-1]} (its text {text[:40]!r} is blank); score it "
                                 "without spans, or give its spans as character ranges")
        else:
            ranges = check_ranges(spans[i], text, keys[i])
        toks = _assign(text, offsets, ranges)
        if split is not None:
            ranges, toks = _merge_tokenless(text, ranges, toks)
        for r, tk in zip(ranges, toks, strict=True):
            if not tk:
                raise InputError(f"{_name(keys[i])}: span {r} ({text[r[0]:r[1]][:30]!r}) holds "
                                 "no token of its own (a token begins before it); widen it to "
                                 "where that token begins, or merge it with the span before")
        # a span's tokens run from the first to the last one anchored in it (contiguous: the
        # anchors of successive tokens never go back)
        out.append(AnswerSpans(text, tuple(ranges),
                               tuple(tuple(range(tk[0], tk[-1] + 1)) for tk in toks)))
    return out


def _merge_tokenless(text, ranges, toks):
    """A split span with no token of its own joins the span before it (the first: after it)."""
    rs, ts = list(ranges), [list(t) for t in toks]
    k = 0
    while k < len(rs) and len(rs) > 1:
        if ts[k]:
            k += 1
            continue
        j = k - 1 if k > 0 else k + 1
        rs[j] = (min(rs[j][0], rs[k][0]), max(rs[j][1], rs[k][1]))
        ts[j] = sorted(ts[j] + ts[k])
        del rs[k], ts[k]
        k = max(0, k - 1)
    return rs, ts


# ------------------------------------------------------------------ results
@dataclass(frozen=True)
class SpanScore:
    """One span's scores: its ``text`` and character range [``start``, ``end``) in the
    answer's text, ``n_tokens`` |Sₖ|, ``mean_prob`` p̄ₖ, ``aleatoric``, ``epistemic``
    ‖∇θ p̄ₖ‖², ``epistemic_log`` (= epistemic / p̄ₖ²), ``normalized_epistemic``
    (epistemic / ‖θ*‖²) and ``seq_logprob`` (Σ log pₜ over the span's tokens, each
    conditioned on the whole answer before it)."""

    text: str
    start: int
    end: int
    n_tokens: int
    mean_prob: float
    aleatoric: float
    epistemic: float
    epistemic_log: float
    normalized_epistemic: float
    seq_logprob: float

    def to_dict(self) -> dict:
        """The span as an answer row's ``spans`` list holds it: text, start, end, n_tokens and
        ``scores`` (the keys of :meth:`isouq.SequenceScores.row_scores`)."""
        return {"text": self.text, "start": self.start, "end": self.end,
                "n_tokens": self.n_tokens,
                "scores": {k: getattr(self, k) for k in SequenceScores.KEYS}}


@dataclass
class SpanSequenceScores(SequenceScores):
    """:class:`isouq.SequenceScores` of the whole answers (unchanged), plus ``spans``: per
    answer, its :class:`SpanScore` list in the spans' order, and ``texts``: the answers' texts
    the character ranges refer to."""

    spans: list[list[SpanScore]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def row_spans(self, i: int) -> list[dict]:
        """Answer ``i``'s spans as an answer row's ``spans`` list holds them."""
        return [s.to_dict() for s in self.spans[i]]


# ------------------------------------------------------------------ scoring
def score_spans(
    model: nn.Module,
    enc: Sequence[Encoded],
    resolved: Sequence[AnswerSpans],
    params: dict[str, nn.Parameter],
    info: ParamInfo,
    *,
    strategy: str | None = None,
    **options,
) -> SpanSequenceScores:
    """Whole-answer and span scores of prepared pairs (``score_sequences(..., spans=...)``
    checks, prepares and calls this).

    Args:
        model: the causal LM.
        enc: the pairs' token ids (``isouq.prepare``).
        resolved: per answer, its spans (:func:`resolve_spans`).
        params: name -> parameter of those that take part.
        info: their ``ParamInfo``.
        strategy: ``"retain"`` (the default with the ghost method): one forward of a batch's
            answers, one ghost backward for the whole answers and one per span index over the
            retained graph (memory of the whole-answer score); ``"rows"`` (the default with
            ``method="per_example"`` or ``"per_token"``): rows truncated at each span's end,
            1 + S rows per answer of S spans in one batch (memory about (1 + S)-fold).
        **options: ``pad``, ``method``, ``covariance``, ``batch_size``, ``per_param``,
            ``padding_side``, ``progress`` of the batch loop (``passes.score_encoded``).

    Returns:
        :class:`SpanSequenceScores`: the whole answers' scores (as without spans) and, per
        answer, its spans'.
    """
    method = options["method"]
    if strategy is None:
        strategy = "retain" if method == "ghost" else "rows"
    if strategy not in STRATEGIES:
        raise InputError(f"span_strategy={strategy!r} is not one of "
                         f"{', '.join(repr(s) for s in STRATEGIES)}")
    if strategy == "retain" and method != "ghost":
        raise InputError("span_strategy='retain' runs ghost backwards; use method='ghost' (and "
                         "the identity covariance) or span_strategy='rows'")
    if strategy == "retain":
        whole, per_span = _score_retained(model, enc, resolved, params, info, options)
    else:
        whole, per_span = _score_rows(model, enc, resolved, params, info, options)
    sq = max(whole.params.sq_norm, 1e-30)
    out: list[list[SpanScore]] = [[] for _ in enc]
    for (i, k), (e, m, a, t, lp) in sorted(per_span.items()):
        lo, hi = resolved[i].ranges[k]
        out[i].append(SpanScore(
            text=resolved[i].text[lo:hi], start=lo, end=hi, n_tokens=t, mean_prob=m,
            aleatoric=a, epistemic=e, epistemic_log=e / m**2 if m > 0 else float("inf"),
            normalized_epistemic=e / sq, seq_logprob=lp))
    kept = {f.name: getattr(whole, f.name) for f in fields(whole) if f.init}
    kept["extra"] = {**kept.get("extra", {}), "span_strategy": strategy}
    return SpanSequenceScores(**kept, spans=out, texts=[r.text for r in resolved])


def _score_retained(model, enc, resolved, params, info, options):
    """The whole answers through the batch loop (ghost), and, over each batch's graph before
    its own backward, one ghost backward per span index k: p̄ of span k of every answer of the
    batch (0 for an answer with fewer spans), retain_graph=True."""
    per_span: dict[tuple[int, int], tuple[float, float, float, int, float]] = {}
    scale = getattr(options["covariance"], "scale", 1.0)

    def after_forward(ghost, p, mask, rows: slice) -> None:
        spans = [resolved[i].tokens for i in range(rows.start, rows.stop)]
        masks = torch.zeros((max(len(s) for s in spans), *mask.shape), dtype=torch.bool,
                            device=mask.device)
        for b, toks in enumerate(spans):
            cols = mask[b].nonzero()[:, 0]  # the answer tokens of row b, in order
            for k, tk in enumerate(toks):
                masks[k, b, cols[tk[0]:tk[-1] + 1]] = True
        for k in range(masks.shape[0]):
            m, a, t = summarize(p * masks[k], masks[k])  # p is nonzero on every answer token
            m = torch.where(t > 0, m, torch.zeros_like(m))  # an answer without span k: 0
            e = scale * ghost.backward_detailed(m, retain_graph=True,
                                                per_param=False).total.detach()
            m, a = m.detach(), a.detach()
            lp = log_prob(p.detach(), masks[k])
            for b in range(len(spans)):
                if k < len(spans[b]):
                    per_span[(rows.start + b, k)] = (float(e[b]), float(m[b]), float(a[b]),
                                                     int(t[b]), float(lp[b]))

    whole = score_encoded(model, enc, params, info, after_forward=after_forward, **options)
    return whole, per_span


def _span_rows(enc: Sequence[Encoded], resolved: Sequence[AnswerSpans]):
    """(answer index, span index or −1 for the whole answer, answer tokens the row holds,
    answer tokens before its scored ones) of each row, answer by answer."""
    out = []
    for i, (e, sp) in enumerate(zip(enc, resolved, strict=True)):
        out.append((i, -1, len(e.answer), 0))
        out += [(i, k, toks[-1] + 1, toks[0]) for k, toks in enumerate(sp.tokens)]
    return out


def _score_rows(model, enc, resolved, params, info, options):
    """Rows truncated at each span's end, the rows of ``batch_size`` answers in one batch
    (``Encoded.scored_from``: the answer tokens before the span are context; the answers' own
    ids, not tokenized again)."""
    rows = _span_rows(enc, resolved)
    n = len(enc)
    options = dict(options)
    batch_size = options.pop("batch_size")
    progress = options.pop("progress", False)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="scoring spans", unit="answer")
    parts, placed = [], []
    for s in range(0, n, batch_size):
        chunk = [r for r in rows if s <= r[0] < s + batch_size]
        parts.append(score_encoded(
            model, [Encoded(enc[i].prompt, enc[i].answer[:end], skip)
                    for i, _, end, skip in chunk], params, info, batch_size=len(chunk),
            **options))
        placed += chunk
        if bar is not None:
            bar.update(min(s + batch_size, n) - s)
    if bar is not None:
        bar.close()
    # per-row tensors of every part, joined; whole-answer rows picked out
    first = parts[0]
    size = sum(1 for r in rows if r[0] < batch_size)
    whole_rows = torch.tensor([j for j, r in enumerate(placed) if r[1] < 0])
    kept, joined = {}, {}
    for f in fields(first):
        v = getattr(first, f.name)
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == size:
            joined[f.name] = torch.cat([getattr(p, f.name) for p in parts])
            kept[f.name] = joined[f.name][whole_rows]
        elif f.init:
            kept[f.name] = v
    per_span = {(i, k): (float(joined["epistemic"][j]), float(joined["mean_prob"][j]),
                         float(joined["aleatoric"][j]), int(joined["n_tokens"][j]),
                         float(joined["seq_logprob"][j]))
                for j, (i, k, _, _) in enumerate(placed) if k >= 0}
    return type(first)(**kept), per_span


__all__ = ["ABBREVIATIONS", "ENDING_ABBREVIATIONS", "SPLITTERS", "STRATEGIES", "AnswerSpans",
           "SpanScore", "SpanSequenceScores", "answer_offsets", "check_ranges", "resolve_spans",
           "score_spans", "split_lines", "split_sentences"]
