"""Is an answer correct? An LLM judge, lexical criteria, and their agreement (Cohen's κ).

LLM judge (Farquhar et al. 2024, ``model_based_metric``): the judge model reads
``prompts.judge_prompt`` — does the proposed answer mean the same as the expected answer (or
any of the expected answers) within the context of the question? Farquhar sample a reply at
T = 0.01 and search it for "yes"/"no"; we read the next-token distribution instead:
p_yes = m_yes / (m_yes + m_no), with m the probability mass of the tokens that start
"yes"/"Yes"/" yes"/… (likewise "no"), and correct = p_yes > 0.5. No parsing, no retries, and
the confidence is kept. Several references: Farquhar's list prompt (one pass, default) or
``multi_reference="each"``: one pass per reference, p_yes = max over references.

Lexical criteria (SQuAD normalization: lower case, no punctuation, no articles, single spaces):
exact match, containment (a reference as a whole-word span of the answer), token F1 with
correct = max F1 over references ≥ 0.5 (Farquhar's default "squad" metric, F1 ≥ 50), and for
TruthfulQA: max F1 to the correct references > max F1 to the incorrect ones.
"""

from __future__ import annotations

import re
import string
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ...errors import InputError
from ...evaluation.labels import cohen_kappa  # noqa: F401  (re-exported: judge–lexical κ)
from ...llm.generation import option_probs
from ...llm.prompts import JUDGE_STYLES, chat_or_plain, effective_judge_style, judge_prompt

# ----------------------------------------------------------------------------- lexical

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lower, drop punctuation, drop a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _check_refs(references: Sequence[str]) -> list[str]:
    if isinstance(references, str):
        raise InputError("references must be a list of strings; wrap a single one: [ref]")
    if len(references) == 0:
        raise InputError("an answer needs at least one reference to be graded")
    return list(references)


def exact_match(answer: str, references: Sequence[str]) -> bool:
    """Normalized answer equals a normalized reference."""
    a = normalize_answer(answer)
    return any(a == normalize_answer(r) for r in _check_refs(references))


def contains_answer(answer: str, references: Sequence[str]) -> bool:
    """A non-empty normalized reference occurs in the normalized answer as whole words."""
    a = f" {normalize_answer(answer)} "
    return any(r and f" {r} " in a for r in map(normalize_answer, _check_refs(references)))


def token_f1(answer: str, reference: str) -> float:
    """SQuAD token F1 in [0, 1] (both empty after normalization: 1; one empty: 0)."""
    pred, gold = normalize_answer(answer).split(), normalize_answer(reference).split()
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(gold)
    return 2 * p * r / (p + r)


def max_f1(answer: str, references: Sequence[str]) -> float:
    """Best token F1 over the references."""
    return max(token_f1(answer, r) for r in _check_refs(references))


def lexical_correct(answer: str, references: Sequence[str], *, criterion: str = "f1",
                    threshold: float = 0.5) -> bool:
    """Correct by ``criterion``: "f1" (max F1 ≥ threshold), "exact" or "contains"."""
    if criterion == "f1":
        return max_f1(answer, references) >= threshold
    if criterion == "exact":
        return exact_match(answer, references)
    if criterion == "contains":
        return contains_answer(answer, references)
    raise InputError(f"criterion={criterion!r} is not known; use 'f1', 'exact' or 'contains'")


def truthfulqa_correct(answer: str, correct: Sequence[str], incorrect: Sequence[str]) -> bool:
    """TruthfulQA lexical label: closer (max F1) to a correct than to any incorrect reference."""
    return max_f1(answer, correct) > max_f1(answer, incorrect)


# ----------------------------------------------------------------------------- LLM judge

YES_NO = {
    "yes": [" yes", "yes", " Yes", "Yes", " YES", "YES"],
    "no": [" no", "no", " No", "No", " NO", "NO"],
}


