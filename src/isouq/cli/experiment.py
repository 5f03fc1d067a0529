"""``isouq experiment NAME``: reproduce one of the paper's experiments.

The experiments, their options and the extras they need come from the study wing's catalog
(``isouq.study.experiments.catalog``), torch-free; the experiment itself is imported only
when it runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..runtime import configure
from .extras import require_extras
from .options import out_dir

#: the options every experiment takes (its ``run``'s own arguments); the rest are its own
SHARED = ("out", "quick", "seed", "device")


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``experiment`` and one subcommand per experiment of the catalog."""
    from ..study.experiments.catalog import EXPERIMENTS

    p = sub.add_parser("experiment", help="reproduce one of the paper's experiments")
    esub = p.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, experiment in EXPERIMENTS.items():
        e = esub.add_parser(name, help=experiment.help)
        e.add_argument("--out", type=out_dir, required=True,
                       help="output directory (results.json, PNGs)")
        e.add_argument("--quick", action="store_true", help="a small run (minutes)")
        e.add_argument("--seed", type=int, default=0)
        e.add_argument("--device", default="cpu")
        experiment.add_arguments(e)
        e.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    """Run ``isouq experiment NAME``: its extras checked, then the experiment imported and run."""
    from ..study.experiments.catalog import EXPERIMENTS

    experiment = EXPERIMENTS[args.name]
    require_extras(experiment.extras, f"isouq experiment {args.name}")
    opts = {k: v for k, v in vars(args).items()
            if k not in (*SHARED, "command", "name", "func")}
    configure()
    t0 = time.perf_counter()
    path = experiment.run(Path(args.out), quick=args.quick, seed=args.seed, device=args.device,
                          **opts)
    print(f"{args.name}: results in {path} ({time.perf_counter() - t0:.0f} s)")
    return 0
