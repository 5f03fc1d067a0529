"""Scaling study (paper §4.1.2, App. F): does GN ‖∇θ p_c‖² track the posterior as models grow?

Two studies, one row per model size, on a dense evaluation grid over [−3, 3]²:

A. ``hmc``: 4-class rings (``multiclass_rings``, N = 400), softmax regression (12 parameters)
   then tanh MLP(w, w) for w = 8, 16, 32, 64, 128, 256, 512, 1028 (132 … 1,065,012 parameters;
   the paper's counts imply 4 outputs). Per size: MAP θ* (``models.toy.train_map``), an HMC
   reference (``reference.hmc_reference``, several chains, R-hat / ESS of p(x) recorded), and
   GN = ``score_classifier(model, grid).epistemic`` at θ* (identity covariance).
B. ``vi``: 4-class Gaussian clusters (``multiclass_clusters``, N = 4,000), MLP(w, w) for
   w = 8 … 8192 (132 … 6.7·10⁷ parameters); a mean-field Gaussian reference
   (``reference.vi_reference``, stochastic VI); GN at the variational mean μ (loaded into the
   torch model). The ELBO trace of every size is saved (``elbo/vi_w{w}.csv`` and one PNG).
   ``vi_prior="fan_in"`` (weights' prior variance 1/(λ·fan_in)) and ``vi_elbo="analytic_kl"``
   (closed-form KL) give the reference that converges at large D: with the isotropic N(0, 1)
   prior the posterior std of nearly every weight of a wide layer stays at the prior's 1.0.

Compared: GN vs the reference epistemic Var[p_c] and PE p_c(1 − p_c) vs the reference aleatoric
E[p_c(1 − p_c)], Pearson r and Spearman ρ per class and pooled over classes ("overall", the
paper's number).

Resumable: each finished size appends one row to ``out/sizes.jsonl`` (key ``"study:width"``,
width 0 = softmax regression); a re-run skips finished sizes, and results.json, tables.md and
the figures are rebuilt from every finished row after each size. Sizes run cheapest first
(by parameter count, the two studies interleaved). ``budget_minutes``: no size starts once
the budget is spent, nor one whose predicted time (from the finished sizes of its study,
time ∝ D^α) would overrun it; each run's record (budget, sizes run, sizes left) is kept in
``out/runs.jsonl``. The torch side (MAP, GN) runs on ``device``; JAX picks its own.

Within a size, the HMC run is checkpointed after every segment of a few minutes
(``out/checkpoints/hmc_w{width}/``: sampler state, RNG keys, adaptation, draws so far; see
:mod:`isouq.study.reference.checkpoint`): a killed run re-run with the same command resumes where
it stopped, with exactly the draws of an uninterrupted run. Sizes above
:data:`COMPACT_CHECKPOINT_ABOVE` parameters (MLP(1028,1028)) run ``compact``
(``hmc_reference(compact=True)``): no draws, running sums of the predictive statistics, and a
checkpoint of ~40 MB in ``out/compact_checkpoints/hmc_w{width}/`` that is kept in git, so the
run survives a change of machine. One process at a time may write an ``out`` (a second one
is refused).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...data.synthetic import Problem, make_problem
from ...errors import InputError
from ...models import toy as tm
from ...runio import JsonlWriter, check_resume, exclusive, read_jsonl, write_results
from .settings import HMCSettings, VISettings, resolve, split_options
from .settings.scaling import (
    GRID_N,
    HMC_PRESETS,
    HMC_WIDTHS,
    VI_PRESETS,
    VI_WIDTHS,
)
from .validation import compare

NAME = "scaling"

STUDIES: tuple[str, ...] = ("hmc", "vi")
PROBLEM = {"hmc": "multiclass_rings", "vi": "multiclass_clusters"}
N_CLASSES = 4
VI_N_TRAIN = VISettings().n_train
#: Above this many parameters VI runs in float32 (see ``vi_reference``).
VI_FLOAT32_ABOVE = 1_000_000
#: VI reference options and their defaults (a row's settings name only the ones changed).
VI_OPTION_DEFAULTS = {"vi_prior": VISettings().prior, "vi_elbo": VISettings().elbo}


def vi_option(settings: dict | None, name: str) -> str:
    """A VI option of a study's settings (absent: its default, see ``VI_OPTION_DEFAULTS``)."""
    return (settings or {}).get(name, VI_OPTION_DEFAULTS[name])