@dataclass
class JudgeResult:
    """The judge's verdict on one answer.

    correct: p_yes > threshold. p_yes: m_yes / (m_yes + m_no) in [0, 1].
    mass: m_yes + m_no, the share of the next-token distribution on yes/no (low = the judge
    wanted to say something else). seconds: this answer's share of the judging time.
    rule: set when no model was asked: "empty answer" (an answer with no text is incorrect;
    small judges say yes to it), with p_yes = mass = 0.
    """

    correct: bool
    p_yes: float
    mass: float
    judge: str
    seconds: float
    prompt: str = "farquhar2024"
    rule: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class LLMJudge:
    """Correctness judge: a causal LM asked Farquhar's yes/no question.

    name: recorded with every verdict (default: the model's ``name_or_path``).
    multi_reference: "list" (Farquhar: all references in one prompt) or "each" (max over one
    prompt per reference). chat: None = use the judge tokenizer's chat template if it has one.
    """

    def __init__(self, model, tokenizer, *, name: str | None = None,
                 multi_reference: str = "list", chat: bool | None = None, batch_size: int = 8,
                 threshold: float = 0.5, prompt: str = "farquhar2024"):
        if multi_reference not in ("list", "each"):
            raise InputError(f"multi_reference={multi_reference!r}; use 'list' or 'each'")
        if prompt not in JUDGE_STYLES:
            raise InputError(f"judge prompt {prompt!r} is not known; use one of {JUDGE_STYLES}")
        self.prompt = prompt
        self.model, self.tokenizer = model, tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or "llm-judge"
        self.multi_reference, self.chat = multi_reference, chat
        self.batch_size, self.threshold = batch_size, threshold

    def config(self) -> dict:
        """What to record next to the labels."""
        return {"judge": self.name, "prompt": self.prompt, "multi_reference":
                self.multi_reference, "chat": self.chat, "threshold": self.threshold,
                "readout": "next-token p(yes)/(p(yes)+p(no))"}

    def prompts(self, question: str, answer: str, references: Sequence[str],
                incorrect: Sequence[str] = ()) -> list[str]:
        """The prompt(s) sent for one answer, as the judge model sees them. ``incorrect``:
        known incorrect answers, shown by the "contrast" prompt only."""
        refs = _check_refs(references)
        groups = [refs] if self.multi_reference == "list" else [[r] for r in refs]
        return [chat_or_plain(self.tokenizer,
                              judge_prompt(question, answer, g, self.prompt, incorrect),
                              chat=self.chat) for g in groups]

    def judge(self, questions: Sequence[str], answers: Sequence[str],
              references: Sequence[Sequence[str]],
              incorrect: Sequence[Sequence[str]] | None = None) -> list[JudgeResult]:
        """Verdicts for N (question, answer, references) triples, batched; ``incorrect``: N
        lists of known incorrect answers (TruthfulQA), used by the "contrast" prompt."""
        wrong = [()] * len(questions) if incorrect is None else list(incorrect)
        if not len(questions) == len(answers) == len(references) == len(wrong):
            raise InputError(f"got {len(questions)} questions, {len(answers)} answers, "
                             f"{len(references)} reference lists and {len(wrong)} incorrect-"
                             "answer lists; give one of each per item")
        per = [self.prompts(q, a, r, w) if a.strip() else []  # empty: no question to ask
               for q, a, r, w in zip(questions, answers, references, wrong, strict=True)]
        flat = [p for ps in per for p in ps]
        t0 = time.perf_counter()
        mass = (option_probs(self.model, self.tokenizer, flat, YES_NO, batch_size=self.batch_size)
                if flat else None)
        share = (time.perf_counter() - t0) / max(len(flat), 1)
        out, at = [], 0
        for ps, w in zip(per, wrong, strict=True):
            style = effective_judge_style(self.prompt, w)
            if not ps:
                out.append(JudgeResult(correct=False, p_yes=0.0, mass=0.0, judge=self.name,
                                       seconds=0.0, prompt=style, rule="empty answer"))
                continue
            best = None
            for m_yes, m_no in mass[at : at + len(ps)].tolist():
                tot = m_yes + m_no
                p = m_yes / tot if tot > 0 else 0.0
                if best is None or p > best[0]:
                    best = (p, tot)
            at += len(ps)
            out.append(JudgeResult(correct=best[0] > self.threshold, p_yes=best[0], mass=best[1],
                                   judge=self.name, seconds=share * len(ps), prompt=style))
        return out
