"""The experiments ``isouq experiment NAME`` runs: for each, its help, the extras it needs, its
command-line options and its ``run``, torch-free.

The options come from the experiment's settings module (``settings.validation``, …), so the
parser lists them without importing the experiment; the experiment itself (torch, NumPy,
JAX…) is imported only when it runs (:meth:`Experiment.run`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .settings import classifiers, proxy_bias_2d, proxy_bias_text, scaling, validation


@dataclass(frozen=True)
class Experiment:
    """One experiment of the paper.

    Attributes:
        name: its name on the command line.
        help: one line for ``isouq experiment --help``.
        extras: the extras it needs, comma-separated (``isouq[EXTRAS]``).
        add_arguments: adds its own options (besides --out/--quick/--seed/--device).
        runner: imports the experiment and returns its ``run(out, quick, seed, device,
            **options) -> results.json``.
    """

    name: str
    help: str
    extras: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    runner: Callable[[], Callable[..., Path]]

    def run(self, out: Path, **options) -> Path:
        """Import the experiment and run it into ``out``; returns its results.json."""
        return self.runner()(out, **options)


def _validation() -> Callable[..., Path]:
    from .validation import run

    return run


def _scaling() -> Callable[..., Path]:
    from .scaling import run

    return run


def _proxy_bias_2d() -> Callable[..., Path]:
    from .proxy_bias_2d import run

    return run


def _proxy_bias_text() -> Callable[..., Path]:
    from .proxy_bias_text import run

    return run


def _classifiers() -> Callable[..., Path]:
    from .classifiers import run

    return run


#: name -> experiment, in the paper's order
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("validation", "GN and LA epistemic, PE aleatoric against HMC posteriors on "
               "8 synthetic problems (paper §4.1)", "reference,report", validation.add_arguments,
               _validation),
    Experiment("scaling", "does GN track the posterior as the networks grow: HMC and VI "
               "references (paper §4.1.2)", "reference,report", scaling.add_arguments, _scaling),
    Experiment("proxy-bias-2d", "how a proxy covariance biases Laplace's epistemic on 2D "
               "problems (paper §3.1)",
               "report", proxy_bias_2d.add_arguments, _proxy_bias_2d),
    Experiment("proxy-bias-text", "the same on a fine-tuned text classifier, 20 Newsgroups "
               "(paper §3.1)",
               "llm,report", proxy_bias_text.add_arguments, _proxy_bias_text),
    Experiment("classifiers", "a small CNN on scikit-learn's digits: gradient scores against "
               "MSP, ensembles, MC dropout and Laplace",
               "report", classifiers.add_arguments, _classifiers),
)}

__all__ = ["EXPERIMENTS", "Experiment"]