#: Exponent α of the time model t ∝ D^α used to predict a size's time from a smaller one.
COST_EXPONENT = {"hmc": 1.5, "vi": 1.0}
HMC_MEMORY_BUDGET = 2 * 2**30
#: HMC sizes with more parameters run compact: no draws kept, running sums of the predictive
#: statistics, a checkpoint small enough for git (``hmc_reference(compact=True)``).
COMPACT_CHECKPOINT_ABOVE = 500_000
#: Thinning of a compact size: no draws are stored, so not the memory rule of
#: :func:`auto_thinning`; every 2nd draw (500 a chain) keeps the autocorrelations the ESS needs
#: within the ``ESS_MAX_LAG`` = 32 lags the running sums hold (64 iterations).
COMPACT_THINNING = 2
#: Figure x-ranges: the paper's parameter counts with a margin.
XLIM = {"hmc": (6.0, 2.5e6), "vi": (60.0, 1.5e8)}

#: The paper's numbers (§4.1.2, App. F).
PAPER: dict[str, list[dict]] = {
    "hmc": [
        {"width": w, "model": "LogReg" if w == 0 else f"MLP({w},{w})",
         "n_params": tm.MLPSpec(2, (w, w) if w else (), N_CLASSES).n_params, "gn_rho": rho}
        for w, rho in zip(HMC_WIDTHS, (0.97, 0.84, 0.89, 0.68, 0.82, 0.66, 0.78, 0.83, 0.87),
                          strict=True)
    ],
    "vi": [
        {"widths": "8 … 8192", "n_params": "132 … 6.7e7", "n_train": VI_N_TRAIN,
         "gn_rho": ">= 0.96 at every size",
         "gn_r": "U-shape over D, minimum near D ≈ N = 4,000"},
    ],
}


# --------------------------------------------------------------------------- sizes and plans


@dataclass(frozen=True)
class Job:
    """One (study, width) size of the study; width 0 is softmax regression."""

    study: str
    width: int

    @property
    def key(self) -> str:
        """The row key in ``sizes.jsonl``: ``"hmc:8"``."""
        return f"{self.study}:{self.width}"

    @property
    def spec(self) -> tm.MLPSpec:
        return spec_for_width(self.width)


def spec_for_width(width: int, n_classes: int = N_CLASSES, in_dim: int = 2) -> tm.MLPSpec:
    """Softmax regression (width 0) or MLP(width, width) with ``n_classes`` outputs.

    width 0 → 12 parameters, 8 → 132, 1028 → 1,065,012, 8192 → 67,174,404 (4 classes, 2D).
    """
    if width < 0:
        raise InputError(f"widths must be ≥ 0 (0 = softmax regression), got {width}")
    return tm.MLPSpec(in_dim, (width, width) if width else (), n_classes)


def model_label(width: int) -> str:
    """``"LogReg"`` for width 0, else ``"MLP(w,w)"``."""
    return "LogReg" if width == 0 else f"MLP({width},{width})"


def plan(studies: Iterable[str], widths: dict[str, Iterable[int]]) -> list[Job]:
    """Jobs of ``studies`` cheapest first: by parameter count, then HMC before VI.

    widths: {study: widths}; duplicates are dropped.
    """
    jobs = {Job(s, int(w)) for s in studies for w in widths[s]}
    return sorted(jobs, key=lambda j: (j.spec.n_params, STUDIES.index(j.study)))


def predict_seconds(job: Job, rows: Iterable[dict]) -> float | None:
    """Predicted wall time of ``job`` from the largest finished smaller size of its study.

    t = t₀ · (D / D₀)^α with α = :data:`COST_EXPONENT` (HMC: the step size shrinks and the
    trajectories lengthen as D grows; VI: one pass over D per step). None without such a row.
    """
    D = job.spec.n_params
    done = [r for r in rows if r.get("study") == job.study and r["n_params"] <= D]
    if not done:
        return None
    ref = max(done, key=lambda r: r["n_params"])
    return float(ref["seconds"]["total"]) * (D / ref["n_params"]) ** COST_EXPONENT[job.study]


def budget_decision(
    elapsed_s: float, budget_s: float | None, predicted_s: float | None
) -> str | None:
    """Why a size must not start (``"budget spent"``, ``"predicted to overrun"``) or None."""
    if budget_s is None:
        return None
    if elapsed_s >= budget_s:
        return "budget spent"
    if predicted_s is not None and elapsed_s + predicted_s > budget_s:
        return "predicted to overrun"
    return None


def auto_thinning(num_chains: int, num_samples: int, n_params: int,
                  budget_bytes: int = HMC_MEMORY_BUDGET) -> int:
    """Smallest thinning k so that num_chains · num_samples / k float64 draws of D fit."""
    need = num_chains * num_samples * n_params * 8
    return max(1, math.ceil(need / budget_bytes))


# --------------------------------------------------------------------------- comparisons


