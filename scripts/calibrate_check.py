"""The check a new user makes of ``isouq calibrate`` on a labelled task isouq has never seen.

    .venv/bin/python scripts/calibrate_check.py --task units --model smollm2 --n 450 --seed 7

1. The model answers ``--n`` questions of an exact-label task (``isouq.data.tasks``) from the
   stream of ``--seed`` (seed 0 holds the harness's design and fresh sets; another seed is a
   task no design choice saw), as the harness asks them (greedy, at most 50 new tokens, stopped
   at a newline), each labelled by exact match: ``answers.jsonl``.
2. ``isouq score answers.jsonl --blocks --hidden`` (the label travels in the rows).
3. A seeded, stratified split: two thirds to calibrate on, one third held out.
4. ``isouq calibrate`` on the first part (its printed verdict kept in ``calibrate.txt``).
5. ``isouq score`` of the held-out answers with ``--calibration``.
6. ``isouq calibrate --check`` on the held-out answers: the saved P(correct) against MSP (the
   sequence probability) and p̄, PRR and AUROC with paired bootstrap intervals, Holm.

The answers, their scores (hidden states included: tens of MB) and the calibration go to the
git-ignored ``.cache/calibrate_check/<task>__<model>-s<seed>/``; what is kept, in
``OUT/<task>__<model>-s<seed>/``, is ``check.json`` (the numbers), ``calibrate.txt`` (what
``isouq calibrate`` printed, then what its ``--check`` printed), ``verdict.png`` and
``risk_coverage.png`` (the held-out answers). Each step is skipped when its file exists
(resumable). ``OUT/walks.md`` is the table of every kept walk under ``OUT``, written again at
the end of each run (``--table``: only that). Runs in the main venv.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import time
from pathlib import Path

STOP = ("\n", "Question:")  # configs/polygraph/polygraph_eval.yaml's stop_strings


def answer(task: str, model: str, n: int, seed: int, path: Path) -> None:
    """Step 1: the model's greedy answers, labelled by exact match."""
    from isouq.data.qa import load_dataset
    from isouq.data.tasks import is_correct
    from isouq.llm.generation import generate_greedy
    from isouq.llm.prompts import qa_prompts
    from isouq.models import load_model

    items = load_dataset(task, limit=n, seed=seed)
    lm, tok, _ = load_model(model)
    gens = generate_greedy(lm, tok, qa_prompts(tok, [it.question for it in items]),
                           max_new_tokens=50, stop=STOP, batch_size=8)
    rows = [{"key": it.key, "question": it.question, "answer": g.text,
             "correct": int(is_correct(g.text, it.answers)), "level": it.level}
            for it, g in zip(items, gens, strict=True) if g.text.strip()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def cli(*argv: str) -> str:
    """``isouq ARGV``, as a user runs it; its printed output (SystemExit on failure)."""
    from isouq.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(argv))
    if code:
        raise SystemExit(f"isouq {' '.join(argv)} exited {code}")
    return buf.getvalue()


def split(scored: Path, part: Path, held: Path, seed: int) -> None:
    """Step 3: two thirds and one third, stratified by the label, seeded."""
    from sklearn.model_selection import train_test_split

    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    rows = [r for r in rows if "error" not in r]
    fit, rest = train_test_split(rows, test_size=1 / 3, random_state=seed,
                                 stratify=[r["correct"] for r in rows])
    for path, rs in ((part, fit), (held, rest)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rs), encoding="utf-8")


