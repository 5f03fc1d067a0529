"""Proxy-covariance bias on 2D problems (paper §3.1, App. A, Figure 1, Table "hessian-bias").

For each binary problem with a decision boundary symmetric under x₂ → −x₂ (linear, XOR, rings):

1. train a 2-hidden-layer tanh MLP (2→32→32→1, 1,185 parameters) to its MAP θ* under the prior
   N(0, I/λ) (``models.toy.train_map``);
2. split the training data by x₂ sign: top (x₂ > 0, "A") and bottom (x₂ ≤ 0, "B");
3. empirical Fisher of the summed Bernoulli NLL on each half, H_A and H_B (P×P), damped by the
   prior precision λ (``covariance.curvature(kind="ef")`` + ``covariance.Dense``);
4. on a dense grid over [−3, 3]², with g = ∇θ p(y=1 | x, θ*): identity ‖g‖²,
   U_A = gᵀ(H_A + λI)⁻¹g, U_B = gᵀ(H_B + λI)⁻¹g; each map min-max normalized to [0, 1];
5. symmetry statistics: r = mean over the top half of the grid / mean over the bottom half (of the
   normalized map) for each of the three; Welch's t-test of log(U_A/U_B) (raw, unnormalized
   values) between the grid's top (x₂ > 0) and bottom (x₂ < 0) points, with Cohen's d
   (pooled SD). Negative t and d: each proxy suppresses uncertainty where its data was.

The t statistic grows with the number of grid points (t ≈ d·√(n/2) for n points per half); the
paper's t and d imply ≈ 2(t/d)² ≈ 125 points per half, so the same test is also reported on a
coarse 16×16 grid (128 per half) beside the dense one. Cohen's d does not depend on n.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ...covariance import Dense, curvature
from ...data.synthetic import Problem, evaluation_grid, make_problem
from ...errors import InputError
from ...estimators import score_classifier
from ...models import toy as tm
from ...runio import write_results
from .settings import resolve
from .settings.proxy_bias_2d import PRESETS, PROBLEMS

NAME = "proxy-bias-2d"

#: The paper's Table (App. A): top/bottom ratios and the Welch test on log(U_A/U_B).
PAPER: dict[str, list[dict]] = {
    "symmetry": [
        {"problem": "linear", "r_id": 0.93, "r_A": 0.21, "r_B": 4.56, "t": -8.1, "p": 3.0e-14,
         "cohens_d": -1.0},
        {"problem": "xor", "r_id": 1.45, "r_A": 0.62, "r_B": 4.39, "t": -19.6, "p": 3.8e-50,
         "cohens_d": -2.5},
        {"problem": "rings", "r_id": 1.06, "r_A": 0.05, "r_B": 19.10, "t": -22.2, "p": 2.0e-61,
         "cohens_d": -2.8},
    ],
}


# --------------------------------------------------------------------------- statistics


def normalize01(u: np.ndarray) -> np.ndarray:
    """Min-max normalize a map (G,) to [0, 1]; a constant map becomes all zeros."""
    u = np.asarray(u, dtype=np.float64)
    span = float(u.max() - u.min())
    return (u - u.min()) / span if span > 0 else np.zeros_like(u)


def half_masks(points: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (G,) of points (G, 2) with x₂ > 0 (top) and x₂ < 0 (bottom).

    Points exactly on x₂ = 0 (a grid row, for odd resolutions) belong to neither half.
    """
    x2 = np.asarray(points)[:, 1]
    return x2 > 0, x2 < 0


def top_bottom_ratio(u: np.ndarray, top: np.ndarray, bottom: np.ndarray) -> float:
    """mean(u[top]) / mean(u[bottom]) for a map u (G,) and masks (G,); 1.0 = symmetric."""
    return float(np.mean(u[top]) / np.mean(u[bottom]))