def correlation_fields(
    gn: np.ndarray, pe: np.ndarray, ref_epistemic: np.ndarray, ref_aleatoric: np.ndarray
) -> dict:
    """r / ρ of GN vs reference epistemic and PE vs reference aleatoric.

    All inputs (G, C). Returns ``gn_r``, ``gn_rho``, ``pe_r``, ``pe_rho`` pooled over classes
    ("overall") and ``per_class`` {class: {gn_r, gn_rho, pe_r, pe_rho}}.
    """
    e = compare(gn, ref_epistemic, "multiclass")
    a = compare(pe, ref_aleatoric, "multiclass")
    per = {c: {"gn_r": e[c][0], "gn_rho": e[c][1], "pe_r": a[c][0], "pe_rho": a[c][1]}
           for c in e}
    return {**per.pop("overall"), "per_class": per}


def gn_scores(model: torch.nn.Module, grid: torch.Tensor, device: str) -> dict[str, np.ndarray]:
    """GN epistemic ‖∇θ p_c‖² and PE p_c(1 − p_c), each (G, C) float64, and seconds."""
    from ...estimators import score_classifier

    t0 = time.perf_counter()
    sc = score_classifier(model.to(device), grid.to(device))
    return {"gn": sc.epistemic.detach().cpu().double().numpy(),
            "pe": sc.aleatoric.detach().cpu().double().numpy(),
            "seconds": time.perf_counter() - t0}


def _base_row(job: Job, problem: Problem, fingerprint: dict, device: str) -> dict:
    spec = job.spec
    return {"key": job.key, "study": job.study, "width": job.width,
            "model": model_label(job.width), "n_params": spec.n_params,
            "n_train": problem.n_train, "params_per_point": spec.n_params / problem.n_train,
            "n_grid": int(problem.grid.shape[0]), "device": device, "settings": fingerprint}


# --------------------------------------------------------------------------- one size


def is_compact(job: Job) -> bool:
    """Whether the HMC run of ``job`` is compact (above :data:`COMPACT_CHECKPOINT_ABOVE`)."""
    return job.study == "hmc" and job.spec.n_params > COMPACT_CHECKPOINT_ABOVE


def checkpoint_dir(out: Path, job: Job) -> Path:
    """Where the HMC run of ``job`` keeps its checkpoint: ``out/checkpoints/hmc_w{width}``,
    or for a compact size ``out/compact_checkpoints/hmc_w{width}``.

    ``out/checkpoints`` holds a ``.gitignore`` (the saved draws are ~1 GB from MLP(256,256)
    up); ``out/compact_checkpoints`` is kept in git (~40 MB a size, no draws). The directory
    of a size is removed once its row is in ``sizes.jsonl``.
    """
    folder = "compact_checkpoints" if is_compact(job) else "checkpoints"
    return Path(out) / folder / f"{job.study}_w{job.width}"


def in_progress_rows(out: Path) -> list[dict]:
    """One row per HMC size with a checkpoint in ``out/checkpoints`` (started, not finished),
    smallest first: the ``hmc_in_progress`` table, each row marked incomplete.

    Columns: ``model``, ``n_params``, ``status`` (``"incomplete: warmup"`` or
    ``"incomplete: sampling"``), ``iterations`` (done of total, per chain), ``hours_so_far``
    (sampling wall time summed over sessions), ``leapfrog_steps`` (all chains),
    ``ms_per_leapfrog_step`` and ``hours_left_at_recent_rate`` (the last 10 checkpoint segments,
    on the machine that ran them), ``as_of`` (the last checkpoint); ``checkpoint``
    (``"draws"``, or ``"compact"`` for a size in ``out/compact_checkpoints``), ``checkpoint_mb``
    (its files now), ``cpu_hours_so_far`` and ``cpu_hours_left_at_recent_rate`` (the process's
    CPU time, which does not count time stopped or starved; None before segments recorded it).
    """
    from ..reference.checkpoint import progress_summary, read_meta

    rows = []
    dirs = [*(Path(out) / "checkpoints").glob("hmc_w*"),
            *(Path(out) / "compact_checkpoints").glob("hmc_w*")]
    for d in sorted(dirs):
        width = d.name.removeprefix("hmc_w")
        meta = read_meta(d) if width.isdigit() else None
        if meta is None:
            continue
        p = progress_summary(meta)
        warmup = int((meta.get("fingerprint") or {}).get("num_warmup", 0))
        eta, ms, cpu_eta = p["eta_seconds"], p["ms_per_leapfrog_step"], p["eta_cpu_seconds"]
        files = [meta.get("state"), *meta.get("parts", []), *meta.get("files", [])]
        size = sum((d / f).stat().st_size for f in files if f and (d / f).exists())
        rows.append({
            "model": model_label(int(width)), "n_params": spec_for_width(int(width)).n_params,
            "status": "incomplete: " + ("warmup" if p["done"] < warmup else "sampling"),
            "iterations": f"{p['done']:,} of {p['total']:,}",
            "hours_so_far": round(p["seconds"] / 3600, 2),
            "leapfrog_steps": p["leapfrog_steps"],
            "ms_per_leapfrog_step": None if ms is None else round(ms, 2),
            "hours_left_at_recent_rate": None if eta is None else round(eta / 3600, 1),
            "as_of": p["updated"],
            "checkpoint": meta.get("layout", "draws"),
            "checkpoint_mb": round(size / 1e6, 1),
            "cpu_hours_so_far": round(p["cpu_seconds"] / 3600, 2) if p["cpu_seconds"] else None,
            "cpu_hours_left_at_recent_rate": None if cpu_eta is None
            else round(cpu_eta / 3600, 1)})
    return sorted(rows, key=lambda r: r["n_params"])


