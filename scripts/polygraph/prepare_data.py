"""Local LM-Polygraph datasets from the shipped TriviaQA and TruthfulQA and isouq's exact-label
tasks (no network).

    python scripts/polygraph/prepare_data.py --dataset triviaqa --style chat --limit 500 \
        --chunk 125 --out .cache/polygraph_data

Questions come from ``isouq.data.qa.load_dataset`` (the shipped copies under shared/data;
``--limit N --seed S``: isouq's nested, seeded subsets; ``--after M``: the seeded subset of N
less the one of M, i.e. the seeded questions M+1 to N, which a run of ``--limit M`` never
saw: the fresh questions of a pre-registered check, ``configs/preregistration/``). Each
question becomes
``input``: isouq's QA prompt text (Farquhar et al.'s brief instruction, ``Question: ...``; for
``--style plain`` followed by ``\\nAnswer:``; for ``--style chat`` LM-Polygraph's ``instruct``
mode puts it in one user turn of the chat template, as ``isouq qa run`` does) and ``output``:
the list of correct references (TriviaQA: the aliases; TruthfulQA: the best and the other
correct answers; a task of ``isouq.data.tasks``: its accepted answers), for LM-Polygraph's
multi-reference metrics.

The tasks (``compare``, ``units``, ``truthfulqa-mc1``) take the same options: a generated task's
``--limit N`` is the first N items of its stream for ``--seed`` (the design set: ``--limit
500``), and ``--after M`` leaves out the first M, which never share a problem with the others
(fresh: ``--limit 1500 --after 500``); ``truthfulqa-mc1`` picks TruthfulQA's seeded questions
(the design set: the same 500 questions as ``--dataset truthfulqa --limit 500``; fresh: the
other 317).

Written: ``OUT/NAME.csv`` (key, question, input, output as a JSON list) and, per chunk of
``--chunk`` questions, ``OUT/NAME/chunk-KKK/`` as a Hugging Face ``datasets`` folder that
``polygraph_eval`` reads with ``load_from_disk: true``. (A CSV cell holds one string, and
LM-Polygraph's multi-reference accuracy needs a list per question, so polygraph_eval reads the
datasets folder; the CSV holds the same rows for reading.) Needs ``datasets`` (installed with
LM-Polygraph).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from isouq.data.tasks import TASKS

BRIEF = "Answer the following question as briefly as possible.\n"


def prompt_text(question: str, style: str) -> str:
    return f"{BRIEF}Question: {question}" + ("\nAnswer:" if style == "plain" else "")


def name_of(dataset: str, style: str, limit: int, seed: int, chunk: int, after: int = 0) -> str:
    return f"{dataset}-{style}-n{limit}{f'-after{after}' if after else ''}-s{seed}-c{chunk}"


def questions(dataset: str, limit: int, seed: int, after: int = 0) -> list:
    """The seeded subset of ``limit`` questions less the one of ``after`` (nested subsets: the
    questions a run of ``--limit after`` never saw), in the dataset's order."""
    from isouq.data.qa import load_dataset

    items = load_dataset(dataset, limit=limit, seed=seed)
    if after:
        if after >= limit:
            raise SystemExit(f"--after {after} must be below --limit {limit}")
        seen = {it.key for it in load_dataset(dataset, limit=after, seed=seed)}
        items = [it for it in items if it.key not in seen]
    return items


def prepare(dataset: str, style: str, limit: int, seed: int, chunk: int, out: Path,
            after: int = 0) -> Path:
    import datasets

    items = questions(dataset, limit, seed, after)
    name = name_of(dataset, style, limit, seed, chunk, after)
    root = out / name
    rows = [{"key": it.key, "question": it.question, "input": prompt_text(it.question, style),
             "output": list(it.answers)} for it in items]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["key", "question", "input", "output"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "output": json.dumps(r["output"], ensure_ascii=False)})
    for k in range(0, len(rows), chunk):
        part = rows[k:k + chunk]
        folder = root / f"chunk-{k // chunk:03d}"
        if (folder / "dataset_info.json").exists():
            continue
        datasets.Dataset.from_dict({c: [r[c] for r in part] for c in ("key", "input", "output")}
                                   ).save_to_disk(str(folder))
    print(f"{name}: {len(rows)} questions in {(len(rows) + chunk - 1) // chunk} chunk(s) "
          f"under {root}")
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=["triviaqa", "truthfulqa", *TASKS], required=True)
    ap.add_argument("--style", choices=["chat", "plain"], required=True)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=125)
    ap.add_argument("--after", type=int, default=0,
                    help="leave out the seeded subset of this many questions (fresh questions)")
    ap.add_argument("--out", default=".cache/polygraph_data")
    ap.add_argument("--count", action="store_true",
                    help="print the number of questions only (nothing written)")
    a = ap.parse_args(argv)
    if a.count:
        print(len(questions(a.dataset, a.limit, a.seed, a.after)))
        return 0
    prepare(a.dataset, a.style, a.limit, a.seed, a.chunk, Path(a.out), a.after)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
