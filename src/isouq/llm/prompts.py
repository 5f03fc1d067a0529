"""Every prompt the QA pipeline sends to a model, in one place, with where it comes from.

All builders return the exact prompt *string*; models see ``encode_prompt(tokenizer, prompt)``
(``isouq.tokens.text_ids``: BOS exactly once).
Scoring code re-tokenizes ``prompt + answer`` later, so keep the string, not only the ids.

Sources (Farquhar et al. 2024, github.com/jlko/semantic_uncertainty, file in brackets):
- brief instruction ``BRIEF_PROMPT`` and the ``Question: …\\nAnswer:`` format [utils/utils.py];
- stop sequences ``\\n``, ``Question:``, ``Context:`` plus EOS [models/base_model.py];
- the P(True) meta-prompt [uncertainty_measures/p_true.py, ``calculate_p_true``];
- the correctness-judge prompt [utils/utils.py, ``model_based_metric``];
- the LLM-entailment prompt [uncertainty_measures/semantic_entropy.py, ``EntailmentLlama``].

Chat models: when the tokenizer has a chat template (and ``chat`` is not False) the text goes
into one user turn and the template's generation prompt is added; the few prompts that end in a
cue the model should continue ("The possible answer is:") keep that cue as a prefill of the
assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..choices import JUDGE_STYLES  # the prompt styles, named once (torch-free)
from ..errors import InputError
from ..models.info import has_chat_template
from ..tokens import text_ids as encode_prompt  # noqa: F401 - how models see a prompt

BRIEF_PROMPT = "Answer the following question as briefly as possible.\n"
"""Farquhar et al.'s default brief instruction (``BRIEF_PROMPTS['default']``)."""

DEFAULT_STOP: tuple[str, ...] = ("\n", "Question:", "Context:")
"""Stop strings (Farquhar's STOP_SEQUENCES; the multi-newline ones are covered by ``\\n``)."""

P_TRUE_CUE = "The possible answer is:"
JUDGE_CUE = "Response:"


def _use_chat(tokenizer, chat: bool | None) -> bool:
    return has_chat_template(tokenizer) if chat is None else bool(chat)