def record_progress(out: Path) -> list[dict]:
    """Print the ``hmc_in_progress`` rows and store them in ``out/results.json`` (its other
    tables untouched; ``tables.md`` rebuilt). Runs nothing; returns the rows."""
    from ...runio import update_tables

    rows = in_progress_rows(out)
    if not rows:
        print(f"{NAME}: no HMC size in progress in {out}")
    for r in rows:
        left = r["hours_left_at_recent_rate"]
        print(f"{NAME}: {r['model']} ({r['n_params']:,} params) {r['status']}, "
              f"{r['iterations']} iterations, {r['hours_so_far']} h so far"
              + ("" if left is None else f", about {left} h left at the recent rate")
              + ("" if r.get("cpu_hours_left_at_recent_rate") is None
                 else f" ({r['cpu_hours_left_at_recent_rate']} CPU-hours)")
              + f"; {r['checkpoint']} checkpoint {r['checkpoint_mb']} MB"
              + f" (as of {r['as_of']})", flush=True)
    if (Path(out) / "results.json").exists():
        update_tables(out, {"hmc_in_progress": rows})
    return rows


def run_hmc_size(job: Job, settings: dict, device: str = "cpu",
                 checkpoint: Path | None = None) -> dict:
    """Study A at one size: MAP, HMC reference, GN at θ*; a JSON-ready ``sizes.jsonl`` row.

    checkpoint: directory of the HMC checkpoint (``hmc_reference(checkpoint=...)``): a killed
    run resumes there, with exactly the draws an uninterrupted run would have made. A size
    above :data:`COMPACT_CHECKPOINT_ABOVE` parameters runs ``compact`` with
    :data:`COMPACT_THINNING`. With chains from prior draws (``init="prior"``) the MAP is
    trained after the HMC run, so a resumed session goes straight back to sampling.
    """
    from ..reference import flat_params, hmc_reference, prepare_jax

    prepare_jax()  # before JAX computes: one CPU device per chain
    problem = make_problem(PROBLEM["hmc"], seed=settings["seed"], grid_n=settings["grid_n"])
    spec = job.spec
    model = tm.build(spec, seed=settings["seed"]).to(device)

    def train():
        t = time.perf_counter()
        out = tm.train_map(model, problem.X.to(device), problem.y.to(device), problem.task,
                           settings["prior_precision"])
        return out, time.perf_counter() - t

    fit = t_map = None
    if settings["init"] != "prior":
        fit, t_map = train()
    compact = is_compact(job)
    thin = COMPACT_THINNING if compact else auto_thinning(settings["num_chains"],
                                                          settings["num_samples"], spec.n_params)
    init = None if settings["init"] == "prior" else flat_params(model)
    t1 = time.perf_counter()
    ref = hmc_reference(problem, spec, prior_precision=settings["prior_precision"],
                        seed=settings["seed"], num_warmup=settings["num_warmup"],
                        num_samples=settings["num_samples"], num_chains=settings["num_chains"],
                        kernel=settings["kernel"], init=init,
                        init_jitter=0.0 if init is None else 0.1, thinning=thin,
                        memory_budget_bytes=HMC_MEMORY_BUDGET, checkpoint=checkpoint,
                        compact=compact)
    t_ref = time.perf_counter() - t1
    if fit is None:
        fit, t_map = train()
    sc = gn_scores(model, problem.grid, device)
    d = ref.diagnostics
    row = _base_row(job, problem, settings, device)
    row.update(correlation_fields(sc["gn"], sc["pe"], ref.epistemic.numpy(),
                                  ref.aleatoric.numpy()))
    row["reference"] = {
        "method": ref.method, "thinning": thin, "r_hat_max": d.get("r_hat_max"),
        "r_hat_median": d.get("r_hat_median"), "ess_min": d.get("ess_min"),
        "ess_median": d.get("ess_median"), "accept_prob": d["accept_prob"],
        "divergences": d["divergences"], "step_size": float(np.mean(d["step_size"])),
        "num_steps_mean": d["num_steps_mean"], "chain_method": d["chain_method"],
        "leapfrog_steps": d["leapfrog_steps"], "resumed_at": d["resumed_at"],
        "warnings": d["warnings"]}
    if compact:
        row["reference"].update(checkpoint="compact", ess_truncated=d.get("ess_truncated"))
    row["map"] = fit.to_dict()
    # sampling time summed over every session of a resumed run (``reference`` is this one's)
    row["seconds"] = {"map": t_map, "reference": t_ref, "reference_sampling": d["seconds"],
                      "gn": sc["seconds"],
                      "total": t_map + d["seconds"] + d["seconds_predictive"] + sc["seconds"]}
    return row


