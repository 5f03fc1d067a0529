"""How each method of the registry (``isouq.methods.METHODS``) runs on a batch of answers.

One contract: a method's function takes an :class:`AnswerBatch` (N questions, the prompts and
the greedy answers, and, for the methods that need them, K sampled answers per question drawn
once and shared) and returns N :class:`MethodOutput` (scores, seconds, passes). :func:`run_methods`
runs the asked methods in registry order and gathers one dict per answer; ``isouq qa run``,
``isouq ask`` and their Python functions all go through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...errors import InputError
from ...llm.generation import Sampled
from ...methods import METHODS, check_methods


@dataclass
class AnswerBatch:
    """N answers to score, with what the methods share.

    Attributes:
        model, tokenizer: the causal LM that answered (and is scored).
        questions: (N,) question texts.
        prompts: (N,) the prompts the answers were generated from.
        answers: (N,) answer texts.
        answer_ids: (N,) token ids of each answer (the gradient method scores these).
        sample: returns the K sampled answers of each question; called at most once, the
            first time a method needs samples.
        entailment: semantic entropy's entailment judge (``EntailmentJudge``).
        k_p_true: sampled answers P(True) shows as brainstormed.
        seed: P(True)'s seed.
        batch_size: answers per forward/backward pass.
        params: the parameters the gradient method scores (``isouq.params``; None: all).
        blocks: the gradient method also gives each answer's block profile (``extra``
            ``blocks``: {module path: ‖∇θ_b p̄‖²}, ``isouq.blocks``).
        hidden: the gradient method also gives each answer's mean hidden states (``extra``
            ``hidden``: {state name: d floats}, ``isouq.hidden``).
    """

    model: object
    tokenizer: object
    questions: Sequence[str]
    prompts: Sequence
    answers: Sequence[str]
    answer_ids: Sequence[Sequence[int]]
    sample: Callable[[], list[Sampled]] | None = None
    entailment: object = None
    k_p_true: int = 5
    seed: int = 0
    batch_size: int = 8
    params: object = None
    blocks: bool = False
    hidden: bool = False
    _sampled: list[Sampled] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.questions)

    def sampled(self) -> list[Sampled]:
        """The K sampled answers per question (drawn on the first call)."""
        if self._sampled is None:
            if self.sample is None:
                raise InputError("these methods need sampled answers; give the batch a sampler")
            self._sampled = list(self.sample())
        return self._sampled


@dataclass
class MethodOutput:
    """One method's result for one answer.

    Attributes:
        scores: score key -> value (``isouq.methods.SCORES``; NaN: not scored).
        seconds: wall seconds this answer's share of the method took.
        passes: model passes by kind (e.g. ``{"semantic_entropy": 10, "entailment_calls": 4}``).
        extra: fields beside the scores (e.g. ``semantic_clusters``).
    """

    scores: dict[str, float]
    seconds: float
    passes: dict[str, int]
    extra: dict = field(default_factory=dict)


#: method name (``isouq.methods.METHODS``) -> the function that runs it on a batch of answers
RUNNERS: dict[str, Callable[[AnswerBatch], list[MethodOutput]]] = {}


def runs(name: str):
    """Register the decorated function as how method ``name`` runs (one per method)."""
    if name not in METHODS:
        raise KeyError(f"{name!r} is not a method of isouq.methods.METHODS")

    def deco(fn):
        RUNNERS[name] = fn
        return fn

    return deco


@runs("gradient")
def gradient(batch: AnswerBatch) -> list[MethodOutput]:
    """Epistemic ‖∇θ p̄‖², aleatoric and p̄ of every non-empty answer, all from one backward
    pass per batch (``score_sequences``); an empty answer gets NaN scores and no pass."""
    from ...sequences import score_sequences

    nan = dict.fromkeys(METHODS["gradient"].writes, float("nan"))
    out = [MethodOutput(dict(nan), 0.0, {"gradient": 0}) for _ in range(len(batch))]
    scored = [i for i, ids in enumerate(batch.answer_ids) if len(ids) > 0]
    if not scored:
        return out
    t0 = time.perf_counter()
    res = score_sequences(batch.model, batch.tokenizer, [batch.prompts[i] for i in scored],
                          [batch.answer_ids[i] for i in scored], batch_size=batch.batch_size,
                          params=batch.params, blocks=batch.blocks, hidden=batch.hidden)
    share = (time.perf_counter() - t0) / len(scored)
    for j, i in enumerate(scored):
        out[i] = MethodOutput(res.row_scores(j), share, {"gradient": 1},
                              {**({"blocks": res.row_blocks(j)} if batch.blocks else {}),
                               **({"hidden": res.row_hidden(j)} if batch.hidden else {})})
    return out


@runs("naive_entropy")
def naive_entropy(batch: AnswerBatch) -> list[MethodOutput]:
    """Entropy of the K sampled answers' mean token log-probabilities (nats/token)."""
    from .baselines.naive_entropy import naive_entropy as run

    return [MethodOutput({"naive_entropy": r.value}, r.seconds, {"naive_entropy": r.passes})
            for r in run(batch.sampled())]


@runs("semantic_entropy")
def semantic_entropy(batch: AnswerBatch) -> list[MethodOutput]:
    """Entropy over the meanings of the K samples (nats), clustered by ``batch.entailment``."""
    from .baselines.semantic_entropy import semantic_entropy as run

    if batch.entailment is None:
        raise InputError("semantic entropy needs an entailment judge (--entailment-model)")
    return [MethodOutput({"semantic_entropy": r.value, "semantic_entropy_discrete": r.discrete},
                         r.seconds,
                         {"semantic_entropy": r.passes, "entailment_calls": r.entailment_calls},
                         {"semantic_clusters": r.cluster_ids})
            for r in run(list(batch.questions), batch.sampled(), batch.entailment)]


@runs("p_true")
def p_true(batch: AnswerBatch) -> list[MethodOutput]:
    """The model's probability that its answer is true, the first ``k_p_true`` samples shown."""
    from .baselines.p_true import p_true as run

    res = run(batch.model, batch.tokenizer, list(batch.questions), list(batch.answers),
              brainstormed=batch.sampled(), k=batch.k_p_true, seed=batch.seed,
              batch_size=batch.batch_size)
    return [MethodOutput({"p_true": r.value}, r.seconds, {"p_true": r.passes}) for r in res]


def run_methods(batch: AnswerBatch, names: Sequence[str], *,
                say: Callable[[str], None] | None = None) -> list[dict]:
    """Run ``names`` (registry order) on ``batch``.

    Args:
        batch: the answers.
        names: method names of ``isouq.methods.METHODS``.
        say: told each step as it starts ("samples", then each method's title).

    Returns:
        N dicts ``{"scores", "seconds", "passes", "extra"}``, each a dict merged over the
        methods (seconds and passes keyed by method).
    """
    say = say or (lambda step: None)
    rows: list[dict] = [{"scores": {}, "seconds": {}, "passes": {}, "extra": {}}
                        for _ in range(len(batch))]
    for name in check_methods(names):
        method = METHODS[name]
        if method.needs_samples and batch._sampled is None:
            say("samples")
            batch.sampled()
        say(method.title)
        for row, o in zip(rows, RUNNERS[name](batch), strict=True):
            row["scores"] |= o.scores
            row["seconds"][name] = o.seconds
            row["passes"] |= o.passes
            row["extra"] |= o.extra
    return rows


__all__ = ["RUNNERS", "AnswerBatch", "MethodOutput", "gradient", "naive_entropy", "p_true", "run_methods",
           "runs", "semantic_entropy"]
