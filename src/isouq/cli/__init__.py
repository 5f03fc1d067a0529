"""The ``isouq`` command. Every user-facing job is a subcommand; see ``isouq --help``.

Science lives in the library; this package parses arguments, sets up progress and files, and
turns user errors (``IsouqError``) into one clean line and exit status 2. One module per
command family (``demo``, ``ask``, ``score`` with ``merge``, ``serve``, ``models``,
``experiment``, ``qa``, ``calibrate``, ``report``): each adds its subparser (``add_to``) and
holds its handlers, which import what they run when they run. Building the parser imports
no torch, so ``isouq --help`` and ``isouq CMD --help`` answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..choices import SPAN_SPLITTERS
from ..errors import IsouqError
from ..runtime import quiet_library_noise
from . import ask, calibrate, demo, experiment, models, qa, report, score, serve
from .extras import EXTRA_MODULES, require_extras

#: the command families, in the order ``isouq --help`` lists them
FAMILIES = (demo, ask, score, serve, models, experiment, qa, calibrate, report)


def build_parser() -> argparse.ArgumentParser:
    """The ``isouq`` parser with every command (each family's ``add_to``)."""
    ap = argparse.ArgumentParser(
        prog="isouq",
        description="Uncertainty from gradient norms: epistemic ‖∇θ p‖², aleatoric p(1−p).",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in FAMILIES:
        family.add_to(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the ``isouq`` command on ``argv`` (default: the process's arguments).

    Returns:
        The exit status: 0, 2 for a user error (one line on stderr), 130 when interrupted,
        141 when the output's reader has gone (a closed pipe).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_library_noise()
    try:
        args = build_parser().parse_args(argv)
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return status
    except IsouqError as e:
        print(f"isouq: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("isouq: interrupted; rows already written are kept (re-run to resume)",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`isouq models | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


__all__ = ["EXTRA_MODULES", "FAMILIES", "SPAN_SPLITTERS", "build_parser", "main",
           "require_extras"]