def run_vi_size(job: Job, settings: dict, out: Path, device: str = "cpu") -> dict:
    """Study B at one size: mean-field VI, GN at μ; writes ``out/elbo/vi_w{w}.csv``; a row."""
    from ..reference import load_into, prepare_jax, vi_reference

    prepare_jax()  # before JAX computes (the HMC study may have run first)
    t0 = time.perf_counter()
    problem = make_problem(PROBLEM["vi"], n_train=settings["n_train"], seed=settings["seed"],
                           grid_n=settings["grid_n"])
    spec = job.spec
    dtype = "float32" if spec.n_params > VI_FLOAT32_ABOVE else "float64"
    ref = vi_reference(problem, spec, prior_precision=settings["prior_precision"],
                       num_steps=settings["vi_steps"], batch_size=settings["vi_batch_size"],
                       lr=settings["vi_lr"], num_predictive_draws=settings["vi_draws"],
                       seed=settings["seed"], dtype=dtype,
                       draw_budget_bytes=max(512 * 2**20, 16 * spec.n_params),
                       prior=vi_option(settings, "vi_prior"), elbo=vi_option(settings, "vi_elbo"))
    t_ref = time.perf_counter() - t0
    model = load_into(tm.build(spec, seed=settings["seed"]), ref.param_mean)
    sc = gn_scores(model, problem.grid, device)
    elbo_file = write_elbo(out, job.width, ref.elbo.numpy())
    d = ref.diagnostics
    row = _base_row(job, problem, settings, device)
    row.update(correlation_fields(sc["gn"], sc["pe"], ref.epistemic.numpy(),
                                  ref.aleatoric.numpy()))
    row["reference"] = {
        "method": ref.method, "dtype": dtype, "elbo_first": d["elbo_first"],
        "elbo_final": d["elbo_final"],
        "elbo_rel_change_last_10pct": d["elbo_rel_change_last_10pct"],
        "param_std_median": d["param_std_median"], "param_std_max": d["param_std_max"],
        "n_draws": d["n_draws"], "elbo_file": elbo_file}
    row["seconds"] = {"reference": t_ref, "reference_fit": d["seconds"],
                      "reference_predictive": d["seconds_predictive"], "gn": sc["seconds"],
                      "total": time.perf_counter() - t0}
    return row


def write_elbo(out: Path, width: int, elbo: np.ndarray) -> str:
    """Write the ELBO trace (steps,) as ``out/elbo/vi_w{width}.csv``; returns the relative path."""
    rel = Path("elbo") / f"vi_w{width}.csv"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(out / rel, np.column_stack([np.arange(len(elbo)), elbo]), delimiter=",",
               header="step,elbo", comments="", fmt=["%d", "%.6g"])
    return rel.as_posix()


def read_elbo(out: Path, rel: str) -> np.ndarray | None:
    """The ELBO trace (steps,) written by :func:`write_elbo`, or None if the file is gone."""
    path = out / rel
    if not path.exists():
        return None
    return np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)[:, 1]


# --------------------------------------------------------------------------- tables


def _rounded(v):
    return round(v, 4) if isinstance(v, float) else v


