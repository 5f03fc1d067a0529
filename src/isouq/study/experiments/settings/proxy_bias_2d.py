"""The proxy-bias-2d experiment's settings (``isouq experiment proxy-bias-2d``): its problems,
its settings class with the full and ``--quick`` presets, and its command-line options,
torch-free."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ....errors import InputError
from . import add_options, option

#: Experiment problem name → synthetic problem (``isouq.data.synthetic``).
PROBLEMS: dict[str, str] = {"linear": "binary_linear", "xor": "binary_xor",
                            "rings": "binary_rings"}


@dataclass(frozen=True)
class Settings:
    """The experiment's settings; :data:`PRESETS` holds the full run and ``--quick``."""

    grid_n: int = option(100, "grid points per axis")
    coarse_grid_n: int = option(16, "per-axis size of the coarse grid for the second Welch test")
    width: int = option(32, "hidden width (32: 1,185 params)")
    prior_precision: float = option(1.0, "λ: MAP prior precision and the damping added to "
                                    "H_A, H_B")
    seeds: int = option(5, "repeat with seeds seed..seed+k-1 (new data and init) and add a "
                        "mean ± SD table; figures and the main table use --seed")
    adam_steps: int = option(1000, "MAP training: Adam steps before L-BFGS")
    lbfgs_iter: int = option(2000, "MAP training: L-BFGS iterations")

    def __post_init__(self) -> None:
        for k in ("grid_n", "coarse_grid_n", "width", "seeds"):
            if getattr(self, k) < 1:
                raise InputError(f"{k} must be ≥ 1, got {getattr(self, k)}")
        if self.prior_precision < 0:
            raise InputError(f"prior_precision must be ≥ 0, got {self.prior_precision}")


PRESETS = {"full": Settings(),
           "quick": Settings(grid_n=30, seeds=1, adam_steps=300, lbfgs_iter=200)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options beyond the shared --out/--quick/--seed/--device (:class:`Settings` fields).

    Args:
        parser: the parser of ``isouq experiment proxy-bias-2d``.
    """
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS), default=None,
                        help="problems to run (default: all three)")
    parser.add_argument("--n-train", type=int, default=None,
                        help="training points per problem (default 300)")
    full, quick = PRESETS["full"], PRESETS["quick"]
    add_options(parser, Settings, defaults={
        k: f"{getattr(full, k)}; --quick {getattr(quick, k)}"
        for k in ("grid_n", "seeds", "adam_steps", "lbfgs_iter")})


__all__ = ["PRESETS", "PROBLEMS", "Settings", "add_arguments"]