def cohens_d(a: np.ndarray, b: np.ndarray) -> float:
    """Cohen's d = (mean a − mean b) / pooled SD, pooled SD² = ((nₐ−1)sₐ² + (n_b−1)s_b²)/(nₐ+n_b−2)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = a.size, b.size
    pooled = ((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2)
    return float((a.mean() - b.mean()) / math.sqrt(pooled))


def welch_test(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Welch's unequal-variance t-test of a vs b (scipy) with Cohen's d.

    Returns {t, p, log10_p, df, cohens_d, n_a, n_b}; log10_p (two-sided, from the t
    distribution's log survival function) stays finite where p underflows to 0.
    """
    res = stats.ttest_ind(a, b, equal_var=False)
    t, df = float(res.statistic), float(res.df)
    log10_p = (math.log(2.0) + float(stats.t.logsf(abs(t), df))) / math.log(10.0)
    return {"t": t, "p": float(res.pvalue), "log10_p": log10_p, "df": df,
            "cohens_d": cohens_d(a, b), "n_a": int(np.size(a)), "n_b": int(np.size(b))}


def symmetry_stats(maps: dict[str, np.ndarray], points: torch.Tensor) -> dict[str, float]:
    """Ratios r_id, r_A, r_B (normalized maps) and the Welch test of log(U_A/U_B) (raw maps).

    maps: raw "identity", "U_A", "U_B" values (G,) at ``points`` (G, 2).
    """
    top, bottom = half_masks(points)
    out = {f"r_{k}": top_bottom_ratio(normalize01(maps[m]), top, bottom)
           for k, m in (("id", "identity"), ("A", "U_A"), ("B", "U_B"))}
    log_ratio = np.log(maps["U_A"]) - np.log(maps["U_B"])
    w = welch_test(log_ratio[top], log_ratio[bottom])
    out.update(t=w["t"], p=w["p"], log10_p=w["log10_p"], cohens_d=w["cohens_d"],
               n_top=w["n_a"], n_bottom=w["n_b"])
    return out


