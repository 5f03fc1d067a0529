"""``isouq calibrate``: P(correct) from the scores, fitted on labelled rows; optionally a
threshold with an error-rate guarantee."""

from __future__ import annotations

import argparse

from ..choices import FEATURE_NAMES
from .extras import require_extras
from .options import out_dir


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to the ``isouq`` subcommands."""
    p = sub.add_parser("calibrate", help="P(correct) from the scores, fitted on labelled rows; "
                                         "optionally a threshold with an error-rate guarantee")
    p.add_argument("rows", nargs="+", help="labelled rows: files or folders of `isouq qa run` "
                                           "(or JSONL with the scores and a 0/1 'correct')")
    p.add_argument("--out", type=out_dir, required=True,
                   help="output folder (calibration.json, crossfit.jsonl, results.json, PNGs)")
    p.add_argument("--labels", choices=["hand", "judge", "lexical"], default="judge",
                   help="which labels: hand (gold/ beside the rows, or --gold), the LLM judge's "
                        "(default), or lexical matching")
    p.add_argument("--gold", nargs="+", default=None, metavar="PATH",
                   help="hand-label files or folders (default: gold/ beside the rows)")
    p.add_argument("--max-risk", type=float, default=None, metavar="A",
                   help="withhold answers so that the error rate among those kept is ≤ A ...")
    p.add_argument("--delta", type=float, default=0.1, metavar="D",
                   help="... with probability ≥ 1 − D (Learn then Test; default 0.1)")
    p.add_argument("--model", default=None,
                   help="the model to calibrate, when the rows hold several or name none")
    p.add_argument("--seed", type=int, default=0, help="folds and split")
    p.add_argument("--features", nargs="+", default=None, metavar="NAME",
                   choices=list(FEATURE_NAMES),
                   help="what P(correct) may read: " + ", ".join(FEATURE_NAMES) + " (blocks: "
                        "the block profile of `isouq score --blocks`; hidden: a probe on the "
                        "hidden states of `isouq score --hidden`, its logit stacked under the "
                        "others; the squared norms on a log scale); candidates: each alone, all "
                        "together, and the scores without blocks (with hidden: each also with "
                        "the probe, and the probe alone), each as a logistic regression, its "
                        "isotonic recalibration or a small neural network, chosen by "
                        "cross-validated log-loss (default: the scores' standard sets)")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``isouq calibrate`` and print its summary."""
    require_extras("report", "isouq calibrate")
    from ..calibrate_run import run_calibration, summary

    path = run_calibration(args.rows, args.out, labels=args.labels, max_risk=args.max_risk,
                           delta=args.delta, model=args.model, gold=args.gold or (),
                           seed=args.seed, features=args.features)
    print(summary(path))
    return 0