def walks_table(out: Path) -> str:
    """The Markdown table of the kept walks under ``out`` (``*/check.json``), a row each."""
    from isouq.calibrate_run import signed_ci

    head = ("| walk (task × model, seed) | calibrated on | isouq head vs MSP's map: Δ PRR [95% CI] "
            "| verdict | saved | held out | saved map vs p̄: Δ AUROC [95% CI] |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for path in sorted(out.glob("*/check.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        isouq = next((r for r in d["verdict"] if r["predictor"] == "isouq head"
                      and r["against"] == "MSP's map"), None)
        pbar = next(r for r in d["held_out"]["verdict"] if r["against"] == "p̄")
        cells = [f"{d['task']} × {d['model']}, {d['seed']}", d.get("calibrated", "–"),
                 signed_ci(isouq) if isouq else "no head fitted",
                 isouq["verdict"] if isouq else "–", d["saved"],
                 d["held_out"]["answers"], signed_ci(pbar, "_auroc")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="units")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=450)
    ap.add_argument("--seed", type=int, default=7, help="the task's stream (not 0)")
    ap.add_argument("--out", default="results/calibrate_check", help="where the kept files go")
    ap.add_argument("--table", action="store_true", help="only write OUT/walks.md again")
    a = ap.parse_args(argv)
    if a.table:
        (Path(a.out) / "walks.md").write_text(walks_table(Path(a.out)), encoding="utf-8")
        return 0
    if a.seed == 0:
        raise SystemExit("--seed 0 is the harness's design and fresh stream; give another")
    name = f"{a.task}__{a.model}-s{a.seed}"
    d, kept = Path(".cache/calibrate_check") / name, Path(a.out) / name
    d.mkdir(parents=True, exist_ok=True)
    kept.mkdir(parents=True, exist_ok=True)
    t0, todo = time.perf_counter(), [
        (d / "answers.jsonl", lambda: answer(a.task, a.model, a.n, a.seed, d / "answers.jsonl")),
        (d / "scored.jsonl", lambda: cli("score", str(d / "answers.jsonl"), "--out",
                                         str(d / "scored.jsonl"), "--model", a.model,
                                         "--blocks", "--hidden")),
        (d / "held.jsonl", lambda: split(d / "scored.jsonl", d / "part.jsonl",
                                         d / "held.jsonl", a.seed)),
        (d / "cal" / "calibration.json", lambda: (d / "calibrate.txt").write_text(
            cli("calibrate", str(d / "part.jsonl"), "--out", str(d / "cal")), encoding="utf-8")),
        (d / "held_scored.jsonl", lambda: cli(
            "score", str(d / "held.jsonl"), "--out", str(d / "held_scored.jsonl"), "--model",
            a.model, "--calibration", str(d / "cal" / "calibration.json"))),
        (d / "check" / "results.json", lambda: (d / "check.txt").write_text(cli(
            "calibrate", str(d / "held_scored.jsonl"), "--check",
            str(d / "cal" / "calibration.json"), "--out", str(d / "check")), encoding="utf-8"))]
    ran = [step() for path, step in todo if not path.exists()]
    seconds = round(time.perf_counter() - t0, 1)
    if not ran and (kept / "check.json").exists():  # nothing made again: its time stays
        seconds = json.loads((kept / "check.json").read_text())["seconds"]
    cal = json.loads((d / "cal" / "results.json").read_text())
    check = json.loads((d / "check" / "results.json").read_text())
    doc = {"task": a.task, "model": a.model, "seed": a.seed, "n": a.n,
           "calibrated": cal["answers"], "saved": cal["saved"], "reason": cal["reason"],
           "selected": cal["selected"],
           "verdict": cal["tables"].get("verdict", []),
           "learning_curve": cal["tables"].get("learning_curve", []),
           "held_out": {"answers": check["answers"], "verdict": check["tables"]["verdict"],
                        "metrics": check["tables"]["metrics"]},
           "seconds": seconds}
    (kept / "check.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    said = (d / "calibrate.txt").read_text() + "\n" + (d / "check.txt").read_text()
    (kept / "calibrate.txt").write_text(said, encoding="utf-8")
    for fig in (d / "cal" / "verdict.png", d / "check" / "risk_coverage.png"):
        if fig.exists():
            shutil.copy(fig, kept / fig.name)
    (Path(a.out) / "walks.md").write_text(walks_table(Path(a.out)), encoding="utf-8")
    print(said)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
