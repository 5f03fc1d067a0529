"""The scaling experiment's settings (``isouq experiment scaling``): its sizes, its presets and
its command-line options, torch-free."""

from __future__ import annotations

import argparse

from . import HMCSettings, VISettings, add_options

#: Hidden widths of MLP(w, w) per study; 0 is softmax regression (no hidden layer).
HMC_WIDTHS: tuple[int, ...] = (0, 8, 16, 32, 64, 128, 256, 512, 1028)
VI_WIDTHS: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: Presets of the references: the full study and ``--quick`` (explicit options override).
HMC_PRESETS = {"full": HMCSettings(), "quick": HMCSettings(num_warmup=150, num_samples=150)}
VI_PRESETS = {"full": VISettings(), "quick": VISettings(steps=400, draws=100)}
GRID_N = {"full": 50, "quick": 20}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The experiment's own command-line options (besides --out/--quick/--seed/--device).

    The HMC and VI options are generated from :class:`HMCSettings` and :class:`VISettings`
    (``--num-warmup``, …, ``--vi-steps``, …).

    Args:
        p: the parser of ``isouq experiment scaling``.
    """
    p.add_argument("--sizes", nargs="+", type=int, default=None, metavar="W",
                   help="hidden widths of MLP(w,w), 0 = softmax regression (default: HMC "
                        f"{' '.join(map(str, HMC_WIDTHS))}; VI {' '.join(map(str, VI_WIDTHS))}"
                        "; --quick: HMC 0 8, VI 8 16)")
    p.add_argument("--study", choices=["hmc", "vi", "both"], default="both")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="start no size once this run has used this long, nor one predicted "
                        "to overrun it")
    full, quick = HMC_PRESETS["full"], HMC_PRESETS["quick"]
    add_options(p, HMCSettings, defaults={
        "num_warmup": f"{full.num_warmup}; --quick {quick.num_warmup}",
        "num_samples": f"{full.num_samples}; --quick {quick.num_samples}"})
    full, quick = VI_PRESETS["full"], VI_PRESETS["quick"]
    add_options(p, VISettings, prefix="vi-", defaults={
        "steps": f"{full.steps}; --quick {quick.steps}",
        "draws": f"{full.draws}; --quick {quick.draws}"})
    p.add_argument("--grid-n", type=int, default=None,
                   help=f"grid points per axis (default {GRID_N['full']}; --quick "
                        f"{GRID_N['quick']})")
    p.add_argument("--prior-precision", type=float, default=1.0)
    p.add_argument("--progress", action="store_true",
                   help="run nothing: print where each HMC size with a checkpoint in --out "
                        "stands (iterations, hours, hours left) and store it as the "
                        "hmc_in_progress table of --out/results.json")


__all__ = ["GRID_N", "HMC_PRESETS", "HMC_WIDTHS", "VI_PRESETS", "VI_WIDTHS", "add_arguments"]
