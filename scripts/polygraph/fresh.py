"""The learned heads on answers that did not shape them: the heads-against-MSP rows of one
model, on its questions from ``--start`` onward only.

    .venv/bin/python scripts/polygraph/fresh.py [--model qwen2.5-coder-1.5b] [--start 336]

The stacked head (``learned_heads.STACKED``) was designed after the hidden-state probe's results
were seen on the three small models and on the first 336 questions of each dataset of
Qwen2.5-Coder 1.5B; the 1.5B's later questions were answered and scored after it was fixed. Its
verdict on those alone is a check on fresh data of a choice made on the rest. Each answer's
value is the cross-fitted one of ``results/polygraph/heads/`` (fitted on the other folds, over
all questions); only the answers judged change. PRR, AUROC, differences to MSP's map and
verdicts as ``isouq report`` computes them (``report.polygraph.head_rows``, answers resampled;
``judge_heads``: one verdict per answer set, Holm over this model's answer sets).

Written: ``results/polygraph/fresh/<model>.json`` (the rows, the start and why) and its table
``results/polygraph/fresh/<model>.md``. Runs in the main venv.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

RESULTS = Path("results/polygraph")
#: the questions of each dataset of Qwen2.5-Coder 1.5B answered when the stacked head was fixed
DESIGNED_ON = 336
WHY = (f"the stacked head was designed on the first {DESIGNED_ON} questions of each dataset of "
       "this model (and on the small models); these questions were answered after it was fixed")


def fresh_rows(model: str, start: int, *, n_bootstrap: int = 1000, seed: int = 0) -> list[dict]:
    """Every heads-against-MSP row of ``model``'s kept settings, on questions ``start`` onward.

    Args:
        model: a model with kept benchmark and heads files under ``results/polygraph``.
        start: how many of each dataset's first questions to leave out.
        n_bootstrap: resamples for the intervals.
        seed: the resampling seed.

    Returns:
        ``head_rows``'s rows of every dataset and quality metric, each with ``questions``
        (which are judged, "first–last", counted from 1), judged (``judge_heads``).
    """
    from isouq.study.report.polygraph import (
        PREFIX,
        head_rows,
        judge_heads,
        load_heads,
        load_polygraph,
        questions_from,
    )

    rows = []
    for path in sorted(RESULTS.glob(f"{PREFIX}*__{model}.json")):
        doc = load_polygraph(path)
        heads = load_heads(path, doc)
        if heads is None:
            continue
        doc, heads = questions_from(doc, heads, start)
        for metric in doc["quality_metrics"]:
            if metric in heads["metrics"]:
                rows += [{**r, "questions": f"{start + 1}–{start + len(doc['questions'])}"}
                         for r in head_rows(doc, heads, metric, n_bootstrap=n_bootstrap,
                                            seed=seed)]
    return judge_heads(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--start", type=int, default=DESIGNED_ON,
                    help="leave out each dataset's first START questions")
    ap.add_argument("--n-bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "fresh"))
    a = ap.parse_args(argv)
    from isouq.runio import dumps
    from isouq.study.report.tables import make_table, to_markdown

    t0 = time.perf_counter()
    rows = fresh_rows(a.model, a.start, n_bootstrap=a.n_bootstrap, seed=a.seed)
    if not rows:
        print(f"{a.model}: no kept benchmark and heads files under {RESULTS}")
        return 1
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "isouq-polygraph-fresh", "model": a.model, "start": a.start,
           "why": WHY if a.start == DESIGNED_ON else "", "n_bootstrap": a.n_bootstrap,
           "seed": a.seed, "rows": rows}
    (out / f"{a.model}.json").write_text(dumps(doc) + "\n", encoding="utf-8")
    from isouq.study.report.polygraph import head_table

    shown = [{**t, "questions": r["questions"]} for t, r in zip(head_table(rows), rows,
                                                                strict=True)]
    cols = ["dataset", "quality", "questions", "head", "against", "PRR", "Δ PRR [95% CI]",
            "Holm p", "verdict"]
    table = make_table("fresh", shown, columns=cols, caption=doc["why"])
    (out / f"{a.model}.md").write_text(to_markdown(table), encoding="utf-8")
    print(f"{out / a.model}.json: {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