def build_tables(rows: list[dict], runs: list[dict]) -> dict[str, list[dict]]:
    """results.json tables from the finished rows (any order) and the run records."""
    rows = sorted(rows, key=lambda r: (STUDIES.index(r["study"]), r["n_params"]))
    main = {"hmc": [], "vi": []}
    per_class, diag = [], []
    for r in rows:
        ref, sec = r["reference"], r["seconds"]
        head = {k: r[k] for k in ("width", "model", "n_params", "n_train", "params_per_point")}
        out = {**head, "gn_r": r["gn_r"], "gn_rho": r["gn_rho"], "pe_r": r["pe_r"],
               "pe_rho": r["pe_rho"]}
        if r["study"] == "hmc":
            out.update(r_hat_max=ref["r_hat_max"], ess_median=ref["ess_median"],
                       divergences=ref["divergences"])
            diag.append({"study": "hmc", **head, **{k: v for k, v in ref.items()
                                                     if k not in ("method", "warnings")},
                         "map_grad_norm": r["map"]["grad_norm"],
                         "warnings": "; ".join(ref["warnings"]), **_seconds(sec)})
        else:
            out.update(elbo_final=ref["elbo_final"],
                       elbo_rel_change=ref["elbo_rel_change_last_10pct"])
            diag.append({"study": "vi", **head, **{k: v for k, v in ref.items()
                                                    if k != "method"}, **_seconds(sec)})
        out["seconds"] = sec["total"]
        main[r["study"]].append({k: _rounded(v) for k, v in out.items()})
        per_class += [{"study": r["study"], "width": r["width"], "n_params": r["n_params"],
                       "class": c, **{k: _rounded(v) for k, v in vals.items()}}
                      for c, vals in r["per_class"].items()]
    return {"hmc": main["hmc"], "vi": main["vi"], "per_class": per_class,
            "diagnostics": diag, "cautions": cautions(rows),
            "runs": [_run_summary(x) for x in runs]}


#: A VI reference is flagged when its ELBO still moved this much over the last 10% of steps,
#: or when p(1 − p) at its mean disagrees with its own average of p(1 − p) (PE ρ < PE_RHO_LOW).
ELBO_MOVING, PE_RHO_LOW = 0.02, 0.8


def cautions(rows: list[dict]) -> list[dict]:
    """Sizes whose reference should be read with caution, and why (from its own diagnostics)."""
    out = []
    for r in rows:
        ref, why = r["reference"], []
        if r["study"] == "vi" and ref.get("elbo_rel_change_last_10pct", 0) > ELBO_MOVING:
            why.append(f"ELBO still changed {ref['elbo_rel_change_last_10pct']:.1%} over the "
                       "last 10% of steps: VI not converged, more --vi-steps")
        if r["study"] == "vi" and r["pe_rho"] < PE_RHO_LOW:
            why.append(f"PE at μ vs reference aleatoric ρ = {r['pe_rho']:.2f}: predictions at "
                       "the variational mean differ from those averaged over q, a q too wide "
                       "(prior-dominated) for a first-order expansion around μ to hold")
        if r["study"] == "hmc" and (ref.get("r_hat_max") or 1.0) > 1.05:
            why.append(f"R-hat {ref['r_hat_max']:.3f} > 1.05: chains disagree, more draws")
        if why:
            out.append({"study": r["study"], "width": r["width"], "n_params": r["n_params"],
                        "gn_rho": _rounded(r["gn_rho"]), "why": "; ".join(why)})
    return out


def _seconds(sec: dict) -> dict:
    return {f"seconds_{k}": round(v, 1) for k, v in sec.items()}


def _run_summary(run: dict) -> dict:
    return {"started": run["key"], "budget_minutes": run["budget_minutes"],
            "elapsed_minutes": run["elapsed_minutes"], "device": run["device"],
            "ran": " ".join(run["ran"]), "already_done": " ".join(run["already_done"]),
            "not_started": " ".join(f"{k} ({why})" for k, why in run["not_started"].items())}


