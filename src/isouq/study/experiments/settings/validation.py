"""The validation experiment's settings (``isouq experiment validation``): its problems, its
presets and its command-line options, torch-free."""

from __future__ import annotations

import argparse

from . import HMCSettings, add_options

#: (problem, model kind) in the paper's order.
PROBLEMS: tuple[tuple[str, str], ...] = (
    ("binary_linear", "linear"),
    ("binary_xor", "mlp"),
    ("binary_rings", "mlp"),
    ("multiclass_clusters", "linear"),
    ("multiclass_spirals", "mlp"),
    ("multiclass_rings", "mlp"),
    ("regression_linear", "linear"),
    ("regression_nonlinear", "mlp"),
)
#: HMC presets: the full validation and ``--quick`` (explicit options override).
HMC_PRESETS = {"full": HMCSettings(), "quick": HMCSettings(num_warmup=300, num_samples=300)}
GRID_N = {"full": 60, "quick": 30}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The experiment's own command-line options (besides --out/--quick/--seed/--device).

    Args:
        p: the parser of ``isouq experiment validation``.
    """
    p.add_argument("--problems", nargs="+", default=None, metavar="NAME",
                   help=f"subset of: {', '.join(n for n, _ in PROBLEMS)}")
    full, quick = HMC_PRESETS["full"], HMC_PRESETS["quick"]
    add_options(p, HMCSettings, defaults={
        "num_warmup": f"{full.num_warmup}; --quick {quick.num_warmup}",
        "num_samples": f"{full.num_samples}; --quick {quick.num_samples}"})
    p.add_argument("--grid-n", type=int, default=None,
                   help=f"grid points per axis, 2D (default {GRID_N['full']}; --quick "
                        f"{GRID_N['quick']})")
    p.add_argument("--prior-precision", type=float, default=1.0)
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="run N seeds (--seed, --seed+1, …): data, MAP and chains re-drawn "
                        "per seed; tables give mean ± std over seeds and mark where the "
                        "paper's number falls outside ±2 std")


__all__ = ["GRID_N", "HMC_PRESETS", "PROBLEMS", "add_arguments"]
