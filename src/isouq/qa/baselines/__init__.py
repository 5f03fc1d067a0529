"""The QA study's sampling-based baselines (naive entropy, semantic entropy, P(True)) and the one
rule for their settings, shared by ``isouq qa run`` and ``isouq ask --baselines``."""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import InputError

ENTROPIES = ("naive_entropy", "semantic_entropy")


def check_sampling(methods: Iterable[str], *, k: int, k_p_true: int, temperature: float) -> None:
    """InputError when the baselines in ``methods`` cannot run with these settings.

    Args:
        methods: method names; only the sampling baselines among them are checked.
        k: answers sampled per question (shared by the baselines); the entropies need ≥ 2.
        k_p_true: sampled answers P(True) shows as brainstormed (0 ≤ k_p_true ≤ k; 0: none).
        temperature: sampling temperature, > 0.
    """
    methods = set(methods)
    if k < 2 and methods & set(ENTROPIES):
        raise InputError(f"k={k}: the entropies need at least 2 sampled answers (Farquhar: 10)")
    if "p_true" in methods and not 0 <= k_p_true <= k:
        raise InputError(f"k_p_true={k_p_true}: P(True) shows 0..k={k} of the sampled answers")
    if methods & {*ENTROPIES, "p_true"} and not temperature > 0:
        raise InputError(f"temperature={temperature}: sampling needs a temperature > 0")
