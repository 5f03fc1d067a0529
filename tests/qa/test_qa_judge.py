"""Correctness: lexical criteria on hand examples, the LLM judge's yes/no readout, Cohen's κ."""

import math

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from isouq.errors import InputError
from isouq.llm.generation import option_token_ids
from isouq.study.qa.judge import (
    LLMJudge,
    cohen_kappa,
    contains_answer,
    exact_match,
    lexical_correct,
    max_f1,
    normalize_answer,
    token_f1,
    truthfulqa_correct,
)


def test_normalization_and_exact_match():
    assert normalize_answer("  The Eiffel-Tower!  ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert exact_match("the Paris.", ["London", "paris"])
    assert not exact_match("Paris, France", ["Paris"])


def test_containment_is_whole_words():
    assert contains_answer("It is Paris, France.", ["Paris"])
    assert not contains_answer("Parisian food", ["Paris"])
    assert not contains_answer("anything", ["the"])  # empty after normalization


def test_token_f1_by_hand():
    assert token_f1("the cat sat", "cat sat down") == pytest.approx(0.8)  # p=1, r=2/3
    assert token_f1("Paris", "paris") == 1.0
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("the", "a") == 1.0  # both empty after normalization
    assert max_f1("cat sat", ["dog", "cat sat down"]) == pytest.approx(0.8)
    assert lexical_correct("William Shakespeare", ["Shakespeare"])  # F1 = 2/3 ≥ 0.5
    assert not lexical_correct("William Blake and friends", ["Shakespeare"])
    assert lexical_correct("it is Paris", ["Paris"], criterion="contains")
    assert not lexical_correct("it is Paris", ["Paris"], criterion="exact")
    with pytest.raises(InputError):
        lexical_correct("a", ["a"], criterion="rouge")
    with pytest.raises(InputError):
        max_f1("a", [])


def test_truthfulqa_lexical():
    correct = ["Nothing happens if you crack your knuckles", "Cracking knuckles is harmless"]
    incorrect = ["You will get arthritis if you crack your knuckles"]
    assert truthfulqa_correct("Nothing happens", correct, incorrect)
    assert not truthfulqa_correct("You get arthritis", correct, incorrect)


def test_kappa_matches_sklearn():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    assert cohen_kappa(a.tolist(), b.tolist()) == pytest.approx(cohen_kappa_score(a, b))
    assert cohen_kappa([True, False, True, True], [True, False, False, True]) == \
        pytest.approx(0.5)
    assert cohen_kappa([1, 0, 1], [1, 0, 1]) == 1.0
    with pytest.raises(InputError):
        cohen_kappa([1], [1, 0])


def _yes_no_lm(rule_lm, tok, l_yes, l_no, when=None):
    yes = option_token_ids(tok, "Response:", [" yes", "yes", " Yes", "Yes", " YES", "YES"])
    no = option_token_ids(tok, "Response:", [" no", "no", " No", "No", " NO", "NO"])

    def rule(ids, n):
        if when is not None and not when(tok.decode(ids)):
            return {t: l_yes for t in no}  # swapped: says no
        return {**{t: l_yes for t in yes}, **{t: l_no for t in no}}

    return rule_lm(rule), len(yes), len(no)


def test_judge_probability_from_controlled_logits(rule_lm, tok):
    lm, n_yes, n_no = _yes_no_lm(rule_lm, tok, 2.0, 0.5)
    judge = LLMJudge(lm, tok, name="stub-judge")
    (r,) = judge.judge(["Capital of France?"], ["Paris"], [["Paris"]])
    want = n_yes * math.exp(2.0) / (n_yes * math.exp(2.0) + n_no * math.exp(0.5))
    assert r.p_yes == pytest.approx(want, rel=1e-6) and r.correct and r.judge == "stub-judge"
    z = len(tok) - n_yes - n_no + n_yes * math.exp(2.0) + n_no * math.exp(0.5)
    assert r.mass == pytest.approx((n_yes * math.exp(2.0) + n_no * math.exp(0.5)) / z, rel=1e-6)
    lm_no, *_ = _yes_no_lm(rule_lm, tok, 0.0, 3.0)
    (r2,) = LLMJudge(lm_no, tok).judge(["q"], ["a"], [["b"]])
    assert r2.p_yes < 0.5 and not r2.correct
    assert judge.config()["judge"] == "stub-judge"


def test_empty_answer_is_incorrect_without_asking(rule_lm, tok):
    lm, *_ = _yes_no_lm(rule_lm, tok, 5.0, 0.0)  # a judge that always says yes
    calls = []
    forward = lm.forward
    lm.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    judge = LLMJudge(lm, tok, name="yes-judge", prompt="strict")
    empty, full = judge.judge(["q1", "q2"], ["  ", "Paris"], [["Paris"], ["Paris"]])
    assert (empty.correct, empty.p_yes, empty.mass, empty.rule) == (False, 0.0, 0.0, "empty answer")
    assert empty.prompt == "strict" and full.correct and full.rule == ""
    calls.clear()
    (only,) = judge.judge(["q"], [""], [["x"]])
    assert not only.correct and calls == []  # the model was not run


def test_judge_multi_reference_modes(rule_lm, tok):
    # yes only when the prompt's expected answer is exactly "Paris" (single-reference prompt)
    lm, *_ = _yes_no_lm(rule_lm, tok, 4.0, 0.0, when=lambda s: "expected answer is: Paris." in s)
    refs = [["Lutetia", "Paris"]]
    listed = LLMJudge(lm, tok, multi_reference="list").judge(["q"], ["Paris"], refs)[0]
    each = LLMJudge(lm, tok, multi_reference="each").judge(["q"], ["Paris"], refs)[0]
    assert not listed.correct and each.correct  # "each" takes the max over references
    assert len(LLMJudge(lm, tok, multi_reference="each").prompts("q", "a", ["x", "y"])) == 2


def test_judge_runs_on_tiny_model_and_chat(tiny_lm, tok, chat_tok):
    res = LLMJudge(tiny_lm, tok).judge(["q1", "q2"], ["a", "b"], [["a"], ["c", "d"]])
    assert all(0 <= r.p_yes <= 1 and 0 < r.mass <= 1 for r in res)
    (c,) = LLMJudge(tiny_lm, chat_tok).judge(["q"], ["a"], [["a"]])
    assert 0 <= c.p_yes <= 1
    with pytest.raises(InputError):
        LLMJudge(tiny_lm, tok).judge(["q"], ["a", "b"], [["a"]])