def seed_summary(name: str, rows: list[dict]) -> dict:
    """Mean and SD (ddof 1) over seeds of r_id, r_A, r_B, t and Cohen's d for one problem."""
    out: dict = {"problem": name, "n_seeds": len(rows)}
    for k in ("r_id", "r_A", "r_B", "t", "cohens_d"):
        v = np.array([r[k] for r in rows], dtype=np.float64)
        out[f"{k}_mean"] = float(v.mean())
        out[f"{k}_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
    return out


# --------------------------------------------------------------------------- curvature / maps


def half_fishers(
    model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, top: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empirical Fishers (P, P) float64 of the summed Bernoulli NLL on X[top] and X[~top].

    model: one-logit binary classifier; X (N, 2); y (N,) in {0, 1}; top (N,) bool.
    H = Σₙ ∇θℓₙ ∇θℓₙᵀ over the half (no rescaling to the full data size).
    """
    params = dict(model.named_parameters())

    def ef(mask: torch.Tensor) -> torch.Tensor:
        return curvature(model, params, X[mask], y[mask], likelihood="classification", kind="ef")

    return ef(top), ef(~top)


def uncertainty_maps(
    model: torch.nn.Module,
    points: torch.Tensor,
    H_A: torch.Tensor,
    H_B: torch.Tensor,
    prior_precision: float,
) -> dict[str, np.ndarray]:
    """Raw epistemic maps (G,) at points (G, 2) with g = ∇θ p(y=1|x): identity ‖g‖², U_A, U_B.

    Also returns "p": p(y=1 | x, θ*) (G,). U_X = gᵀ(H_X + λI)⁻¹g with λ = prior_precision.
    """
    ident = score_classifier(model, points)
    out = {"identity": ident.epistemic[:, 1], "p": ident.probs[:, 1]}
    for key, H in (("U_A", H_A), ("U_B", H_B)):
        s = score_classifier(model, points, covariance=Dense(H, prior_precision),
                             method="functorch")
        out[key] = s.epistemic[:, 1]
    return {k: v.detach().double().numpy() for k, v in out.items()}


# --------------------------------------------------------------------------- one problem


@dataclass
class ProblemResult:
    """Everything one problem produces: the statistics row, the maps and what plotting needs."""

    name: str
    problem: Problem
    top: np.ndarray
    maps: dict[str, np.ndarray]
    row: dict
    coarse_row: dict
    fit: dict


def run_problem(
    name: str,
    *,
    seed: int = 0,
    n_train: int | None = None,
    grid_n: int = 100,
    coarse_grid_n: int = 16,
    width: int = 32,
    prior_precision: float = 1.0,
    adam_steps: int = 1000,
    lbfgs_iter: int = 2000,
) -> ProblemResult:
    """Train, estimate H_A/H_B and evaluate the maps for problem ``name`` (see :data:`PROBLEMS`)."""
    if name not in PROBLEMS:
        raise InputError(f"unknown problem {name!r}; choose from {', '.join(PROBLEMS)}")
    problem = make_problem(PROBLEMS[name], n_train=n_train, seed=seed, grid_n=grid_n)
    spec = tm.mlp2(2, width, 1)
    model = tm.build(spec, seed=seed)
    fit = tm.train_map(model, problem.X, problem.y, "binary", prior_precision,
                       adam_steps=adam_steps, lbfgs_iter=lbfgs_iter)
    model = model.double()
    X = problem.X.double()
    top, _ = problem.top_bottom_split()
    H_A, H_B = half_fishers(model, X, problem.y, top)
    maps = uncertainty_maps(model, problem.grid.double(), H_A, H_B, prior_precision)
    coarse = evaluation_grid(problem, coarse_grid_n).double()
    coarse_maps = uncertainty_maps(model, coarse, H_A, H_B, prior_precision)
    with torch.no_grad():
        acc = float(((model(X)[:, 0] > 0).long() == problem.y).double().mean())
    row = {"problem": name, **symmetry_stats(maps, problem.grid)}
    crow = {"problem": name, "grid": f"{coarse_grid_n}x{coarse_grid_n}",
            **symmetry_stats(coarse_maps, coarse)}
    info = {"problem": name, "n_params": spec.n_params, "n_train": problem.n_train,
            "n_top": int(top.sum()), "n_bottom": int((~top).sum()), "train_acc": acc,
            "H_A_trace": float(H_A.trace()), "H_B_trace": float(H_B.trace()),
            **{f"map_{k}": v for k, v in fit.to_dict().items()}}
    return ProblemResult(name, problem, top.numpy(), maps, row, crow, info)


# --------------------------------------------------------------------------- figure


def plot_problem(res: ProblemResult, path: Path) -> Path:
    """Five panels: data with the split | identity | U_A | U_B (normalized) | log(U_A/U_B)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pr = res.problem
    shape, ext = pr.grid_shape, pr.extent
    fig, axes = plt.subplots(1, 5, figsize=(19, 3.9), constrained_layout=True)
    X, y, top = pr.X.numpy(), pr.y.numpy(), res.top
    ax = axes[0]
    for mask, marker, half in ((top, "^", "top (A)"), (~top, "v", "bottom (B)")):
        for c, col in ((0, "tab:blue"), (1, "tab:red")):
            m = mask & (y == c)
            ax.scatter(X[m, 0], X[m, 1], s=9, c=col, marker=marker, alpha=0.7,
                       label=f"{half}, y={c}")
    ax.axhline(0.0, color="k", lw=1.2, ls="--")
    ax.set(xlim=ext[:2], ylim=ext[2:], title=f"{res.name}: data, split at x₂ = 0", aspect="equal")
    ax.legend(fontsize=6, loc="upper right", framealpha=0.8)
    panels = (("identity", "Identity ‖g‖² (C = I)"), ("U_A", "Proxy $H_A^{-1}$ (top half)"),
              ("U_B", "Proxy $H_B^{-1}$ (bottom half)"))
    p = res.maps["p"].reshape(shape)
    for ax, (key, title) in zip(axes[1:4], panels, strict=True):
        im = ax.imshow(normalize01(res.maps[key]).reshape(shape), origin="lower", extent=ext,
                       cmap="viridis", vmin=0, vmax=1)
        ax.contour(p, levels=[0.5], extent=ext, colors="w", linewidths=0.8)
        ax.axhline(0.0, color="w", lw=0.6, ls=":")
        ax.set(title=title, aspect="equal")
    fig.colorbar(im, ax=axes[1:4], shrink=0.85, label="normalized uncertainty")
    lr = np.log(res.maps["U_A"]) - np.log(res.maps["U_B"])
    vmax = float(np.abs(lr).max())
    im = axes[4].imshow(lr.reshape(shape), origin="lower", extent=ext, cmap="RdBu_r",
                        vmin=-vmax, vmax=vmax)
    axes[4].axhline(0.0, color="k", lw=0.6, ls=":")
    axes[4].set(title="log($U_A/U_B$)", aspect="equal")
    fig.colorbar(im, ax=axes[4], shrink=0.85)
    r = res.row
    fig.suptitle(f"{res.name}: r_id {r['r_id']:.2f}, r_A {r['r_A']:.2f}, r_B {r['r_B']:.2f}; "
                 f"Welch t {r['t']:.1f}, d {r['cohens_d']:.2f}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- entry point


def run(out: Path, *, quick: bool = False, seed: int = 0, device: str = "cpu",
        problems: list[str] | None = None, n_train: int | None = None, **options) -> Path:
    """Run the experiment into ``out`` (results.json, tables.md, one PNG per problem).

    options: fields of :class:`Settings`; each one given (not None) overrides the preset
    (``--quick`` or the full run), so 0 is honoured; an unknown one is an InputError.
    """
    started = time.time()
    out = Path(out)
    cfg = resolve(PRESETS["quick" if quick else "full"], options)
    out.mkdir(parents=True, exist_ok=True)
    names = list(problems or PROBLEMS)
    settings = {
        "problems": {n: PROBLEMS[n] for n in names},
        "grid_n": cfg.grid_n,
        "coarse_grid_n": cfg.coarse_grid_n,
        "n_train": n_train,
        "width": cfg.width,
        "prior_precision": cfg.prior_precision,
        "adam_steps": cfg.adam_steps,
        "lbfgs_iter": cfg.lbfgs_iter,
    }
    from tqdm.auto import tqdm

    n_seeds = cfg.seeds
    settings["seeds"] = list(range(seed, seed + n_seeds))
    jobs = [(s, name) for s in settings["seeds"] for name in names]
    runs: dict[tuple[int, str], ProblemResult] = {}
    for s, name in tqdm(jobs, desc=NAME, unit="problem"):
        runs[(s, name)] = run_problem(
            name, seed=s, n_train=settings["n_train"], grid_n=settings["grid_n"],
            coarse_grid_n=settings["coarse_grid_n"], width=settings["width"],
            prior_precision=settings["prior_precision"], adam_steps=settings["adam_steps"],
            lbfgs_iter=settings["lbfgs_iter"])
    results = [runs[(seed, name)] for name in names]
    figures = [plot_problem(r, out / f"proxy_bias_2d_{r.name}.png").name for r in results]
    settings.update(
        quick=quick, device="cpu (toy models always run on CPU)", requested_device=device,
        model="tanh MLP 2→w→w→1, one logit, Bernoulli likelihood, MAP (Adam then L-BFGS)",
        curvature="empirical Fisher Σ∇ℓ∇ℓᵀ of the summed NLL over each half (no rescaling), "
                  "+ prior_precision·I",
        split="training data: top x2 > 0 (H_A), bottom x2 <= 0 (H_B); grid: x2 > 0 vs x2 < 0",
        normalization="min-max to [0, 1] per map; ratios on normalized maps; "
                      "log(U_A/U_B) on raw values",
        gradient="g = d p(y=1|x) / d theta, all parameters",
        cohens_d="pooled SD (ddof=1)", welch="scipy.stats.ttest_ind(top, bottom, equal_var=False)",
    )
    tables = {"symmetry": [r.row for r in results],
              "symmetry_coarse_grid": [r.coarse_row for r in results],
              "models": [r.fit for r in results]}
    if n_seeds > 1:
        tables["symmetry_over_seeds"] = [
            seed_summary(name, [runs[(s, name)].row for s in settings["seeds"]])
            for name in names]
    return write_results(
        out, NAME, settings=settings, seed=seed, started=started, tables=tables,
        paper=PAPER, figures=figures,
    )
