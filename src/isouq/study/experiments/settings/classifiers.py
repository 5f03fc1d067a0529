"""The classifiers experiment's settings (``isouq experiment classifiers``): its settings class,
the ``--quick`` preset and its command-line options, torch-free."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Settings:
    """Everything that changes the numbers."""

    test_fraction: float = 0.4
    epochs: int = 60
    lr: float = 3e-3
    weight_decay: float = 1e-4
    batch: int = 64
    dropout: float = 0.25
    ensemble: int = 5
    mc_samples: int = 30
    rotate: float = 30.0
    noise: float = 2.0
    n_bootstrap: int = 1000


QUICK = Settings(epochs=15, ensemble=3, mc_samples=10, n_bootstrap=200)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options beyond the shared --out/--quick/--seed/--device (defaults: :class:`Settings`).

    Args:
        parser: the parser of ``isouq experiment classifiers``.
    """
    for f in fields(Settings):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None,
                            help=f"default {f.default} (--quick: {getattr(QUICK, f.name)})")


__all__ = ["QUICK", "Settings", "add_arguments"]
