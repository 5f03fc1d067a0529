"""Prompt strings: exact formats (Farquhar et al. 2024) and BOS handling."""

import pytest

from isouq.errors import InputError
from isouq.llm import prompts as P


def test_plain_qa_prompt_is_farquhar_format(tok):
    assert P.qa_prompt(tok, "Who wrote Hamlet?") == (
        "Answer the following question as briefly as possible.\n"
        "Question: Who wrote Hamlet?\nAnswer:"
    )
    shot = P.qa_prompt(tok, "Q2?", examples=[("Q1?", "A1")])
    assert shot == P.BRIEF_PROMPT + "Question: Q1?\nAnswer: A1\n\nQuestion: Q2?\nAnswer:"


def test_chat_qa_prompt_uses_template_and_one_bos(chat_tok):
    p = P.qa_prompt(chat_tok, "Who wrote Hamlet?")
    assert p == (
        "<s><|user|>\nAnswer the following question as briefly as possible.\n"
        "Question: Who wrote Hamlet?<|end|>\n<|assistant|>\n"
    )
    ids = P.encode_prompt(chat_tok, p)
    assert ids.count(chat_tok.bos_token_id) == 1 and ids[0] == chat_tok.bos_token_id
    assert P.qa_prompt(chat_tok, "x", chat=False).endswith("Question: x\nAnswer:")


def test_plain_prompt_gets_bos_from_tokenizer(tok):
    ids = P.encode_prompt(tok, "Question: x")
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1


def test_p_true_prompt_format(tok, chat_tok):
    p = P.p_true_prompt(tok, "Capital of France?", "Paris", [" Paris ", "Lyon"])
    assert p == (
        "Question: Capital of France?\nBrainstormed Answers: Paris\nLyon\nParis\n"
        "Possible answer: Paris\nIs the possible answer:\nA) True\nB) False\n"
        "The possible answer is:"
    )
    c = P.p_true_prompt(chat_tok, "Capital of France?", "Paris", ["Lyon"])
    assert c.startswith("<s><|user|>\nQuestion: Capital of France?")
    assert c.endswith("B) False<|end|>\n<|assistant|>\nThe possible answer is:")
    f = P.p_true_prompt(tok, "q", "a", ["b"], few_shot_prefix="EXAMPLE")
    assert f.startswith("EXAMPLE\nQuestion: q\n")


def test_judge_prompt_single_and_multi():
    one = P.judge_prompt("Capital of France?", "Paris", ["Paris"])
    assert one == (
        "We are assessing the quality of answers to the following question: Capital of France?\n"
        "The expected answer is: Paris.\nThe proposed answer is: Paris\n"
        "Within the context of the question, does the proposed answer mean the same as the "
        "expected answer? Respond only with yes or no.\nResponse:"
    )
    many = P.judge_prompt("q", "a", ["x", "y"])
    assert "The following are expected answers to this question: ['x', 'y'].\n" in many
    assert "mean the same as any of the expected answers? Respond only with yes or no." in many
    strict = P.judge_prompt("Capital of France?", "Paris", ["Paris"], style="strict")
    assert strict == one.replace(" Respond only", " " + P.STRICT_RULES.strip() + " Respond only")
    assert "only repeats the question" in strict
    wrong = P.judge_prompt("Capital of France?", "Lyon", ["Paris"], "contrast", ["Lyon", "Nice"])
    assert wrong == strict.replace("The proposed answer is: Paris\n",
        "The following are known incorrect answers to this question: ['Lyon', 'Nice'].\n"
        "The proposed answer is: Lyon\n").replace(
        " Respond only", " Say no if it agrees with any of the known incorrect answers. Respond only")
    # contrast without incorrect answers is strict, and is recorded as such
    assert P.judge_prompt("Capital of France?", "Paris", ["Paris"], "contrast") == strict
    assert P.effective_judge_style("contrast", []) == "strict"
    assert P.effective_judge_style("contrast", ["x"]) == "contrast"
    assert P.effective_judge_style("farquhar2024", ["x"]) == "farquhar2024"
    with pytest.raises(InputError, match="style 'lenient' is not known"):
        P.judge_prompt("q", "a", ["x"], style="lenient")


def test_entailment_prompt_and_chat_wrap(chat_tok, tok):
    e = P.entailment_prompt("q?", "a1", "a2")
    assert e.startswith('We are evaluating answers to the question "q?"\n')
    assert "Possible Answer 1: a1\nPossible Answer 2: a2\n" in e
    assert e.endswith("Respond only with entailment, contradiction, or neutral.\nResponse:")
    assert P.chat_or_plain(tok, e) == e
    wrapped = P.chat_or_plain(chat_tok, e)
    assert "Response:" not in wrapped and wrapped.endswith("<|assistant|>\n")
