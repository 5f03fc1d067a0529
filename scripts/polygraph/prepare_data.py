"""Local LM-Polygraph datasets from the shipped TriviaQA and TruthfulQA (no network).

    python scripts/polygraph/prepare_data.py --dataset triviaqa --style chat --limit 500 \
        --chunk 125 --out .cache/polygraph_data

Questions come from ``isouq.data.qa.load_dataset`` (the shipped copies under shared/data;
``--limit N --seed S``: isouq's nested, seeded subsets). Each question becomes
``input``: isouq's QA prompt text (Farquhar et al.'s brief instruction, ``Question: ...``; for
``--style plain`` followed by ``\\nAnswer:``; for ``--style chat`` LM-Polygraph's ``instruct``
mode puts it in one user turn of the chat template, as ``isouq qa run`` does) and ``output``:
the list of correct references (TriviaQA: the aliases; TruthfulQA: the best and the other
correct answers), for LM-Polygraph's multi-reference metrics.

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

BRIEF = "Answer the following question as briefly as possible.\n"


def prompt_text(question: str, style: str) -> str:
    return f"{BRIEF}Question: {question}" + ("\nAnswer:" if style == "plain" else "")


def name_of(dataset: str, style: str, limit: int, seed: int, chunk: int) -> str:
    return f"{dataset}-{style}-n{limit}-s{seed}-c{chunk}"


def prepare(dataset: str, style: str, limit: int, seed: int, chunk: int, out: Path) -> Path:
    import datasets

    from isouq.data.qa import load_dataset

    items = load_dataset(dataset, limit=limit, seed=seed)
    name = name_of(dataset, style, limit, seed, chunk)
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
    ap.add_argument("--dataset", choices=["triviaqa", "truthfulqa"], required=True)
    ap.add_argument("--style", choices=["chat", "plain"], required=True)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=125)
    ap.add_argument("--out", default=".cache/polygraph_data")
    a = ap.parse_args(argv)
    prepare(a.dataset, a.style, a.limit, a.seed, a.chunk, Path(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
