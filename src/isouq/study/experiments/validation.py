"""Validation against reference posteriors (paper §4.1, App. F): ``isouq experiment validation``.

For each synthetic problem: train the paper's model to its MAP θ* (isotropic Gaussian prior,
precision λ), sample the posterior with HMC (NumPyro, several chains, R-hat/ESS on p(x)), and
compare on the dense evaluation grid
  epistemic: GN ‖∇θ p_c‖² (``score_classifier``) and LA gᵀ(H + λI)⁻¹g vs Var_HMC[p_c];
  aleatoric: PE p_c(1 − p_c) at θ* vs E_HMC[p_c(1 − p_c)];
  regression: GN ‖∇θ f‖² and LA vs Var_HMC[f], plus the eigenvalue range at θ* of the
  Gauss-Newton curvature JᵀJ/σ² + λI (and of the exact Hessian of −log posterior),
with Pearson r and Spearman ρ. Binary models have one logit, so classes 0 and 1 give the same
values and class 1 is used; multiclass reports each class and "overall" (all classes pooled).
Writes results.json (tables + the paper's numbers), tables.md and one PNG per problem.
Resumable: each finished problem appends its rows to ``out/problems.jsonl`` (key = problem, with
the settings that made it); a re-run with the same settings skips it, other settings are an error.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr

from ...data.synthetic import Problem, make_problem
from ...errors import InputError
from ...models import toy as tm
from ...runio import JsonlWriter, check_resume, read_jsonl, write_results
from .settings import resolve
from .settings.validation import GRID_N, HMC_PRESETS, PROBLEMS

#: The paper's numbers (Tables 1, 4–7 and App. F), keyed like our tables.
PAPER = {
    "epistemic": [
        {"problem": "binary_linear", "gn_r": 0.95, "gn_rho": 0.99, "la_r": 0.95, "la_rho": 0.99,
         "gn_la_r": 1.00, "gn_la_rho": 1.00},
        {"problem": "binary_xor", "gn_r": 0.65, "gn_rho": 0.68, "la_r": 0.68, "la_rho": 0.70,
         "gn_la_r": 0.94, "gn_la_rho": 0.98},
        {"problem": "binary_rings", "gn_r": 0.86, "gn_rho": 0.44, "la_r": 0.86, "la_rho": 0.46,
         "gn_la_r": 0.97, "gn_la_rho": 1.00},
        {"problem": "multiclass_clusters", "gn_r": 0.86, "gn_rho": 0.97},
        {"problem": "multiclass_spirals", "gn_r": 0.76, "gn_rho": 0.91},
        {"problem": "multiclass_rings", "gn_r": 0.88, "gn_rho": 0.97},
        {"problem": "regression_linear", "gn_r": 0.98, "gn_rho": 0.99, "la_r": 1.00,
         "la_rho": 1.00},
        {"problem": "regression_nonlinear", "gn_r": 0.73, "gn_rho": 0.81, "la_r": 0.93,
         "la_rho": 0.97},
    ],
    "aleatoric": [
        {"problem": "binary_linear", "pe_r": 0.99, "pe_rho": 1.00},
        {"problem": "binary_xor", "pe_r": 0.76, "pe_rho": 0.74},
        {"problem": "binary_rings", "pe_r": 0.95, "pe_rho": 0.58},
        {"problem": "multiclass_clusters", "pe_r": 0.95, "pe_rho": 0.99},
        {"problem": "multiclass_spirals", "pe_r": 0.96, "pe_rho": 0.97},
        {"problem": "multiclass_rings", "pe_r": 0.96, "pe_rho": 0.98},
    ],
    "hessian": [
        {"problem": "regression_linear", "eig_min": 395.0, "eig_max": 1281.0, "ratio": 3.2},
        {"problem": "regression_nonlinear", "eig_min": 1.0, "eig_max": 14648.0, "ratio": 1.5e4},
    ],
}


#: What the evidence says where ours and the paper differ, per problem. Shown beside a metric
#: whose paper value lies outside mean ± 2 std over seeds (plus the paper's rounding,
#: :data:`PAPER_ROUNDING`), or, with one seed, differs by more than :data:`DIFF_NOTE_AT`.
#: Written from ``isouq experiment validation --seeds 5`` (full settings, seeds 0-4, every
#: R-hat ≤ 1.02): data, MAP and chains re-drawn per seed. Causes are hypotheses, said so.
DIFF_NOTES = {
    "binary_linear": "ours is closer to 1 than the paper on every metric, with a spread of "
                     "≤ 0.002 over seeds: a real difference, in the direction of agreement; a "
                     "3-parameter logistic regression is nearly linear in θ, so GN and LA track "
                     "the posterior variance almost exactly (our data and grid are our own).",
    "binary_xor": "GN Pearson is higher than the paper's (0.80 ± 0.01 vs 0.65) while the "
                  "Spearman values agree within the seed spread; GN–LA Pearson is lower (0.68 ± "
                  "0.06 vs 0.94) though their Spearman agrees (0.98): a few grid points where "
                  "LA's curvature weighting is extreme set Pearson, not the ranking. PE tracks "
                  "the reference aleatoric more closely than the paper's (r 0.96 ± 0.01 vs "
                  "0.76).",
    "binary_rings": "Spearman is far below the paper's for GN and LA alike (0.09 ± 0.08 and "
                    "0.14 ± 0.08 vs 0.44 / 0.46) while Pearson is close: a real difference, not "
                    "seed noise. Hypothesis: the rank is set by the large region far from the "
                    "rings where both variances are tiny, and how large it is depends on the "
                    "grid and ring radii, which the paper does not give.",
    "multiclass_clusters": "ours is closer to 1 than the paper (Pearson 0.955 ± 0.012 vs "
                           "0.86): a real difference, in the direction of agreement, for a "
                           "12-parameter softmax regression.",
    "multiclass_spirals": "GN (0.56 ± 0.03 / 0.66 ± 0.02) and PE (0.88 / 0.87) are below the "
                          "paper's on every seed; LA is as low as GN (ρ 0.70) and GN–LA ρ is "
                          "0.99, so the gap is in the linearization around our MAPs, not in the "
                          "isotropic covariance. Hypothesis: the spiral generator (turns, "
                          "noise), which the paper does not give in full.",
    "multiclass_rings": "Pearson agrees with the paper within the seed spread (0.869 ± 0.011 "
                        "vs 0.88); Spearman is lower on every seed (0.755 ± 0.014 vs 0.97), for "
                        "LA too (0.77): as for binary rings, the order of near-zero variances "
                        "far from the data sets the rank (see the per-class rows).",
    "regression_linear": "ours is at or above the paper's on every seed (GN ≥ 0.99): a linear "
                         "model, where GN is proportional to the exact variance.",
    "regression_nonlinear": "GN is below the paper's on every seed (r 0.57 ± 0.07, ρ 0.38 ± "
                            "0.04 vs 0.73 / 0.81) while LA tracks the reference (0.98): the "
                            "curvature spans four orders of magnitude (eigenvalues 1 to "
                            "1.4·10⁴ ± 0.2·10⁴, as the paper's 14,648), so the isotropic ‖g‖² "
                            "and gᵀH⁻¹g weight directions very differently; how much that costs "
                            "GN depends on data and MAP, which differ from the paper's.",
}
#: Half a unit of the paper's last digit: its numbers are rounded to two decimals.
PAPER_ROUNDING = 0.005
DIFF_NOTE_AT = 0.15

#: The HMC settings a row's fingerprint names (``init`` only when not the default "prior").
HMC_KEYS = ("num_warmup", "num_samples", "num_chains", "kernel")


def versus_paper(epistemic: list[dict], aleatoric: list[dict]) -> list[dict]:
    """Ours beside the paper's number, per problem and metric (multiclass: 'overall').

    Rows from several seeds (:func:`aggregate`: ``{metric}_std``, ``n_seeds``) add ``std``,
    ``n_seeds`` and ``outside_2sd`` (the paper's number lies outside mean ± 2 std over
    seeds, widened by the paper's rounding :data:`PAPER_ROUNDING`); the note is then given
    only there (a difference inside the seed spread is not evidence of one). One seed: the
    note where |ours − paper| > :data:`DIFF_NOTE_AT`.
    """
    ours = {r["problem"]: r for r in epistemic + aleatoric
            if r["class"] in ("all", "overall") and "gn_r" in r}
    ours_al = {r["problem"]: r for r in aleatoric if r["class"] in ("all", "overall")}
    rows = []
    for table, got in (("epistemic", ours), ("aleatoric", ours_al)):
        for ref in PAPER[table]:
            mine = got.get(ref["problem"])
            if mine is None:
                continue
            for metric, want in ref.items():
                if metric == "problem" or mine.get(metric) is None:
                    continue
                diff = float(mine[metric]) - want
                row = {"problem": ref["problem"], "metric": metric,
                       "ours": float(mine[metric]), "paper": want, "diff": diff}
                std = mine.get(f"{metric}_std")
                if std is not None and mine.get("n_seeds", 1) >= 2:
                    outside = bool(abs(diff) > 2 * float(std) + PAPER_ROUNDING)
                    row.update(std=float(std), n_seeds=int(mine["n_seeds"]),
                               outside_2sd=outside)
                    flag = outside
                else:
                    flag = abs(diff) > DIFF_NOTE_AT
                row["note"] = DIFF_NOTES.get(ref["problem"], "") if flag else ""
                rows.append(row)
    return rows


#: Columns that identify a table row (not averaged over seeds).
ID_COLUMNS = ("problem", "class", "model", "n_params", "n_train")


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean ± std over seeds of per-seed rows (each with ``seed``), per (problem, class).

    Returns one row per (problem, class) in first-seen order: the identifying columns, every
    numeric column as its mean over the seeds where it is finite, ``{column}_std`` (sample
    std, ddof = 1; NaN with one value) and ``n_seeds``.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["problem"], r.get("class")), []).append(r)
    out = []
    for g in groups.values():
        row = {k: g[0][k] for k in ID_COLUMNS if k in g[0]}
        for k in g[0]:
            if k in ID_COLUMNS or k == "seed":
                continue
            vals = [r.get(k) for r in g]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       for v in vals if v is not None):
                continue
            v = np.array([x for x in vals if x is not None], dtype=float)
            v = v[np.isfinite(v)]
            row[k] = float(v.mean()) if v.size else float("nan")
            row[f"{k}_std"] = float(v.std(ddof=1)) if v.size > 1 else float("nan")
        row["n_seeds"] = len(g)
        out.append(row)
    return out


def seed_key(name: str, seed: int) -> str:
    """Row key in ``problems.jsonl``: the problem name for seed 0, ``"name@seed3"`` else."""
    return name if seed == 0 else f"{name}@seed{seed}"


def parse_key(key: str) -> tuple[str, int]:
    """(problem, seed) of a row key (:func:`seed_key`)."""
    name, _, s = key.partition("@seed")
    return name, int(s) if s else 0


# --------------------------------------------------------------------------- statistics


def correlate(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(Pearson r, Spearman ρ) of two flat arrays; NaN when either is constant."""
    a, b = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    return float(pearsonr(a, b).statistic), float(spearmanr(a, b).statistic)


def _columns(values: np.ndarray, task: str) -> dict[str, np.ndarray]:
    """{label: values} to correlate: binary class 1; multiclass each class and 'overall'."""
    if task == "regression":
        return {"all": values}
    if task == "binary":
        return {"all": values[:, 1]}
    out = {str(c): values[:, c] for c in range(values.shape[1])}
    out["overall"] = values.ravel()
    return out


def compare(est: np.ndarray, ref: np.ndarray, task: str) -> dict[str, tuple[float, float]]:
    """(r, ρ) of an estimate against the reference, per column of :func:`_columns`."""
    e, r = _columns(est, task), _columns(ref, task)
    return {k: correlate(e[k], r[k]) for k in e}


def hessian_eigenvalues(model: torch.nn.Module, problem: Problem, prior_precision: float):
    """Eigenvalues (D,) of the exact Hessian of −log posterior at θ* (float64; small models)."""
    work = tm.build(tm.spec_of(model)).double()
    work.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    names = [n for n, _ in work.named_parameters()]
    shapes = [p.shape for p in work.parameters()]
    theta0 = torch.cat([p.detach().reshape(-1) for p in work.parameters()])
    y = problem.y.double() if problem.task != "multiclass" else problem.y

    def f(theta: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for n, s in zip(names, shapes, strict=True):
            k = int(np.prod(s))
            params[n] = theta[i : i + k].reshape(s)
            i += k
        out = torch.func.functional_call(work, params, (problem.X.double(),))
        nll = tm.neg_log_likelihood(out, y, problem.task, problem.noise_std)
        return nll + 0.5 * prior_precision * (theta**2).sum()

    H = torch.autograd.functional.hessian(f, theta0)
    return torch.linalg.eigvalsh(H).numpy()


def ggn_eigenvalues(model: torch.nn.Module, problem: Problem, prior_precision: float):
    """Eigenvalues (D,) of the Gauss-Newton JᵀJ/σ² + λI at θ* (regression; PSD, ≥ λ)."""
    work = tm.build(tm.spec_of(model)).double()
    work.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    params = dict(work.named_parameters())
    detached = {k: v.detach() for k, v in params.items()}

    def f(p: dict) -> torch.Tensor:
        return torch.func.functional_call(work, p, (problem.X.double(),))[:, 0]

    jac = torch.func.jacrev(f)(detached)
    J = torch.cat([j.reshape(j.shape[0], -1) for j in jac.values()], dim=1)
    G = J.T @ J / problem.noise_std**2 + prior_precision * torch.eye(J.shape[1],
                                                                     dtype=torch.float64)
    return torch.linalg.eigvalsh(G).numpy()


# --------------------------------------------------------------------------- one problem


def _scores(model, problem: Problem, grid: torch.Tensor, prior_precision: float, device: str):
    """GN and LA scores at θ* on the grid, as numpy arrays."""
    from ...estimators import score_classifier, score_regressor

    model = model.to(device)
    g = grid.to(device)
    data = (problem.X.to(device), problem.y.to(device))
    if problem.task == "regression":
        gn = score_regressor(model, g)
        la = score_regressor(model, g, covariance="laplace", data=data,
                             prior_precision=prior_precision, sigma_noise=problem.noise_std)
        return {"gn": gn.epistemic, "la": la.epistemic, "mean": gn.mean}
    gn = score_classifier(model, g)
    la = score_classifier(model, g, covariance="laplace", data=data,
                          prior_precision=prior_precision)
    return {"gn": gn.epistemic, "la": la.epistemic, "pe": gn.aleatoric, "probs": gn.probs}


def run_problem(
    name: str,
    kind: str,
    *,
    seed: int,
    grid_n: int | None,
    prior_precision: float,
    hmc: dict,
    device: str = "cpu",
) -> dict:
    """Train, sample and score one problem; return arrays and table rows (JSON-ready rows)."""
    from ..reference import hmc_reference, prepare_jax

    prepare_jax()  # before JAX computes: one CPU device per chain
    problem = make_problem(name, seed=seed, grid_n=grid_n)
    spec = tm.spec_for(problem, kind)
    model = tm.build(spec, seed=seed)
    fit = tm.train_map(model, problem.X, problem.y, problem.task, prior_precision,
                       noise_std=problem.noise_std)
    hmc = dict(hmc)
    if hmc.pop("init", "prior") == "map":  # chains start at θ* + 0.1·noise
        from ..reference import flat_params

        hmc.update(init=flat_params(model), init_jitter=0.1)
    ref = hmc_reference(problem, spec, prior_precision=prior_precision, seed=seed, **hmc)
    sc = {k: v.detach().cpu().double().numpy() for k, v in
          _scores(model, problem, problem.grid, prior_precision, device).items()}
    ref_epi, ref_alea = ref.epistemic.numpy(), ref.aleatoric.numpy()
    d = ref.diagnostics
    base = {"problem": name, "model": spec.label(), "n_params": spec.n_params,
            "n_train": problem.n_train}
    diag_row = {**base, "map_grad_norm": fit.grad_norm, "r_hat_max": d.get("r_hat_max"),
                "r_hat_median": d.get("r_hat_median"), "ess_min": d.get("ess_min"),
                "ess_median": d.get("ess_median"), "accept_prob": d["accept_prob"],
                "divergences": d["divergences"], "step_size": float(np.mean(d["step_size"])),
                "hmc_seconds": d["seconds"], "warnings": "; ".join(d["warnings"])}
    epi_rows, alea_rows = [], []
    gn_c = compare(sc["gn"], ref_epi, problem.task)
    la_c = compare(sc["la"], ref_epi, problem.task)
    gl_c = compare(sc["gn"], sc["la"], problem.task)
    for col in gn_c:
        row = {**base, "class": col, "gn_r": gn_c[col][0], "gn_rho": gn_c[col][1],
               "la_r": la_c[col][0], "la_rho": la_c[col][1],
               "gn_la_r": gl_c[col][0], "gn_la_rho": gl_c[col][1]}
        epi_rows.append(row)
    if problem.task != "regression":
        pe_c = compare(sc["pe"], ref_alea, problem.task)
        alea_rows = [{**base, "class": col, "pe_r": v[0], "pe_rho": v[1]}
                     for col, v in pe_c.items()]
    hess_row = None
    if problem.task == "regression":
        ev = ggn_eigenvalues(model, problem, prior_precision)
        hv = hessian_eigenvalues(model, problem, prior_precision)
        hess_row = {**base, "eig_min": float(ev.min()), "eig_max": float(ev.max()),
                    "ratio": float(ev.max() / ev.min()), "hessian_eig_min": float(hv.min()),
                    "hessian_eig_max": float(hv.max())}
    return {"problem": problem, "ref": ref, "scores": sc, "fit": fit, "epistemic": epi_rows,
            "aleatoric": alea_rows, "diagnostics": diag_row, "hessian": hess_row}


# --------------------------------------------------------------------------- figures


def _unit(v: np.ndarray) -> np.ndarray:
    lo, hi = float(np.min(v)), float(np.max(v))
    return (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)


def plot_problem(res: dict, out: Path) -> Path:
    """One PNG per problem: maps (MCMC | GN | LA; aleatoric MCMC | PE) or regression curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p: Problem = res["problem"]
    ref, sc = res["ref"], res["scores"]
    path = out / f"validation_{p.name}.png"
    if p.task == "regression":
        x = p.grid[:, 0].numpy()
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        band = 2 * np.sqrt(ref.epistemic.numpy() + ref.aleatoric.numpy())
        a1.fill_between(x, ref.mean.numpy() - band, ref.mean.numpy() + band, color="C0",
                        alpha=0.25, label="HMC predictive ±2 sd")
        a1.scatter(p.X[:, 0], p.y, s=5, c="gray", label="data")
        a1.plot(x, p.f_grid.numpy(), "k:", label="true f")
        a1.plot(x, sc["mean"], "r--", label="MAP")
        a1.legend(fontsize=7)
        a1.set_title(p.name)
        a2.plot(x, _unit(sc["gn"]), "g-", label="GN ‖g‖²")
        a2.plot(x, _unit(sc["la"]), color="orange", label="LA")
        a2.plot(x, _unit(ref.epistemic.numpy()), "r--", label="HMC Var f")
        a2.legend(fontsize=7)
        a2.set_title("epistemic (normalized)")
    else:
        c = 1 if p.task == "binary" else slice(None)
        maps = [("HMC epistemic", ref.epistemic.numpy()), ("GN ‖g‖²", sc["gn"]),
                ("LA", sc["la"]), ("HMC aleatoric", ref.aleatoric.numpy()),
                ("PE p(1−p)", sc["pe"])]
        fig, axes = plt.subplots(1, 5, figsize=(20, 4))
        for ax, (title, v) in zip(axes, maps, strict=True):
            v = v[:, c] if p.task == "binary" else v.sum(1)
            ax.imshow(_unit(v).reshape(p.grid_shape), origin="lower", extent=p.extent,
                      cmap="viridis")
            ax.scatter(p.X[:, 0], p.X[:, 1], c=p.y, s=3, cmap="coolwarm", alpha=0.5)
            ax.set_title(title + ("" if p.task == "binary" else " (sum over classes)"),
                         fontsize=9)
        fig.suptitle(f"{p.name}: {res['epistemic'][0]['model']}, maps normalized to [0, 1]")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- entry point


def run(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    device: str = "cpu",
    problems: list[str] | None = None,
    grid_n: int | None = None,
    prior_precision: float = 1.0,
    seeds: int | None = None,
    **options,
) -> Path:
    """Run the validation and write ``out/results.json``; returns its path.

    quick: the ``"quick"`` preset, 300 warmup + 300 draws per chain on a 30×30 grid (a few
    minutes on 2 cores); otherwise 1000 + 1000 on 60×60. ``options``: fields of
    :class:`HMCSettings` (``num_warmup``, ``num_samples``, ``num_chains``, ``kernel``,
    ``hmc_init``); each one given (not None) overrides the preset, an unknown one is an
    InputError.
    seeds: number of seeds (``seed``, ``seed`` + 1, …); each re-draws the data, the MAP's
    initialisation and the chains. With ≥ 2 seeds the ``epistemic``, ``aleatoric`` and
    ``hessian`` tables hold mean and ``*_std`` over seeds (:func:`aggregate`), the per-seed
    rows go to ``*_per_seed`` and ``versus_paper`` marks ``outside_2sd``. Every (problem,
    seed) is one resumable row; seed 0's rows are those of a plain run.
    """
    started = time.time()
    out = Path(out)
    known = {n: k for n, k in PROBLEMS}
    names = problems or [n for n, _ in PROBLEMS]
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"unknown problem(s) {bad}; choose from {', '.join(known)}")
    if seeds is not None and seeds < 1:
        raise InputError(f"seeds must be ≥ 1 (the number of seeds to run), got {seeds}")
    seed_list = [seed + i for i in range(seeds or 1)]
    preset = "quick" if quick else "full"
    hmc_settings = resolve(HMC_PRESETS[preset], options)
    hmc = hmc_settings.to_dict(HMC_KEYS)
    if hmc_settings.init != "prior":
        hmc["init"] = hmc_settings.init
    gn = GRID_N[preset] if grid_n is None else grid_n

    def fingerprint(name: str, s: int) -> dict:
        return {"seed": s, "prior_precision": prior_precision,
                "grid_n": None if "regression" in name else gn, **hmc}

    def expected(row: dict) -> dict | None:
        name, s = parse_key(row["key"])
        return fingerprint(name, s) if name in names and s in seed_list else None

    out.mkdir(parents=True, exist_ok=True)
    writer = JsonlWriter(out / "problems.jsonl")
    check_resume(read_jsonl(writer.path), expected, "problems.jsonl")
    for name in names:
        for s in seed_list:
            key = seed_key(name, s)
            if writer.done(key):
                print(f"validation: {key} already in problems.jsonl, skipped", flush=True)
                continue
            fp = fingerprint(name, s)
            t0 = time.time()
            res = run_problem(name, known[name], seed=s, grid_n=fp["grid_n"],
                              prior_precision=prior_precision, hmc=hmc, device=device)
            figure = plot_problem(res, out).name if s == seed_list[0] else None
            writer.write({"key": key, "settings": fp, "epistemic": res["epistemic"],
                          "aleatoric": res["aleatoric"], "diagnostics": res["diagnostics"],
                          "hessian": res["hessian"], "figure": figure,
                          "seconds": round(time.time() - t0, 1)})
            print(f"validation: {key} done ({time.time() - started:.0f} s)", flush=True)
    done = {r["key"]: r for r in read_jsonl(writer.path)}
    per_seed: dict[str, list[dict]] = {"epistemic": [], "aleatoric": [], "hessian": [],
                                       "diagnostics": []}
    figures = []
    for name in names:
        for s in seed_list:
            r = done[seed_key(name, s)]
            tag = {"seed": s} if len(seed_list) > 1 else {}
            per_seed["epistemic"] += [{**x, **tag} for x in r["epistemic"]]
            per_seed["aleatoric"] += [{**x, **tag} for x in r["aleatoric"]]
            per_seed["diagnostics"].append({**r["diagnostics"], **tag})
            if r["hessian"]:
                per_seed["hessian"].append({**r["hessian"], **tag})
            if r.get("figure"):
                figures.append(r["figure"])
    if len(seed_list) == 1:
        tables = per_seed
    else:
        tables = {k: aggregate(per_seed[k]) for k in ("epistemic", "aleatoric", "hessian")}
        tables["diagnostics"] = per_seed["diagnostics"]
        tables.update({f"{k}_per_seed": per_seed[k] for k in ("epistemic", "aleatoric",
                                                                "hessian")})
    tables["versus_paper"] = versus_paper(tables["epistemic"], tables["aleatoric"])
    settings = {"quick": quick, "device": device, "problems": names, "grid_n": gn,
                "prior_precision": prior_precision, **hmc}
    if len(seed_list) > 1:
        settings["seeds"] = seed_list
    # the time the kept rows took, over resumed runs (rows from before per-problem timing: HMC)
    took = sum(r.get("seconds", r["diagnostics"]["hmc_seconds"]) for r in done.values()
               if parse_key(r["key"])[0] in names and parse_key(r["key"])[1] in seed_list)
    return write_results(out, "validation", settings=settings, seed=seed, started=started,
                         tables=tables, paper=PAPER, figures=figures,
                         extra={"compute_seconds": round(took, 1)})
