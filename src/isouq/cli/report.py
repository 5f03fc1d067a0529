"""``isouq report``: one HTML report from results folders and QA runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from .extras import require_extras
from .options import non_negative_int, out_dir, positive_int


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``report`` to the ``isouq`` subcommands."""
    p = sub.add_parser("report", help="one HTML report from results dirs and QA runs")
    p.add_argument("inputs", nargs="+", help="results.json dirs/files and QA JSONL dirs/files")
    p.add_argument("--out", type=out_dir, required=True, help="output folder (report.html, …)")
    p.add_argument("--n-bootstrap", type=positive_int, default=None)
    p.add_argument("--max-span-answers", type=non_negative_int, default=None, metavar="N",
                   help="answers scored span by span (isouq score --spans) shaded in the "
                        "report, at most (default 50; the rest are counted in its tables)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``isouq report``."""
    require_extras("report", "isouq report")
    from ..study.report.build import build_report

    opts = {"n_bootstrap": args.n_bootstrap, "max_span_answers": args.max_span_answers}
    path = build_report([Path(p) for p in args.inputs], Path(args.out),
                        **{k: v for k, v in opts.items() if v is not None})
    print(f"report written to {path}")
    return 0
