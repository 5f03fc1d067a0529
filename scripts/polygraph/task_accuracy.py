"""How many of an exact-label task's design items each model answers right (a quick check).

    OMP_NUM_THREADS=1 .venv-polygraph/bin/python scripts/polygraph/task_accuracy.py \
        --models smollm2 gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b \
        --tasks compare lists truthfulqa-mc1 --n 42 --out results/tasks/accuracy_check.json

The first ``--n`` items of each task's design set (``isouq.data.qa.load_dataset(task,
limit=500, seed=0)``) are asked as the LM-Polygraph harness asks them (isouq's QA prompt, one
user turn of the chat template where the model has one; greedy, at most 50 new tokens, stopped
at a newline or "Question:"), through isouq's own generation path, and judged by exact match
after the harness's normalization (``isouq.data.tasks.is_correct``). Written: per task and
model, the number right, the rate, the rate per difficulty level, the answers marked wrong that
still contain the bare answer (to read by eye: a shape the accepted answers lack?) and every
answer with its label. Resumable: a (task, model) already in ``--out`` is kept. ``--rejudge``
labels the kept answers again with the tasks' current accepted answers (no model is run; the
questions must be unchanged).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DESIGN = 500
STOP = ("\n", "Question:")  # configs/polygraph/polygraph_eval.yaml's stop_strings


def contains(answer: str, bare: str) -> bool:
    """Whether the normalized ``answer`` holds the normalized ``bare`` answer as whole words."""
    from isouq.data.tasks import normalize

    return f" {normalize(bare)} " in f" {normalize(answer)} "


def check(task: str, model_name: str, n: int) -> dict:
    """One (task, model): the answers to the first ``n`` design items and their labels."""
    from isouq.data.qa import load_dataset
    from isouq.llm.generation import generate_greedy
    from isouq.llm.prompts import qa_prompts
    from isouq.models import load_model

    items = load_dataset(task, limit=DESIGN, seed=0)[:n]
    model, tok, _ = load_model(model_name)
    t0 = time.perf_counter()
    gens = generate_greedy(model, tok, qa_prompts(tok, [it.question for it in items]),
                           max_new_tokens=50, stop=STOP, batch_size=8)
    seconds = time.perf_counter() - t0
    rows = [{"key": it.key, "level": it.level, "question": it.question, "answer": g.text}
            for it, g in zip(items, gens, strict=True)]
    return {"task": task, "model": model_name, "n": len(rows),
            **judged(rows, items), "seconds_per_answer": round(seconds / len(rows), 2),
            "answers": rows}


def judged(rows: list[dict], items: list) -> dict:
    """The labels of ``rows`` (answers to ``items``, in order) and their counts, by level."""
    from isouq.data.tasks import is_correct

    for r, it in zip(rows, items, strict=True):
        if r.get("question", it.question) != it.question or r["key"] != it.key:
            raise SystemExit(f"{r['key']}: the question changed since it was answered; rerun")
        r["question"] = it.question
        r["correct"] = is_correct(r["answer"], it.answers)
    levels: dict[str, list[int]] = {}
    for r in rows:
        levels.setdefault(str(r["level"]), [0, 0])
        levels[str(r["level"])][0] += r["correct"]
        levels[str(r["level"])][1] += 1
    right = sum(r["correct"] for r in rows)
    misses = [r["key"] for r, it in zip(rows, items, strict=True)
              if not r["correct"] and contains(r["answer"], it.answers[0])]
    return {"correct": right, "accuracy": round(right / len(rows), 4),
            "by_level": {k: {"correct": c, "n": t} for k, (c, t) in sorted(levels.items())},
            "wrong_but_containing_the_answer": misses}


def rejudge(kept: dict) -> None:
    """Label every kept check's answers again (``judged``), in place."""
    from isouq.data.qa import load_dataset

    for c in kept["checks"]:
        items = load_dataset(c["task"], limit=DESIGN, seed=0)[: c["n"]]
        c.update(judged(c["answers"], items))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--tasks", nargs="+", required=True)
    ap.add_argument("--n", type=int, default=42, help="design items per task and model")
    ap.add_argument("--out", default="results/tasks/accuracy_check.json")
    ap.add_argument("--rejudge", action="store_true",
                    help="label the kept answers again (no model is run)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    kept = json.loads(out.read_text()) if out.is_file() else {"checks": []}
    if a.rejudge:
        rejudge(kept)
        out.write_text(json.dumps(kept, indent=1, ensure_ascii=False) + "\n")
        for c in kept["checks"]:
            print(f"{c['task']} × {c['model']}: {c['correct']}/{c['n']} = {c['accuracy']:.0%}")
        return 0
    kept["how"] = (f"the first {a.n} items of each task's design set (load_dataset(task, "
                   f"limit={DESIGN}, seed=0)), greedy, at most 50 new tokens, stop at a newline; "
                   "exact match after the harness's normalization (scripts/polygraph/"
                   "task_accuracy.py)")
    done = {(c["task"], c["model"]) for c in kept["checks"] if c["n"] == a.n}
    for model in a.models:
        for task in a.tasks:
            if (task, model) in done:
                continue
            c = check(task, model, a.n)
            kept["checks"] = [k for k in kept["checks"] if (k["task"], k["model"]) != (task, model)]
            kept["checks"].append(c)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(kept, indent=1, ensure_ascii=False) + "\n")
            print(f"{task} × {model}: {c['correct']}/{c['n']} = {c['accuracy']:.0%} "
                  f"(by level {c['by_level']}; {c['seconds_per_answer']} s/answer)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
