"""Hand labels for QA rows: a person reads each answer beside its references and says whether it
is correct; the verdicts become gold rows (:mod:`isouq.evaluation.labels`) that ``isouq report``
sets against the judge's and the lexical labels.

``isouq qa label ROWS --out GOLD [--sample N --seed S]``: one question at a time, answers
``y`` / ``n`` (optionally followed by a note), ``s`` to skip, ``q`` to stop. Every verdict is
appended at once (crash-safe); a re-run continues with the answers not yet labelled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...errors import InputError
from ...runio import JsonlWriter

PROMPT = "correct? [y/n, then an optional note; s skip; q quit] "
SHOWN_REFERENCES = 6


def sample_rows(rows: Sequence[Mapping], n: int | None, seed: int = 7) -> list[Mapping]:
    """``n`` rows drawn without replacement (``random.seed(seed)``; ``random.sample`` of the
    indices, kept in file order), or all rows when ``n`` is None or ≥ len(rows)."""
    if n is None or n >= len(rows):
        return list(rows)
    if n < 1:
        raise InputError(f"--sample {n}: give a positive number of rows")
    random.seed(seed)
    return [rows[i] for i in sorted(random.sample(range(len(rows)), n))]


def parse_verdict(text: str) -> tuple[str, str]:
    """(verdict, note) from a reply: verdict "y", "n", "s" or "q"; "" when not understood."""
    head, _, note = text.strip().partition(" ")
    v = head.lower()
    v = {"yes": "y", "no": "n", "skip": "s", "quit": "q"}.get(v, v)
    return (v, note.strip()) if v in ("y", "n", "s", "q") else ("", "")


def describe(row: Mapping, incorrect: Sequence[str] = ()) -> str:
    """What the labeller sees: question, answer, correct (and incorrect) references."""
    refs = list(row.get("references") or [])
    more = f" (+{len(refs) - SHOWN_REFERENCES} more)" if len(refs) > SHOWN_REFERENCES else ""
    lines = [f"Q: {row['question']}", f"A: {row['answer']}",
             f"  correct:   {' | '.join(refs[:SHOWN_REFERENCES])}{more}"]
    if incorrect:
        lines.append(f"  incorrect: {' | '.join(list(incorrect)[:SHOWN_REFERENCES])}")
    return "\n".join(lines)


def known_incorrect(rows: Sequence[Mapping], data: str | None = None) -> dict[str, list[str]]:
    """Question key -> the dataset's known incorrect answers (TruthfulQA's), for the datasets of
    ``rows`` that can be loaded (``data``: a local file for them); shown beside an answer."""
    from ...data.qa import load_dataset
    from ...errors import IsouqError

    wrong: dict[str, list[str]] = {}
    for ds in dict.fromkeys(str(r["dataset"]) for r in rows):
        try:
            items = load_dataset(ds, path=data, limit=None)
        except IsouqError:
            continue
        wrong |= {it.key: it.incorrect_answers for it in items}
    return wrong


def label_file(rows_path: str | Path, out: str | Path, *, labeler: str, sample: int | None = None,
               seed: int = 7, data: str | None = None) -> int:
    """``isouq qa label``: ask about (a seeded sample of) the newest rows of a QA rows file,
    with each question's known incorrect answers shown; returns the verdicts written."""
    from ...runio import latest_by_key, read_jsonl

    rows = latest_by_key(read_jsonl(rows_path, missing_ok=False))
    if not rows:
        raise InputError(f"{rows_path} has no rows; run `isouq qa run` first")
    wrong = known_incorrect(rows, data)
    return label_rows(sample_rows(rows, sample, seed), out, labeler=labeler,
                      incorrect_of=lambda r: wrong.get(str(r["key"]), []))


def label_rows(
    rows: Sequence[Mapping],
    out: str | Path,
    *,
    labeler: str,
    ask: Callable[[str], str] = input,
    show: Callable[[str], None] = print,
    incorrect_of: Callable[[Mapping], Sequence[str]] | None = None,
) -> int:
    """Ask about every row not yet in ``out``; append one gold row per y/n verdict.

    rows: QA rows (key, dataset, model, question, answer, references). Returns the number of
    verdicts written this time. Stops at "q" or at the end of input (EOF), keeping all written.
    """
    writer = JsonlWriter(out)
    todo = [r for r in rows if not writer.done(r["key"])]
    written = 0
    for n, row in enumerate(todo, 1):
        wrong = list(incorrect_of(row)) if incorrect_of else []
        show(f"\n[{len(rows) - len(todo) + n}/{len(rows)}] {row['dataset']} × {row['model']} "
             f"({row['key']})\n{describe(row, wrong)}")
        while True:
            try:
                verdict, note = parse_verdict(ask(PROMPT))
            except EOFError:
                return written
            if verdict:
                break
            show("answer y or n (a note may follow), s to skip, q to quit")
        if verdict == "q":
            break
        if verdict == "s":
            continue
        writer.write({"key": row["key"], "dataset": row["dataset"], "model": row["model"],
                      "question": row["question"], "answer": row["answer"],
                      "references": list(row.get("references") or []),
                      "incorrect_references": wrong, "gold_correct": verdict == "y",
                      "note": note, "labeler": labeler, "labelled": time.strftime("%Y-%m-%d")})
        written += 1
    return written