# --------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scaling(rows: list[dict], out: Path) -> Path:
    """``scaling.png``: Spearman ρ and Pearson r vs parameter count, ours and the paper's."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, study in zip(axes, STUDIES, strict=True):
        mine = sorted((r for r in rows if r["study"] == study), key=lambda r: r["n_params"])
        D = [r["n_params"] for r in mine]
        ax.plot(D, [r["gn_rho"] for r in mine], "o-", color="C0", label="ours: Spearman ρ")
        ax.plot(D, [r["gn_r"] for r in mine], "s--", color="C1", label="ours: Pearson r")
        if study == "hmc":
            p = PAPER["hmc"]
            ax.plot([r["n_params"] for r in p], [r["gn_rho"] for r in p], "^:", color="k",
                    label="paper: Spearman ρ")
            n = mine[0]["n_train"] if mine else 400
            ax.set_title(f"A: HMC reference, 4-class rings (N = {n})")
        else:
            ax.axhline(0.96, color="k", ls=":", label="paper: ρ ≥ 0.96 throughout")
            n = mine[0]["n_train"] if mine else VI_N_TRAIN
            prior = vi_option(mine[0].get("settings") if mine else None, "vi_prior")
            ax.set_title(f"B: mean-field VI reference ({prior.replace('_', '-')} prior)\n"
                         f"4-class clusters (N = {n})")
        ax.axvline(n, color="gray", lw=0.8, ls="-.", label="D = N")
        ax.set_xscale("log")
        ax.set_xlim(*XLIM[study])
        ax.set_xlabel("parameters D")
        ax.set_ylabel("GN vs reference epistemic (overall)")
        ax.set_ylim(min(-0.05, *[r["gn_r"] for r in mine], *[r["gn_rho"] for r in mine])
                    if mine else -0.05, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "scaling.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def smooth(x: np.ndarray, k: int) -> np.ndarray:
    """Running mean (len(x) − k + 1,) of window k (k ≥ 1, clipped to len(x))."""
    k = max(1, min(k, len(x)))
    c = np.cumsum(np.concatenate([[0.0], x]))
    return (c[k:] - c[:-k]) / k


def plot_elbo(rows: list[dict], out: Path) -> Path | None:
    """``scaling_vi_elbo.png``: the ELBO / N trace of every VI size (running mean)."""
    vi = sorted((r for r in rows if r["study"] == "vi"), key=lambda r: r["n_params"])
    traces = [(r, read_elbo(out, r["reference"]["elbo_file"])) for r in vi]
    traces = [(r, e) for r, e in traces if e is not None]
    if not traces:
        return None
    plt = _plt()
    cols = min(4, len(traces))
    nrow = math.ceil(len(traces) / cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(3.2 * cols, 2.6 * nrow), squeeze=False)
    for ax, (r, e) in zip(axes.ravel(), traces, strict=False):
        y = e / r["n_train"]
        s = smooth(y, max(1, len(y) // 50))
        ax.plot(np.arange(len(y)), y, color="C0", alpha=0.25, lw=0.5)
        ax.plot(np.arange(len(s)) + (len(y) - len(s)), s, color="C0", lw=1.2)
        tail = s[len(s) // 10 :] if len(s) > 10 else s
        lo, hi = float(np.min(tail)), float(np.max(tail))
        ax.set_ylim(lo - 0.1 * (hi - lo + 1e-9), hi + 0.1 * (hi - lo + 1e-9))
        ax.set_title(f"{r['model']} (D = {r['n_params']:,})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(traces) :]:
        ax.axis("off")
    fig.supxlabel("SVI step", fontsize=9)
    fig.supylabel("ELBO / N (nats)", fontsize=9)
    fig.tight_layout()
    path = out / "scaling_vi_elbo.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- entry point


def study_settings(study: str, *, seed: int, grid_n: int, prior_precision: float,
                   hmc: HMCSettings, vi: VISettings) -> dict:
    """The settings that determine a study's rows (stored in each row, checked on resume)."""
    common = {"problem": PROBLEM[study], "seed": seed, "grid_n": grid_n,
              "prior_precision": prior_precision}
    if study == "hmc":
        return {**common, "kernel": hmc.kernel, "num_warmup": hmc.num_warmup,
                "num_samples": hmc.num_samples, "num_chains": hmc.num_chains,
                "init": hmc.init}
    out = {**common, "n_train": vi.n_train, "vi_steps": vi.steps, "vi_draws": vi.draws,
           "vi_batch_size": vi.batch_size, "vi_lr": vi.lr}
    chosen = {"vi_prior": vi.prior, "vi_elbo": vi.elbo}
    # an option at its default is left out, so rows made before the option existed resume
    out.update({k: v for k, v in chosen.items() if v != VI_OPTION_DEFAULTS[k]})
    return out


def rebuild(out: Path, started: float, settings: dict, seed: int) -> Path:
    """results.json, tables.md and the figures from every finished row in ``out``."""
    rows = read_jsonl(out / "sizes.jsonl")
    runs = read_jsonl(out / "runs.jsonl")
    figures = []
    if rows:
        figures.append(plot_scaling(rows, out).name)
        elbo = plot_elbo(rows, out)
        if elbo is not None:
            figures.append(elbo.name)
    tables = build_tables(rows, runs)
    if progress := in_progress_rows(out):
        tables["hmc_in_progress"] = progress
    return write_results(out, NAME, settings=settings, seed=seed, started=started,
                         tables=tables, paper=PAPER, figures=figures,
                         extra={"rows": len(rows)})