def wrap_chat(tokenizer, user_content: str, *, prefill: str = "") -> str:
    """One user turn through the chat template + generation prompt, then ``prefill`` verbatim."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_content}], tokenize=False, add_generation_prompt=True
    )
    return text + prefill


def qa_prompt(
    tokenizer,
    question: str,
    *,
    examples: Sequence[tuple[str, str]] = (),
    brief: str = BRIEF_PROMPT,
    chat: bool | None = None,
) -> str:
    """The prompt that asks ``question`` (Farquhar's format, brief instruction once at the top).

    Plain:  ``{brief}[Question: {q_i}\\nAnswer: {a_i}\\n\\n ...]Question: {question}\\nAnswer:``
    Chat (template present, ``chat`` None/True): the same text without the trailing
    ``\\nAnswer:`` as one user turn, followed by the template's generation prompt.
    ``examples`` are optional few-shot (question, answer) pairs (Farquhar uses 5; default none).
    """
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in examples)
    if _use_chat(tokenizer, chat):
        return wrap_chat(tokenizer, f"{brief}{shots}Question: {question}")
    return f"{brief}{shots}Question: {question}\nAnswer:"


def qa_prompts(tokenizer, questions: Sequence[str], **kw) -> list[str]:
    """``qa_prompt`` for each question; keyword arguments as there."""
    return [qa_prompt(tokenizer, q, **kw) for q in questions]


def p_true_prompt(
    tokenizer,
    question: str,
    answer: str,
    brainstormed: Sequence[str],
    *,
    few_shot_prefix: str = "",
    chat: bool | None = None,
) -> str:
    """Farquhar's P(True) meta-prompt for ``answer`` (the graded answer) to ``question``.

    ``Question: {q}\\nBrainstormed Answers: {b_1}\\n…{b_K}\\n{answer}\\nPossible answer: {answer}\\n
    Is the possible answer:\\nA) True\\nB) False\\nThe possible answer is:`` — as in Farquhar's
    ``calculate_p_true`` the graded answer is appended to the brainstormed list. The model's
    next token is read (" A" = True). ``few_shot_prefix``: optional solved examples in the same
    format (Farquhar builds 20 from training questions; default none), joined by a newline.
    Chat: everything before the cue is the user turn and the cue is prefilled.
    """
    lines = "".join(f"{b.strip()}\n" for b in [*brainstormed, answer])
    body = (
        f"Question: {question}\nBrainstormed Answers: {lines}"
        f"Possible answer: {answer}\nIs the possible answer:\nA) True\nB) False\n"
    )
    prefix = few_shot_prefix + "\n" if few_shot_prefix else ""
    if _use_chat(tokenizer, chat):
        return wrap_chat(tokenizer, prefix + body.rstrip("\n"), prefill=P_TRUE_CUE)
    return prefix + body + P_TRUE_CUE


#: Judge prompt styles: Farquhar et al.'s; the same with explicit rules for small judges; and
#: strict plus the dataset's known incorrect answers (TruthfulQA), when the item has them.
STRICT_RULES = (
    "Say yes only if the proposed answer itself states one of the expected answers or an exact "
    "equivalent of it. Say no if it names something else, offers several options, only repeats "
    "the question, or gives no answer. "
)


def effective_judge_style(style: str, incorrect: Sequence[str] = ()) -> str:
    """The style a prompt really has: "contrast" without incorrect answers is "strict"."""
    return "strict" if style == "contrast" and not list(incorrect) else style


def judge_prompt(question: str, answer: str, references: Sequence[str],
                 style: str = "farquhar2024", incorrect: Sequence[str] = ()) -> str:
    """Farquhar's correctness prompt (``model_based_metric``); the model answers yes or no.

    One reference: "The expected answer is: {r}." / "...mean the same as the expected answer?"
    Several: "The following are expected answers to this question: {list}." / "...as any of the
    expected answers?" (the list printed as Python prints a list, as in their code).
    style "strict" adds :data:`STRICT_RULES` before the yes/no instruction: small judges
    (1.5B) say yes to answers that merely restate the question under Farquhar's prompt.
    style "contrast" is strict plus, when ``incorrect`` is non-empty, the list of known incorrect
    answers and the rule to say no to an answer that agrees with one (TruthfulQA's false beliefs:
    small judges accept "you pay with euros" against "euros and francs"). Without incorrect
    answers it is exactly strict.
    """
    if style not in JUDGE_STYLES:
        raise InputError(f"judge prompt style {style!r} is not known; use one of {JUDGE_STYLES}")
    refs = list(references)
    p = f"We are assessing the quality of answers to the following question: {question}\n"
    if len(refs) == 1:
        p += f"The expected answer is: {refs[0]}.\n"
    else:
        p += f"The following are expected answers to this question: {refs}.\n"
    wrong = list(incorrect) if style == "contrast" else []
    if wrong:
        p += f"The following are known incorrect answers to this question: {wrong}.\n"
    p += f"The proposed answer is: {answer}\n"
    if len(refs) == 1:
        p += "Within the context of the question, does the proposed answer mean the same as the "
        p += "expected answer?"
    else:
        p += "Within the context of the question, does the proposed answer mean the same as any "
        p += "of the expected answers?"
    if style in ("strict", "contrast"):
        p += " " + STRICT_RULES.strip()
    if wrong:
        p += " Say no if it agrees with any of the known incorrect answers."
    return p + f" Respond only with yes or no.\n{JUDGE_CUE}"


def entailment_prompt(question: str, answer_1: str, answer_2: str) -> str:
    """Farquhar's LLM-entailment prompt (``EntailmentLlama``): does answer 1 entail answer 2?"""
    return (
        f'We are evaluating answers to the question "{question}"\n'
        "Here are two possible answers:\n"
        f"Possible Answer 1: {answer_1}\nPossible Answer 2: {answer_2}\n"
        "Does Possible Answer 1 semantically entail Possible Answer 2? "
        f"Respond only with entailment, contradiction, or neutral.\n{JUDGE_CUE}"
    )


def chat_or_plain(tokenizer, prompt: str, *, cue: str = JUDGE_CUE, chat: bool | None = None) -> str:
    """A completion prompt ending in ``cue`` as sent: unchanged, or (chat) the text before the
    cue as a user turn. Used for the judge and the entailment prompts, whose chat replies start
    with the answer word itself."""
    if not _use_chat(tokenizer, chat):
        return prompt
    body = prompt[: -len(cue)] if cue and prompt.endswith(cue) else prompt
    return wrap_chat(tokenizer, body.rstrip("\n"))
