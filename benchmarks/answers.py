"""The answer set several benchmarks score: TruthfulQA questions in the study's QA prompt, each
answered with its first reference answer (short, fixed, no generation needed)."""

from __future__ import annotations


def truthfulqa_answers(tokenizer, n: int) -> tuple[list, list[str]]:
    """(prompts, answers) of the first ``n`` TruthfulQA questions (the shipped file)."""
    from isouq.data.qa import load_dataset
    from isouq.llm.prompts import qa_prompts

    items = load_dataset("truthfulqa", limit=n)
    return qa_prompts(tokenizer, [it.question for it in items]), [" " + it.answers[0]
                                                                  for it in items]
