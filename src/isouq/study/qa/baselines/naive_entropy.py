"""Naive (predictive) entropy over K sampled answers (Farquhar et al. 2024; Kuhn et al. 2023).

Monte-Carlo estimate of the answer entropy with length normalization:

    H ≈ −(1/K) Σ_k (1/T_k) Σ_t log p(y_{k,t} | y_{k,<t}, x)

as Farquhar's ``predictive_entropy(np.mean(log_lik) per sample)`` and LM-Polygraph's
``MonteCarloNormalizedSequenceEntropy`` compute it. Defaults: K = 10 samples at T = 1.0 from
``generation.sample_completions``; log-probs under the sampling distribution (Farquhar's
``compute_transition_scores(normalize_logits=True)``), or ``which="model"`` for T = 1 logits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ....errors import InputError
from ....llm.generation import Sampled


@dataclass
class NaiveEntropy:
    """Naive entropy of one question.

    value: −mean of the K length-normalized log-probs (nats per token; higher = less certain).
    mean_logprobs: (K,) the length-normalized log-probs it averages.
    passes: generation passes beyond the shared greedy answer (K).
    seconds: wall-clock of those passes plus this computation.
    """

    value: float
    mean_logprobs: list[float]
    passes: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def naive_entropy_value(mean_logprobs: Sequence[float]) -> float:
    """−(1/K) Σ_k mean_logprobs[k] for K ≥ 1 length-normalized sequence log-probs."""
    if len(mean_logprobs) == 0:
        raise InputError("naive entropy needs at least one sampled answer; got none")
    return -float(sum(mean_logprobs)) / len(mean_logprobs)


def naive_entropy(sampled: Sequence[Sampled], *, which: str = "sampling") -> list[NaiveEntropy]:
    """Naive entropy per question from its ``Sampled`` completions (N,) -> N results."""
    out = []
    for s in sampled:
        t0 = time.perf_counter()
        lps = s.mean_logprobs(which)
        value = naive_entropy_value(lps)
        out.append(NaiveEntropy(value=value, mean_logprobs=lps, passes=s.passes,
                                seconds=s.seconds + time.perf_counter() - t0))
    return out
