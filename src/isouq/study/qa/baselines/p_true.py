"""P(True): the model grades its own answer (Kadavath et al. 2022, as Farquhar et al. 2024 run it).

The meta-prompt (``prompts.p_true_prompt``) lists K = 5 brainstormed answers plus the graded
answer, then asks "Is the possible answer:\\nA) True\\nB) False\\nThe possible answer is:". One
forward pass reads the next-token distribution.

Reading the answer (our choice, documented): P(True) = m_A / (m_A + m_B), where m_A is the
probability mass of the tokens that start " A" or "A" and m_B likewise for B. Farquhar et al.
report log p(" A") alone (and use 1 − p as uncertainty); normalizing against the False option
removes the mass the model puts on other tokens, which varies with the prompt and the model,
and keeps the score a probability of True between the two offered options. The raw m_A and m_B
are returned too, so Farquhar's number is p_a.

Brainstormed answers: the first K of the shared samples (``generation.Sampled``, T = 1.0) when
given, as Farquhar reuse their high-temperature samples; otherwise K are sampled here. Zero-shot
by default; ``few_shot_prefix`` takes solved examples in the same format (Farquhar use 20).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ....errors import InputError
from ....llm.generation import Sampled, option_probs, sample_completions
from ....llm.prompts import p_true_prompt, qa_prompts

OPTIONS = {"A": [" A", "A"], "B": [" B", "B"]}


@dataclass
class PTrue:
    """P(True) of one answer.

    value: m_A / (m_A + m_B) in [0, 1] (higher = more confident the answer is true).
    p_a, p_b: raw next-token probability mass on "A" and on "B".
    brainstormed: (K,) the brainstormed answers shown to the model.
    passes: K brainstorm generations + 1 forward pass; seconds: their wall-clock.
    """

    value: float
    p_a: float
    p_b: float
    brainstormed: list[str]
    passes: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def p_true(
    model,
    tokenizer,
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    brainstormed: Sequence[Sampled] | None = None,
    k: int = 5,
    prompts: Sequence[str] | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 50,
    few_shot_prefix: str = "",
    chat: bool | None = None,
    batch_size: int = 8,
    sample_batch_size: int = 32,
) -> list[PTrue]:
    """P(True) for each (question, answer) pair: N questions, N graded answers -> N results.

    brainstormed: N ``Sampled`` to take the first ``k`` completions from (reuse); when None,
    ``k`` completions are sampled from ``prompts`` (default ``qa_prompts(tokenizer, questions)``)
    at ``temperature`` with ``seed``. ``chat``: None = use the chat template when there is one.
    """
    n = len(questions)
    if len(answers) != n:
        raise InputError(f"{n} questions but {len(answers)} answers; give one answer each")
    if k < 1:
        raise InputError(f"k={k} must be ≥ 1")
    if brainstormed is None:
        prompts = qa_prompts(tokenizer, questions) if prompts is None else prompts
        if len(prompts) != n:
            raise InputError(f"{len(prompts)} prompts for {n} questions")
        brainstormed = sample_completions(model, tokenizer, prompts, k=k, temperature=temperature,
                                          max_new_tokens=max_new_tokens, seed=seed,
                                          batch_size=sample_batch_size)
    if len(brainstormed) != n:
        raise InputError(f"{len(brainstormed)} sample sets for {n} questions")
    short = [s for s in brainstormed if s.k < k]
    if short:
        raise InputError(f"P(True) needs {k} brainstormed answers; a sample set has {short[0].k}")
    ideas = [[c.text for c in s.completions[:k]] for s in brainstormed]
    gen_s = [sum(c.seconds for c in s.completions[:k]) for s in brainstormed]
    t0 = time.perf_counter()
    read = p_true_given(model, tokenizer, questions, answers, ideas,
                        few_shot_prefix=few_shot_prefix, chat=chat, batch_size=batch_size)
    share = (time.perf_counter() - t0) / max(n, 1)
    return [PTrue(value=v, p_a=pa, p_b=pb, brainstormed=ideas[i], passes=k + 1,
                  seconds=gen_s[i] + share) for i, (v, pa, pb) in enumerate(read)]


def p_true_given(
    model,
    tokenizer,
    questions: Sequence[str],
    answers: Sequence[str],
    ideas: Sequence[Sequence[str]],
    *,
    few_shot_prefix: str = "",
    chat: bool | None = None,
    batch_size: int = 8,
) -> list[tuple[float, float, float]]:
    """P(True) of each answer with the brainstormed answers given as text (no sampling): one
    forward pass per meta-prompt. ideas: N lists of brainstormed answers (any length; the graded
    answer is appended by ``p_true_prompt``). Returns N tuples (value, p_a, p_b) as in
    :class:`PTrue`. Used by the multiple-choice study, whose brainstormed answers are the other
    options."""
    if not len(questions) == len(answers) == len(ideas):
        raise InputError(f"{len(questions)} questions, {len(answers)} answers, {len(ideas)} "
                         "brainstormed lists; give one of each per question")
    meta = [p_true_prompt(tokenizer, q, a, b, few_shot_prefix=few_shot_prefix, chat=chat)
            for q, a, b in zip(questions, answers, ideas, strict=True)]
    mass = option_probs(model, tokenizer, meta, OPTIONS, batch_size=batch_size)
    out = []
    for i in range(len(meta)):
        pa, pb = float(mass[i, 0]), float(mass[i, 1])
        out.append((pa / (pa + pb) if pa + pb > 0 else 0.5, pa, pb))
    return out
