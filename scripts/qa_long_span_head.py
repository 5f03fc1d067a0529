"""Does a learned span head find the wrong sentences of ``isouq qa long`` better than the
default span score? Cross-fitted by answer on the kept labelled sentences; kept for the docs.

    .venv/bin/python scripts/qa_long_span_head.py [--n-bootstrap 1000] [--out results/qa_long/span_head.json]

Reads the kept answer rows ``results/qa_long/{composed,generated}__<model>.jsonl`` (their labelled
sentences: ``study.analysis.long_spans.sentence_rows``), and writes, per setting and model,
the head's AUROC for the wrong sentences, the default span score's (``isouq.defaults.SPAN_SCORE``)
and their difference with 95% intervals over resampled answers
(``study.analysis.long_spans.span_head_rows``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="results/qa_long")
    ap.add_argument("--n-bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/qa_long/span_head.json")
    a = ap.parse_args(argv)
    from isouq.defaults import SPAN_SCORE
    from isouq.runio import dumps, read_jsonl
    from isouq.study.analysis.long_spans import SPAN_HEAD_FEATURES, sentence_rows, span_head_rows

    files = sorted(p for s in ("composed", "generated") for p in Path(a.rows).glob(f"{s}__*.jsonl"))
    rows = sentence_rows(r for f in files for r in read_jsonl(f))
    t0 = time.perf_counter()
    table = span_head_rows(rows, default=SPAN_SCORE, n_bootstrap=a.n_bootstrap, seed=a.seed)
    doc = {"kind": "isouq-span-head", "files": [str(f) for f in files],
           "features": list(SPAN_HEAD_FEATURES), "default": SPAN_SCORE,
           "n_bootstrap": a.n_bootstrap, "seed": a.seed, "folds": "5, by answer",
           "seconds": round(time.perf_counter() - t0, 1), "rows": table}
    Path(a.out).write_text(dumps(doc, indent=1) + "\n", encoding="utf-8")
    for r in table:
        print(f"{r['setting']} {r['model']}: head {r['head']:.3f}, {SPAN_SCORE} "
              f"{r['default_auroc']:.3f}, Δ {r['delta']:+.3f} [{r['delta_ci_low']:+.3f}, "
              f"{r['delta_ci_high']:+.3f}]: {r['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
