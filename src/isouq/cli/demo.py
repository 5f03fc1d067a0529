"""``isouq demo``: the flagship in a minute (SmolLM2 answers, scored), or ``--toy`` 2D maps."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..runtime import configure
from .extras import require_extras
from .options import add_model_options, load_kw, out_dir, positive_int, refuse_load_options


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``isouq`` subcommands."""
    p = sub.add_parser("demo", help="the flagship in a minute: SmolLM2 answers, scored")
    add_model_options(p)
    p.add_argument("-n", type=positive_int, default=8, help="number of demo questions (≤ 8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=24)
    p.add_argument("--toy", action="store_true",
                   help="instead: train a small classifier on 2D XOR and plot its maps")
    p.add_argument("--out", type=out_dir, default="runs/demo",
                   help="where --toy saves its figure")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``isouq demo``."""
    if args.toy:
        require_extras("report", "isouq demo --toy")
        refuse_load_options(args, "--toy trains its own small network")
    else:
        require_extras("llm", "isouq demo")
    from .. import demo

    configure()
    if args.toy:
        demo.run_toy(Path(args.out), seed=args.seed)
    else:
        demo.run_llm(args.model, n=args.n, max_new_tokens=args.max_new_tokens, **load_kw(args))
    return 0
