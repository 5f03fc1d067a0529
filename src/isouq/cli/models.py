"""``isouq models``: the named models of the registry (or ``--fetch`` one)."""

from __future__ import annotations

import argparse


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``models`` to the ``isouq`` subcommands."""
    p = sub.add_parser("models", help="list the named models (or --fetch one)")
    p.add_argument("--fetch", metavar="NAME", help="install an optional model's wheels")
    p.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    """Run ``isouq models``."""
    from .. import models

    if args.fetch:
        models.fetch(args.fetch)
        return 0
    for name in models.list_models():
        e = models.get_entry(name)
        mark = "installed" if models.installed(name) else "not installed"
        default = " (default)" if name == models.DEFAULT_MODEL else ""
        print(f"{name}{default}: {mark}\n  {e.describe()}")
    return 0