def run(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    device: str = "cpu",
    sizes: list[int] | None = None,
    study: str = "both",
    budget_minutes: float | None = None,
    grid_n: int | None = None,
    prior_precision: float = 1.0,
    progress: bool = False,
    **options,
) -> Path:
    """Run the sizes not yet in ``out/sizes.jsonl`` and rebuild ``out/results.json``.

    quick: HMC sizes 0, 8 and VI 8, 16 with the ``"quick"`` presets (150 + 150 HMC draws
    per chain, 400 SVI steps), a 20×20 grid (about a minute on 2 cores). ``options``: the
    fields of :class:`HMCSettings` (``num_warmup``, ``num_samples``, ``num_chains``,
    ``kernel``, ``hmc_init``) and of :class:`VISettings` with a ``vi_`` prefix (``vi_steps``,
    …); each one given (not None) overrides the preset; an unknown one is an InputError.
    progress: run nothing; print and record the HMC sizes in progress (:func:`record_progress`).
    """
    started = time.time()
    out = Path(out)
    if progress:
        record_progress(out)
        return out / "results.json"
    if study not in ("hmc", "vi", "both"):
        raise InputError(f"study must be 'hmc', 'vi' or 'both', got {study!r}")
    if budget_minutes is not None and budget_minutes <= 0:
        raise InputError(f"budget_minutes must be positive, got {budget_minutes}")
    hmc_opts, vi_opts, unknown = split_options(options, (HMCSettings, ""), (VISettings, "vi-"))
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for the scaling experiment")
    preset = "quick" if quick else "full"
    hmc = resolve(HMC_PRESETS[preset], hmc_opts)
    vi = resolve(VI_PRESETS[preset], vi_opts, prefix="vi-")
    studies = list(STUDIES) if study == "both" else [study]
    defaults = {"hmc": (0, 8) if quick else HMC_WIDTHS, "vi": (8, 16) if quick else VI_WIDTHS}
    for w in sizes or ():
        spec_for_width(w)
    widths = {s: tuple(sizes) if sizes else defaults[s] for s in studies}
    grid = GRID_N[preset] if grid_n is None else grid_n
    fingerprints = {s: study_settings(s, seed=seed, grid_n=grid,
                                      prior_precision=prior_precision, hmc=hmc, vi=vi)
                    for s in studies}
    writer = JsonlWriter(out / "sizes.jsonl")
    check_resume(read_jsonl(writer.path), lambda r: fingerprints.get(r["study"]), "sizes.jsonl")
    jobs = plan(studies, widths)
    # a run of one study (or some sizes) keeps the other study's settings in results.json
    kept = {r["study"]: r["settings"] for r in read_jsonl(writer.path)}
    settings = {"quick": quick, "device": device, "study": study, "widths": widths,
                "budget_minutes": budget_minutes, "studies": {**kept, **fingerprints},
                "cost_exponent": COST_EXPONENT, "vi_float32_above_params": VI_FLOAT32_ABOVE,
                "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                "note": "paper §4.1.2 describes HMC on 'binary rings', but its parameter counts "
                        "(12, 132, …, 1,065,012) imply 4 softmax outputs: 4-class rings here"}
    budget_s = None if budget_minutes is None else 60.0 * budget_minutes
    record = {"key": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "budget_minutes": budget_minutes, "device": device, "ran": [],
              "already_done": [], "not_started": {}}
    with exclusive(writer.path):
        for job in jobs:
            if writer.done(job.key):
                record["already_done"].append(job.key)
                continue
            elapsed = time.time() - started
            predicted = predict_seconds(job, read_jsonl(writer.path))
            why = budget_decision(elapsed, budget_s, predicted)
            if why is not None:
                pred = "" if predicted is None else f", predicted {predicted / 60:.0f} min"
                record["not_started"][job.key] = why + pred
                print(f"{NAME}: not starting {job.key}: {why}{pred}", flush=True)
                continue
            print(f"{NAME}: {job.key} ({job.spec.n_params:,} params) starting at "
                  f"{elapsed / 60:.1f} min", flush=True)
            if job.study == "hmc":
                row = run_hmc_size(job, fingerprints["hmc"], device, checkpoint_dir(out, job))
            else:
                row = run_vi_size(job, fingerprints["vi"], out, device)
            row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            writer.write(row)
            shutil.rmtree(checkpoint_dir(out, job), ignore_errors=True)
            record["ran"].append(job.key)
            print(f"{NAME}: {job.key} done in {row['seconds']['total']:.0f} s: GN vs ref "
                  f"rho {row['gn_rho']:.3f}, r {row['gn_r']:.3f}", flush=True)
            rebuild(out, started, settings, seed)
    record["elapsed_minutes"] = round((time.time() - started) / 60, 2)
    JsonlWriter(out / "runs.jsonl").write(record)
    return rebuild(out, started, settings, seed)
