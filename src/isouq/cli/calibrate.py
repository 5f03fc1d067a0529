"""``isouq calibrate``: on the user's labelled answers, does isouq's head beat the probability
the model already gives (MSP)? The verdict, and the P(correct) map the evidence allows;
optionally a threshold with an error-rate guarantee."""

from __future__ import annotations

import argparse
import sys

from ..choices import FEATURE_NAMES
from ..errors import InputError
from .extras import require_extras
from .options import out_dir


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to the ``isouq`` subcommands."""
    p = sub.add_parser("calibrate", help="on your labelled answers: does isouq's head beat MSP? "
                                         "the verdict, and the P(correct) map it allows")
    p.add_argument("rows", nargs="+", help="labelled rows: files or folders of `isouq score` or "
                                           "`isouq qa run` (JSONL with the scores and a "
                                           "'correct': 0/1 or a quality in [0, 1])")
    p.add_argument("--out", type=out_dir, required=True,
                   help="output folder (calibration.json, crossfit.jsonl, results.json, PNGs)")
    p.add_argument("--labels", choices=["hand", "judge", "lexical"], default="judge",
                   help="which labels: hand (gold/ beside the rows, or --gold), the LLM judge's "
                        "(default), or lexical matching")
    p.add_argument("--label-field", default=None, metavar="NAME",
                   help="read the labels from this field of the rows instead of 'correct': "
                        "0/1, true/false, or a quality in [0, 1] (a ROUGE-L, a judge's "
                        "probability: fractional labels)")
    p.add_argument("--gold", nargs="+", default=None, metavar="PATH",
                   help="hand-label files or folders (default: gold/ beside the rows)")
    p.add_argument("--max-risk", type=float, default=None, metavar="A",
                   help="withhold answers so that the error rate among those kept is ≤ A ...")
    p.add_argument("--delta", type=float, default=0.1, metavar="D",
                   help="... with probability ≥ 1 − D (Learn then Test; default 0.1)")
    p.add_argument("--model", default=None,
                   help="the model to calibrate, when the rows hold several or name none")
    p.add_argument("--seed", type=int, default=0, help="folds, split and bootstrap")
    p.add_argument("--repeats", type=int, default=5, metavar="R",
                   help="fold seeds of the repeated cross-fitting (default 5): the verdict's "
                        "interval holds the refit noise of R splits")
    p.add_argument("--bootstrap", type=int, default=2000, metavar="B",
                   help="paired bootstrap resamples of the verdict (default 2000, at least "
                        "1000)")
    p.add_argument("--no-curve", dest="curve", action="store_false",
                   help="skip the learning curve (the nested AUROC at a quarter, half and all "
                        "of the labelled answers)")
    p.add_argument("--check", default=None, metavar="CALIBRATION",
                   help="fit nothing: judge a saved calibration.json on labelled answers it "
                        "did not see (those it was fitted on are left out): its P(correct) "
                        "against MSP and p̄ on the same answers, paired intervals and verdicts")
    p.add_argument("--features", nargs="+", default=None, metavar="NAME",
                   choices=list(FEATURE_NAMES),
                   help="what P(correct) may read: " + ", ".join(FEATURE_NAMES) + " (blocks: "
                        "the block profile of `isouq score --blocks`; hidden: a probe on the "
                        "hidden states of `isouq score --hidden`, its logit stacked under the "
                        "others; the squared norms on a log scale); candidates: each alone, all "
                        "together, and the scores without blocks (with hidden: each also with "
                        "the probe, and the probe alone), each as a logistic regression, its "
                        "isotonic recalibration or a small neural network, chosen by "
                        "cross-validated log-loss (default: every score the rows carry, and "
                        "their blocks and hidden states when every row has them)")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``isouq calibrate`` and print its summary."""
    require_extras("report", "isouq calibrate")
    if args.check is not None:
        return _check(args)
    from ..calibrate_run import run_calibration, summary

    path = run_calibration(args.rows, args.out, labels=args.labels,
                           label_field=args.label_field, max_risk=args.max_risk,
                           delta=args.delta, model=args.model, gold=args.gold or (),
                           seed=args.seed, features=args.features, repeats=args.repeats,
                           n_bootstrap=args.bootstrap, curve=args.curve,
                           progress=sys.stderr.isatty())
    print(summary(path))
    return 0


def _check(args: argparse.Namespace) -> int:
    """Run ``isouq calibrate ROWS --check CALIBRATION`` and print its summary."""
    from ..calibration_check import check_calibration, check_summary

    fitting = [flag for flag, given in (("--max-risk", args.max_risk is not None),
                                        ("--features", args.features is not None)) if given]
    if fitting:
        raise InputError(f"--check judges a saved calibration and fits nothing; drop "
                         f"{' and '.join(fitting)} (they choose what a new calibration fits)")
    path = check_calibration(args.check, args.rows, args.out, labels=args.labels,
                             label_field=args.label_field, model=args.model,
                             gold=args.gold or (), seed=args.seed, n_bootstrap=args.bootstrap)
    print(check_summary(path))
    return 0
