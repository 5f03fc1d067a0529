"""The model-side work of one micro-batch, run by the worker thread that owns the model.

A batch holds jobs of two kinds:

- :class:`ScoreJob`: (prompt or messages or question, answer) pairs made elsewhere, scored as
  ``isouq score`` scores them (``prepare.prompt_for`` for a question, then
  ``score_sequences`` with the server's parameter set);
- :class:`GenerateJob`: prompts to answer (chat messages through the model's chat template, a
  plain completion prompt, or a question in the QA prompt of ``isouq ask``), decoded by
  ``llm.generation`` (greedy at temperature 0, else sampled with the request's seed), then
  scored like ``isouq ask`` scores its answers (the prompt and the answer's token ids).

Either kind may ask for ``spans`` (``"sentences"`` or ``"lines"``, ``isouq.spans``): each answer's
``uncertainty`` then also lists its spans with their scores, as ``isouq score --spans`` writes
them, computed in the same ``score_sequences`` calls as the answers.

:meth:`Engine.run` checks every job against the limits, decodes the generation jobs (jobs with
the same decoding settings together, one batched decode), then scores every answer of the
batch together: one ``score_sequences`` call per pass, the passes of least predicted time
(``prepare.split_padded``: one pass unless answers of very different lengths would pad each
other more than another pass costs), and adds P(correct) with a calibration. Each prompt and
answer is tokenized once: the token ids measured against the limits are the ones scored
(``score_sequences(encoded=)``), and a generated answer is scored on its prompt's ids and its
own. A job that fails (a limit, a prompt the chat template refuses, a failing decode) gets its
own error; the others are answered. If the batch's scoring fails, each job is scored alone, so
a bad job never takes its batch-mates with it.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..defaults import ANSWER_SCORE, SPAN_SCORE, least_trusted
from ..errors import IsouqError
from ..prepare import (
    TOO_LARGE,
    Limit,
    Limits,
    Prepared,
    RowProblem,
    prepare_pair,
    prepare_prompt,
    prompt_for,
    resolve_one,
    split_padded,
)
from ..scores import SequenceScores
from ..sequences import score_sequences
from ..spans import AnswerSpans
from ..tokens import Encoded, text_ids
from .config import ServeSettings
from .errors import RequestError

#: what ``uncertainty`` holds for every answer (``p_correct``/``withheld`` with a calibration)
SCORE_FIELDS = SequenceScores.KEYS
#: temperatures below this decode greedily
GREEDY_BELOW = 1e-5
#: the spans of an answer scored whole only (an answer of a batch whose other answers have spans)
NO_SPANS = AnswerSpans("", (), ())


@dataclass
class Pair:
    """One (prompt, answer) pair of ``/v1/score``: ``prompt`` (text or chat messages) or
    ``question`` (put in ``isouq ask``'s QA prompt), ``answer`` (text or token ids)."""

    answer: str | list[int]
    prompt: str | list[dict] | None = None
    question: str | None = None
    key: str | None = None


@dataclass
class ScoreJob:
    """Pairs to score; ``param`` is the request field that holds them (for error messages)."""

    pairs: list[Pair]
    param: str = "pairs"
    spans: str | None = None
    blocks: bool = False

    @property
    def units(self) -> int:
        return len(self.pairs)


@dataclass
class GenerateJob:
    """Prompts to answer: each ``(kind, value)`` with kind ``"messages"`` (chat messages),
    ``"text"`` (a completion prompt) or ``"question"`` (``isouq ask``'s QA prompt)."""

    prompts: list[tuple[str, object]]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    param: str = "messages"
    spans: str | None = None
    blocks: bool = False

    @property
    def greedy(self) -> bool:
        """Temperature 0, or so close to it that logits / T overflow (vLLM's rule: < 1e-5)."""
        return self.temperature < GREEDY_BELOW

    @property
    def units(self) -> int:
        """Answers this job adds to a batch (greedy choices are one answer, repeated)."""
        return len(self.prompts) * (1 if self.greedy else self.n)

    def decoding(self) -> tuple:
        """Jobs with equal decoding settings are decoded together."""
        if self.greedy:
            return ("greedy", self.max_tokens, self.stop)
        return ("sample", self.max_tokens, self.stop, self.temperature, self.top_p, self.n)


@dataclass
class Outcome:
    """A job's answer: ``result`` or ``error``; ``seconds`` per stage of its batch;
    ``finished``: when its batch was done (``time.perf_counter``)."""

    result: object = None
    error: BaseException | None = None
    seconds: dict = field(default_factory=dict)
    finished: float | None = None


def finite(x: float) -> float | None:
    """``x`` as a JSON number, None for NaN/inf (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


class Engine:
    """The model, its tokenizer and the server's settings; :meth:`run` answers a batch.

    Args:
        model, tokenizer: a causal LM and its tokenizer (loaded once, at start).
        settings: the server's :class:`ServeSettings`.
        calibration: a :class:`isouq.calibration.Calibrator` of this model, or None.
    """

    def __init__(self, model, tokenizer, settings: ServeSettings, calibration=None):
        self.model, self.tokenizer = model, tokenizer
        self.settings = settings
        self.calibration = calibration
        self.params_info = None  # the ParamInfo of the first scoring (warm_up sets it)
        # the fixed cost of one pass in tokens (settings, else timed by warm_up)
        self.pass_tokens: float | None = settings.pass_tokens
        # what a pair must fit, and a prompt to answer (its answer limit: --max-new-tokens)
        self.limits = Limits.of_model(
            model, prompt=Limit(settings.max_prompt_tokens, "--max-prompt-tokens"),
            answer=Limit(settings.max_answer_tokens, "--max-answer-tokens"),
            memory_budget=settings.memory_budget)
        self.generate_limits = replace(
            self.limits, answer=Limit(settings.max_new_tokens, "--max-new-tokens"))

    # ------------------------------------------------------------ start
    def warm_up(self) -> None:
        """Score one short pair: the parameter set becomes known (``GET /v1/models``) and the
        first request does not pay for the first pass."""
        prompt = "Hello"
        needs = self.calibration is not None and self.calibration.needs_blocks
        res = score_sequences(self.model, self.tokenizer, [prompt], [" Hello"],
                              batch_size=1, params=self.settings.params, blocks=needs,
                              hidden=self.needs_hidden)
        self.params_info = res.params
        if needs:  # a head on another model's blocks: refused at start, in one line
            self.calibration.check_blocks(res.block_names)
        if self.needs_hidden:  # a probe on another model's states: likewise
            self.calibration.check_hidden({n: len(v) for n, v in res.row_hidden(0).items()})
        if self.pass_tokens is None:
            self.pass_tokens = self.measure_pass_tokens()

    def measure_pass_tokens(self, length: int = 64, rows: int = 4, repeats: int = 2) -> float:
        """The fixed cost of one scoring pass on this model and device, in tokens' worth.

        Times one pass of 1 row and one of ``rows`` rows, each of ``length`` tokens (the best
        of ``repeats``), and fits time = fixed + per-token × tokens through the two.

        Returns:
            fixed / per-token (≥ 0); ``math.inf`` when more rows cost no more time (a pass
            whose time is not in its tokens: keep batches whole).
        """
        ids = text_ids(self.tokenizer, "Hello world") or [0]
        row = Encoded([ids[i % len(ids)] for i in range(length - 8)],
                      [ids[i % len(ids)] for i in range(8)])

        def best(n: int) -> float:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                score_sequences(self.model, self.tokenizer, [""] * n, [""] * n, batch_size=n,
                                params=self.settings.params, encoded=[row] * n)
                times.append(time.perf_counter() - t)
            return min(times)

        one, many = best(1), best(rows)
        per_token = (many - one) / ((rows - 1) * length)
        if per_token <= 0:
            return math.inf
        return max(one - length * per_token, 0.0) / per_token

    def params_summary(self) -> dict:
        """The parameter set scored: the ``--params`` spec, tensors and scalars."""
        spec = self.settings.params
        out = {"spec": "all" if spec is None else spec}
        if self.params_info is not None:
            out |= {"n_tensors": len(self.params_info.names),
                    "n_params": int(self.params_info.n_params)}
        return out

    # ------------------------------------------------------------ rows
    def _prepare_pair(self, pair: Pair, where: str, spans: str | None, job: int) -> Prepared:
        """The pair made ready (``prepare.prepare_pair``: its one tokenization, its fit, its
        spans; ``source`` = its job's place in the batch), or a RequestError."""
        try:
            prompt = prompt_for(self.tokenizer, pair.prompt, pair.question)
            return prepare_pair(self.tokenizer, prompt, pair.answer, self.limits, where=where,
                                spans=spans, key=where, source=job)
        except RowProblem as e:
            raise request_error(e, where) from None

    def _generated_item(self, text: str, prompt_ids: list[int], g, spans: str | None,
                        job: int) -> Prepared:
        """A generated answer to score: its prompt's ids and its own (nothing tokenized
        again); with ``spans``, its spans (none when its text has none: blank, or no token of
        its own)."""
        enc = Encoded(list(prompt_ids), list(g.token_ids))
        resolved = None
        if spans is not None:
            try:
                resolved = resolve_one(self.tokenizer, enc.answer, spans, enc)
            except RowProblem:  # an answer without spans is scored whole
                resolved = NO_SPANS
        return Prepared(text, enc.answer, enc, resolved, source=job)

    def _prepare_generate(self, job: GenerateJob) -> list[tuple[str, list[int]]]:
        """(prompt text, its token ids: measured here, scored with the answer) of each of the
        job's prompts (``prepare.prepare_prompt``), or a RequestError."""
        out = []
        for i, (kind, value) in enumerate(job.prompts):
            where = job.param if len(job.prompts) == 1 else f"{job.param}[{i}]"
            try:
                prompt = (prompt_for(self.tokenizer, question=str(value)) if kind == "question"
                          else list(value) if kind == "messages" else str(value))
                out.append(prepare_prompt(self.tokenizer, prompt, self.generate_limits,
                                          max_new_tokens=job.max_tokens, where=where))
            except RowProblem as e:
                raise request_error(e, where) from None
        return out

    # ------------------------------------------------------------ the batch
    def run(self, jobs: Sequence[ScoreJob | GenerateJob]) -> list[Outcome]:
        """Answer a batch: one :class:`Outcome` per job, in order."""
        outcomes = [Outcome() for _ in jobs]
        t0 = time.perf_counter()
        # 1. prompts built, tokenized and checked
        pairs: dict[int, list[Prepared]] = {}
        gens: dict[int, list[tuple[str, list[int]]]] = {}
        for j, job in enumerate(jobs):
            try:
                if isinstance(job, ScoreJob):
                    pairs[j] = [self._prepare_pair(p, job.param if job.param == "answer"
                                                   else f"{job.param}[{i}]", job.spans, j)
                                for i, p in enumerate(job.pairs)]
                else:
                    gens[j] = self._prepare_generate(job)
            except Exception as e:  # noqa: BLE001 - the job's own error, never its batch's
                outcomes[j].error = e
        t1 = time.perf_counter()
        # 2. generation, jobs of equal decoding settings together
        decoded: dict[int, list[list]] = {}  # job -> per prompt, per choice: Generation
        groups: dict[tuple, list[int]] = {}
        for j in gens:
            groups.setdefault(jobs[j].decoding(), []).append(j)
        for members in groups.values():
            try:
                got = self._decode([jobs[j] for j in members], [gens[j] for j in members])
            except Exception:  # noqa: BLE001 - decode each job alone: the error is its own
                got = []
                for j in members:
                    try:
                        got += self._decode([jobs[j]], [gens[j]])
                    except Exception as e:  # noqa: BLE001
                        outcomes[j].error = _as_request_error(e, jobs[j].param)
                        got.append(None)
            for j, g in zip(members, got, strict=True):
                if g is not None:
                    decoded[j] = g
        t2 = time.perf_counter()
        # 3. every answer of the batch scored together, in its passes by length (and within the
        # memory budget)
        items: list[Prepared] = []
        for prepared in pairs.values():
            items += prepared
        for j, per_prompt in decoded.items():
            for (text, ids), choices in zip(gens[j], per_prompt, strict=True):
                items += [self._generated_item(text, ids, g, jobs[j].spans, j)
                          for g in _distinct(choices)]
        shown = [jobs[it.source].blocks for it in items]
        blocks = any(shown) or (self.calibration is not None and self.calibration.needs_blocks)
        scores = self._score_all(items, outcomes, blocks=blocks)  # hidden: as the probe needs
        t3 = time.perf_counter()
        # 4. P(correct), then each job's answer
        calibrated = self._calibrate(scores, shown)
        by_job: dict[int, list[dict]] = {}
        for it, sc in zip(items, calibrated, strict=True):
            by_job.setdefault(it.source, []).append(sc)
        t4 = time.perf_counter()
        seconds = {"prepare": t1 - t0, "generate": t2 - t1, "score": t3 - t2,
                   "calibrate": t4 - t3}
        for j, job in enumerate(jobs):
            outcomes[j].seconds = seconds
            outcomes[j].finished = t4
            if outcomes[j].error is not None:
                continue
            mine = by_job.get(j, [])
            if isinstance(job, ScoreJob):
                outcomes[j].result = [
                    {"uncertainty": u, "prompt_tokens": len(it.encoded.prompt),
                     "answer_tokens": len(it.encoded.answer)}
                    for u, it in zip(mine, pairs[j], strict=True)]
            else:
                outcomes[j].result = self._answers(job, gens[j], decoded[j], mine)
        return outcomes

    def _decode(self, jobs: list[GenerateJob], prepared: list[list[tuple[str, int]]]):
        """Per job, per prompt, the job's n choices (``llm.generation.Generation``)."""
        from ..llm.generation import generate_greedy, sample_completions

        first = jobs[0]
        prompts = [text for p in prepared for text, _ in p]
        if first.greedy:
            gens = generate_greedy(self.model, self.tokenizer, prompts,
                                   max_new_tokens=first.max_tokens, stop=first.stop,
                                   batch_size=max(len(prompts), 1))
            flat, at = [], 0
            for job, p in zip(jobs, prepared, strict=True):
                for g in gens[at:at + len(p)]:
                    flat.append([g] * job.n)  # greedy choices are one answer, repeated
                at += len(p)
        else:
            # the request's seed and its prompt seed each choice, so that its answers do not
            # depend on what it was batched with (qa.generation's per-row random streams)
            keys = [f"{job.seed if job.seed is not None else secrets.randbits(63)}\x1f{i}"
                    for job, p in zip(jobs, prepared, strict=True) for i in range(len(p))]
            sampled = sample_completions(self.model, self.tokenizer, prompts, k=first.n,
                                         temperature=first.temperature, top_k=None,
                                         top_p=first.top_p, max_new_tokens=first.max_tokens,
                                         stop=first.stop, seed=0, keys=keys,
                                         batch_size=max(len(prompts) * first.n, 1))
            flat = [s.completions for s in sampled]
        out, at = [], 0
        for p in prepared:
            out.append(flat[at:at + len(p)])
            at += len(p)
        return out

    def _score_all(self, items: list[Prepared], outcomes: list[Outcome], *,
                   blocks: bool = False) -> list[dict | None]:
        """The scores of every item (:meth:`_score`); if that fails, each job's items
        alone (a job that still fails gets the error). None for a failed job's items."""
        if not items:
            return []
        try:
            return self._score(items, blocks=blocks)
        except Exception:  # noqa: BLE001 - find the job that fails, answer the others
            pass
        out: list[dict | None] = [None] * len(items)
        for j in dict.fromkeys(it.source for it in items):
            idx = [i for i, it in enumerate(items) if it.source == j]
            try:
                got = self._score([items[i] for i in idx], blocks=blocks)
            except Exception as e:  # noqa: BLE001
                outcomes[j].error = _as_request_error(e, None)
                continue
            for i, sc in zip(idx, got, strict=True):
                out[i] = sc
        return out

    def _score(self, items: list[Prepared], *, blocks: bool = False) -> list[dict]:
        """Scores of the items (with ``spans`` when an item has them): one ``score_sequences``
        call per pass on their token ids, the passes of least predicted time
        (``prepare.split_padded`` with :attr:`pass_tokens`: sorted by length, cut where padding
        costs more than a pass; at most ``max_batch`` answers, and with a memory budget each
        pass's predicted peak within it). When some items of a pass have spans, its call scores
        spans (the others' whole answers only: :data:`NO_SPANS`), one ghost backward per span
        index over the pass.
        ``blocks``: each answer's block profile too, from the same backward."""
        memory = self.limits.memory
        fits = None if memory is None else (lambda idx: memory.fits([items[i] for i in idx]))
        pass_tokens = math.inf if self.pass_tokens is None else self.pass_tokens
        chunks = split_padded([it.length for it in items], pass_tokens,
                              self.settings.max_batch, fits)
        out: list[dict | None] = [None] * len(items)
        for idx in chunks:
            part = [items[i] for i in idx]
            spans = None
            if any(it.spans is not None for it in part):
                spans = [NO_SPANS if it.spans is None else it.spans for it in part]
            res = score_sequences(self.model, self.tokenizer, [it.prompt for it in part],
                                  [it.answer for it in part], batch_size=len(idx),
                                  params=self.settings.params,
                                  encoded=[it.encoded for it in part],
                                  blocks=blocks, hidden=self.needs_hidden,
                                  method=self.method(blocks, spans is not None),
                                  **({"spans": spans} if spans is not None else {}))
            self.params_info = res.params
            for r, (i, it) in enumerate(zip(idx, part, strict=True)):
                out[i] = {**res.row_scores(r), "n_tokens": int(res.n_tokens[r])}
                if it.spans is not None:
                    out[i]["spans"] = res.row_spans(r)
                if blocks:
                    out[i]["blocks"] = res.row_blocks(r)
                if self.needs_hidden:
                    out[i]["hidden"] = res.row_hidden(r)
        return out

    def method(self, blocks: bool, spans: bool) -> str:
        """``forward`` (no backward pass) when the calibration reads no gradient score and no
        answer of the pass asks for its block profile or span scores; else ``ghost``."""
        forward = (self.calibration is not None and not self.calibration.needs_backward
                   and not blocks and not spans)
        return "forward" if forward else "ghost"

    @property
    def needs_hidden(self) -> bool:
        """Whether the calibration's probe reads the answers' hidden states (taken from the
        scores' own forward, never shown)."""
        return self.calibration is not None and self.calibration.needs_hidden

    def _calibrate(self, scores: list[dict | None],
                   shown: list[bool] | None = None) -> list[dict | None]:
        """Each answer's ``uncertainty`` object (None for a failed job's); ``shown``: per answer,
        whether its job asked for the block profile."""
        params = self.params_summary()
        ok = [i for i, s in enumerate(scores) if s is not None]
        p = w = None
        if self.calibration is not None and ok:
            p = self.calibration.predict([{"scores": scores[i], "blocks": scores[i].get("blocks"),
                                           "hidden": scores[i].get("hidden")} for i in ok])
            w = self.calibration.withheld(p)
        out: list[dict | None] = [None] * len(scores)
        for r, i in enumerate(ok):
            u = {k: finite(scores[i][k]) for k in SCORE_FIELDS}
            u["n_tokens"] = scores[i]["n_tokens"]
            u["params"] = params
            # the score to read first (``isouq.defaults``): P(correct) when calibrated
            u["headline_by"] = "p_correct" if p is not None else ANSWER_SCORE
            if "spans" in scores[i]:
                u["spans"] = [_finite_span(sp) for sp in scores[i]["spans"]]
                u["least_trusted_span"] = least_trusted(scores[i]["spans"])
                u["least_trusted_by"] = SPAN_SCORE
            if shown is not None and shown[i] and "blocks" in scores[i]:
                u["blocks"] = {b: finite(v) for b, v in scores[i]["blocks"].items()}
            if p is not None:
                u["p_correct"] = finite(p[r])
                u["withheld"] = None if w is None else bool(w[r])
            out[i] = u
        return out

    @staticmethod
    def _answers(job: GenerateJob, prepared, decoded, uncertainty: list[dict]) -> list[dict]:
        """Per prompt: its token count and its n choices (text, finish reason, uncertainty)."""
        out, at = [], 0
        for (_, prompt_ids), choices in zip(prepared, decoded, strict=True):
            distinct = _distinct(choices)
            mine = uncertainty[at:at + len(distinct)]
            at += len(distinct)
            u_of = {id(g): u for g, u in zip(distinct, mine, strict=True)}
            out.append({"prompt_tokens": len(prompt_ids), "choices": [
                {"text": g.text, "raw_text": g.raw_text,
                 "finish_reason": "length" if g.stop_reason == "length" else "stop",
                 "completion_tokens": len(g.token_ids), "uncertainty": u_of[id(g)]}
                for g in choices]})
        return out


def _finite_span(span: dict) -> dict:
    """A span entry of ``SpanSequenceScores.row_spans`` with its scores as JSON numbers (None
    for NaN/inf)."""
    return {**span, "scores": {k: finite(v) for k, v in span["scores"].items()}}


def _distinct(choices: list) -> list:
    """The choices, each object once (greedy choices repeat one Generation)."""
    seen: dict[int, object] = {}
    for g in choices:
        seen.setdefault(id(g), g)
    return list(seen.values())


def request_error(e: RowProblem, param: str) -> RequestError:
    """A row that cannot be scored as the server answers it: 413 for a row too large
    (``prepare.TOO_LARGE``), else 422; its reason as OpenAI's error ``code``."""
    return RequestError(str(e), status=413 if e.reason in TOO_LARGE else 422, param=param,
                        code=e.reason)


def _as_request_error(e: BaseException, param: str | None) -> BaseException:
    """A user error as a 422 naming the field; anything else stays as it is (a 500)."""
    if isinstance(e, RequestError):
        return e
    if isinstance(e, IsouqError):
        return RequestError(str(e), param=param)
    return e
