"""HMC / NUTS reference posteriors of the toy networks (NumPyro), paper §4.1 and App. F.

Reference epistemic = posterior variance of p_c(x) over the draws, aleatoric = posterior mean of
p_c(1 − p_c); for regression the variance of f(x). Several chains; split R-hat and ESS are
reported for the predictive quantity at every evaluation point (summarised), not only for θ.

Defaults follow measurements on 2 CPU cores: plain HMC with a fixed trajectory length of 1.0
(step size by dual averaging, diagonal mass matrix adapted in warmup) gave about 4× the ESS per
second of NUTS for p(x); chains run in parallel when JAX has one host device per chain (set up
by importing :mod:`isouq.reference`); everything runs in float64 (float32 mixed poorly).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from numpyro.infer import HMC, NUTS, init_to_sample

from ..errors import InputError, MemoryBudgetError
from ..models.toy import MLPSpec
from .checkpoint import Checkpoint, Progress, kept_indices, segments
from .model import bnn_model, resolve_inputs
from .predictive import param_diagnostics, predictive_moments
from .result import Reference

#: R-hat above this on p(x) adds a warning to the diagnostics.
R_HAT_WARN = 1.05
DEFAULT_MEMORY_BUDGET = 2 * 2**30
#: Extra fields recorded at every sampling iteration (all of them, whatever the thinning).
EXTRA_FIELDS = ("accept_prob", "diverging", "num_steps", "adapt_state.step_size")


def auto_checkpoint_every(n_params: int) -> int:
    """Iterations per checkpoint segment: ⌈2·10⁶ / D⌉ clipped to [2, 500].

    About a minute per segment on 2 quiet CPU cores (a few under load) from MLP(256,256)
    (D = 67,588: 30 iterations of ~150 leapfrog steps) to MLP(1028,1028) (D ≈ 10⁶: 2).
    """
    return int(min(500, max(2, math.ceil(2e6 / max(n_params, 1)))))


def _digest(*arrays) -> str:
    """SHA-256 (first 16 hex digits) of arrays' bytes, shapes and dtypes."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _initial_state(kernel, keys, num_warmup: int, init_params, model_args, num_chains: int):
    """The sampler state before iteration 0, chains stacked on axis 0 (one chain: unstacked).

    Each chain is initialised on its own (``kernel.init`` with one key) so the kernel keeps its
    per-chain sample function, which ``MCMC`` maps over the chains.
    """
    states = []
    for c in range(num_chains):
        ip = None if init_params is None else (
            init_params if num_chains == 1 else {k: v[c] for k, v in init_params.items()})
        states.append(kernel.init(keys[c], num_warmup, ip, model_args, {}))
    if num_chains == 1:
        return states[0]
    return jax.tree.map(lambda *a: jnp.stack(a), *states)


def _advance_fn(kernel, n: int, num_chains: int, method: str, model_args) -> Callable:
    """A compiled ``state → (state, (theta, *extras))`` running every chain ``n`` iterations.

    One iteration is ``kernel.sample`` (NumPyro's transition: leapfrog trajectory, accept step
    and, while the state's counter is below ``num_warmup``, step-size and mass-matrix
    adaptation); chains are mapped with ``pmap`` (parallel), ``lax.map`` (sequential) or
    not at all (one chain). Outputs are stacked (C, n, ...) (one chain: (n, ...)).
    """

    def one_chain(state):
        def body(st, _):
            st = kernel.sample(st, model_args, {})
            return st, (st.z["theta"], st.accept_prob, st.diverging, st.num_steps,
                        st.adapt_state.step_size)

        return jax.lax.scan(body, state, None, length=n)

    if num_chains == 1:
        return jax.jit(one_chain)
    if method == "parallel":
        return jax.pmap(one_chain)
    return jax.jit(lambda st: jax.lax.map(one_chain, st))


def _run_segment(advance: Callable, state, num_chains: int):
    """Advance every chain one segment; (draws (C, n, D), {field: (C, n)}, state)."""
    state, (theta, *rest) = advance(state)
    out = [np.asarray(jax.block_until_ready(x)) for x in (theta, *rest)]
    if num_chains == 1:
        out = [x[None] for x in out]
    return out[0], dict(zip(EXTRA_FIELDS, out[1:], strict=True)), state


def _sample(kernel, model_args, *, num_warmup: int, num_samples: int, num_chains: int,
            method: str, seed: int, init_params, thinning: int, every: int,
            checkpoint: Checkpoint | None) -> tuple[np.ndarray, dict, dict]:
    """Run the chains segment by segment, saving a checkpoint after each one.

    Every segment continues from the previous segment's full state (position, RNG key,
    iteration counter, adaptation state), so the draws do not depend on where the run was cut
    or resumed. Returns draws (C, S // thinning, D), extras {field: (C, S)} over every sampling
    iteration, and run info (seconds of sampling over all sessions, leapfrog steps, the
    iteration this call resumed at).
    """
    advance: dict[int, Callable] = {}
    keys = jax.random.split(jax.random.PRNGKey(seed), num_chains)
    total = num_warmup + num_samples
    state = _initial_state(kernel, keys, num_warmup, init_params, model_args, num_chains)
    prog = checkpoint.load() if checkpoint is not None else None
    parts: list[dict] = []
    if prog is None:
        prog = Progress(done=0, total=total, every=every)
    else:  # resume: the saved segment length wins, so the cut points are the same
        state = checkpoint.load_state(prog, state) if prog.state_file else state
        parts = checkpoint.load_parts(prog)
    resumed_at = prog.done
    for a, b in segments(num_warmup, num_samples, prog.every):
        if b <= prog.done:
            continue
        t1 = time.perf_counter()
        if b - a not in advance:
            advance[b - a] = _advance_fn(kernel, b - a, num_chains, method, model_args)
        draws, extra, state = _run_segment(advance[b - a], state, num_chains)
        part = None
        if a >= num_warmup:
            keep = kept_indices(a - num_warmup, b - num_warmup, num_samples, thinning)
            part = {"draws": np.ascontiguousarray(draws[:, keep]), **extra}
            parts.append(part)
        dt = time.perf_counter() - t1
        prog.done, prog.seconds = b, prog.seconds + dt
        log = {"start": a, "stop": b, "seconds": round(dt, 3),
               "leapfrog_steps": int(extra["num_steps"].sum()),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if checkpoint is not None:
            checkpoint.save(prog, state, part, a, log)
        else:
            prog.log.append(log)
    draws = np.concatenate([p["draws"] for p in parts], axis=1)
    extra = {k: np.concatenate([p[k] for p in parts], axis=1) for k in EXTRA_FIELDS}
    steps = sum(x["leapfrog_steps"] for x in prog.log)
    return draws, extra, {"seconds": prog.seconds, "leapfrog_steps": steps,
                          "resumed_at": resumed_at}


def chain_method_for(num_chains: int) -> str:
    """``"parallel"`` when JAX has a device per chain, else ``"sequential"``."""
    return "parallel" if num_chains > 1 and jax.local_device_count() >= num_chains else "sequential"


def _effective_step(adapted: float, kernel: str, trajectory_length: float) -> float:
    """The leapfrog step actually used: fixed-length HMC rounds to L = ⌈length / step⌉ steps."""
    if kernel != "hmc":
        return adapted
    return trajectory_length / math.ceil(trajectory_length / adapted)


def _init_params(init, num_chains: int, D: int, jitter: float, seed: int) -> dict | None:
    """Per-chain starting points (num_chains, D), or None to draw each from the prior."""
    if init is None or (isinstance(init, str) and init == "prior"):
        return None
    if isinstance(init, str):
        raise InputError(f"init must be None, 'prior' or parameters θ; got {init!r}")
    a = init.detach().cpu().double().numpy() if isinstance(init, torch.Tensor) else np.asarray(init)
    a = np.asarray(a, dtype=np.float64)
    if a.shape == (D,):
        a = np.broadcast_to(a, (num_chains, D)).copy()
    if a.shape != (num_chains, D):
        raise InputError(f"init must be (D,)=({D},) or (num_chains, D)=({num_chains}, {D}); "
                         f"got {a.shape}")
    if jitter > 0:
        a = a + jitter * np.random.default_rng(seed).standard_normal(a.shape)
    if num_chains == 1:
        a = a[0]
    return {"theta": jnp.asarray(a)}


def hmc_reference(
    data,
    spec: MLPSpec,
    task: str | None = None,
    prior_precision: float = 1.0,
    grid=None,
    *,
    noise_std: float | None = None,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    num_chains: int = 2,
    seed: int = 0,
    kernel: str = "hmc",
    trajectory_length: float = 1.0,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    dense_mass: bool = False,
    init=None,
    init_jitter: float = 0.0,
    thinning: int = 1,
    keep_samples: bool = False,
    chain_method: str | None = None,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
) -> Reference:
    """Sample the posterior of a toy network and summarise its predictive on ``grid``.

    Args:
        data: a :class:`~isouq.data.synthetic.Problem` (task, grid and regression noise_std
            default to its own) or an (X (N, d), y (N,)) pair (then ``task`` and ``grid`` are
            required).
        spec: the architecture (``MLPSpec``); binary models have ONE logit.
        task: ``"binary"``, ``"multiclass"`` or ``"regression"`` (default: the Problem's).
        prior_precision: λ of the prior θ ~ N(0, I/λ), the same λ as ``train_map``.
        grid: (G, d) evaluation points (default: the Problem's).
        noise_std: regression likelihood σ.
        num_warmup: adaptation iterations per chain (step size by dual averaging; diagonal,
            or with ``dense_mass`` dense, mass matrix), not kept.
        num_samples: iterations per chain after warmup; every ``thinning``-th is kept.
        num_chains: independent chains (R-hat needs ≥ 2).
        seed: seeds the chains' RNG keys (and the ``init_jitter`` noise).
        kernel: ``"hmc"`` (fixed ``trajectory_length``) or ``"nuts"`` (``max_tree_depth``).
        trajectory_length: leapfrog steps × step size of plain HMC.
        target_accept_prob: dual-averaging target.
        max_tree_depth: NUTS only.
        dense_mass: adapt a dense mass matrix (D² memory).
        init: None / ``"prior"`` (each chain starts at a prior draw), θ (D,) for all chains
            (e.g. the MAP, plus ``init_jitter``·N(0, 1) noise per chain) or (num_chains, D).
        init_jitter: see ``init``.
        thinning: keep every k-th sampling iteration (the last of each block, as NumPyro).
        keep_samples: also return the (num_chains·S/thinning, D) draws in
            ``Reference.samples``.
        chain_method: ``"parallel"`` (one JAX device per chain) or ``"sequential"``;
            default :func:`chain_method_for`.
        memory_budget_bytes: refuse (MemoryBudgetError) to keep more float64 draws than this.
        checkpoint: a directory; the run is then saved there after every segment of
            ``checkpoint_every`` iterations (:mod:`isouq.reference.checkpoint`), and a call with
            the same arguments resumes it (a finished run is read back without sampling). The
            draws are exactly those of an uninterrupted run: every segment continues from the
            whole saved state (positions, RNG keys, iteration counter, step size and mass
            matrix adaptation). A checkpoint made with other settings or data is an InputError.
        checkpoint_every: iterations per segment (default with a checkpoint:
            :func:`auto_checkpoint_every`, a few minutes on 2 CPU cores; without: one segment
            per phase). The segment length does not change the draws.

    Returns:
        A :class:`Reference` with epistemic/aleatoric/mean (G, C) (binary C = 2) or (G,),
        param_mean/param_std (D,), and diagnostics: predictive ``r_hat_*``/``ess_*`` (max,
        median, q95, min over the grid), parameter R-hat/ESS, per-chain step size, mean
        acceptance probability, divergences and mean leapfrog steps over every sampling
        iteration (thinned or not), ``leapfrog_steps`` (all iterations, warmup included),
        ``seconds`` (sampling incl. compilation, summed over resumed sessions),
        ``seconds_predictive``, ``resumed_at`` (iteration this call started from),
        ``ess_per_second`` and ``warnings``.

    Raises:
        InputError: bad arguments or data, or a checkpoint made with other settings.
        MemoryBudgetError: the kept draws would exceed ``memory_budget_bytes``.
    """
    inp = resolve_inputs(data, spec, task, grid, noise_std)
    if kernel not in ("hmc", "nuts"):
        raise InputError(f"kernel must be 'hmc' or 'nuts', got {kernel!r}")
    if num_chains < 1 or num_samples < 1 or num_warmup < 0 or thinning < 1:
        raise InputError("need num_chains ≥ 1, num_samples ≥ 1, num_warmup ≥ 0, thinning ≥ 1")
    D = spec.n_params
    kept = num_chains * (num_samples // thinning)
    need = kept * D * 8
    if need > memory_budget_bytes:
        raise MemoryBudgetError(
            f"keeping {kept} draws of {D} parameters needs {need / 2**30:.1f} GiB "
            f"(budget {memory_budget_bytes / 2**30:.1f} GiB); raise thinning, lower "
            "num_samples, or pass a larger memory_budget_bytes"
        )
    model = bnn_model(spec, inp.task, prior_precision, inp.noise_std)
    common = {"target_accept_prob": target_accept_prob, "dense_mass": dense_mass,
              "init_strategy": init_to_sample}
    if kernel == "hmc":
        k = HMC(model, trajectory_length=trajectory_length, **common)
    else:
        k = NUTS(model, max_tree_depth=max_tree_depth, **common)
    method = chain_method or chain_method_for(num_chains)
    X, y = jnp.asarray(inp.X), jnp.asarray(inp.y)
    init_params = _init_params(init, num_chains, D, init_jitter, seed)
    ck = None
    if checkpoint is not None:
        fp = {"kernel": kernel, "num_warmup": num_warmup, "num_samples": num_samples,
              "num_chains": num_chains, "thinning": thinning, "seed": seed,
              "trajectory_length": trajectory_length, "target_accept_prob": target_accept_prob,
              "max_tree_depth": max_tree_depth, "dense_mass": dense_mass,
              "prior_precision": prior_precision, "noise_std": inp.noise_std,
              "task": inp.task, "spec": spec.to_dict(), "data": _digest(inp.X, inp.y),
              "init": None if init_params is None else _digest(init_params["theta"]),
              "chain_method": method}
        ck = Checkpoint(checkpoint, fp)
    every = checkpoint_every or (auto_checkpoint_every(D) if ck else num_warmup + num_samples)
    draws, extra, run_info = _sample(
        k, (X, y), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
        method=method, seed=seed, init_params=init_params, thinning=thinning, every=every,
        checkpoint=ck)
    t_sample = run_info["seconds"]

    t1 = time.perf_counter()
    mean, epi, alea, pdiag = predictive_moments(draws, inp.grid, spec, inp.task,
                                                noise_std=inp.noise_std)
    t_pred = time.perf_counter() - t1

    diag = {
        **pdiag,
        **param_diagnostics(draws),
        "step_size": [_effective_step(float(s[-1]), kernel, trajectory_length)
                      for s in extra["adapt_state.step_size"]],
        "accept_prob": float(extra["accept_prob"].mean()),
        "divergences": int(extra["diverging"].sum()),
        "num_steps_mean": float(extra["num_steps"].mean()),
        "seconds": round(t_sample, 3),
        "seconds_predictive": round(t_pred, 3),
        "chain_method": method,
        "leapfrog_steps": run_info["leapfrog_steps"],
        "resumed_at": run_info["resumed_at"],
    }
    if "ess_min" in diag:
        diag["ess_per_second"] = diag["ess_min"] / max(t_sample, 1e-9)
    warn = []
    if diag.get("r_hat_max", 1.0) > R_HAT_WARN:
        warn.append(f"R-hat of p(x) reaches {diag['r_hat_max']:.3f} > {R_HAT_WARN}: chains "
                    "disagree; run longer (num_warmup, num_samples) or more chains")
    if diag["divergences"]:
        warn.append(f"{diag['divergences']} divergent transitions; raise target_accept_prob")
    if num_chains < 2:
        warn.append("one chain: no R-hat; use num_chains ≥ 2")
    diag["warnings"] = warn
    flat = draws.reshape(-1, D)
    settings = {
        "kernel": kernel, "num_warmup": num_warmup, "num_samples": num_samples,
        "num_chains": num_chains, "thinning": thinning, "seed": seed,
        "trajectory_length": trajectory_length if kernel == "hmc" else None,
        "target_accept_prob": target_accept_prob, "prior_precision": prior_precision,
        "noise_std": inp.noise_std,
        "init": "prior" if init is None or isinstance(init, str) else "given",
        "init_jitter": init_jitter, "spec": spec.to_dict(), "n_train": int(len(inp.X)),
        "n_eval": int(len(inp.grid)), "dtype": str(draws.dtype),
    }
    return Reference(
        method=kernel,
        task=inp.task,
        epistemic=torch.from_numpy(epi),
        aleatoric=torch.from_numpy(alea),
        mean=torch.from_numpy(mean),
        param_mean=torch.from_numpy(flat.mean(0)),
        param_std=torch.from_numpy(flat.std(0)),
        diagnostics=diag,
        settings=settings,
        spec=spec,
        samples=torch.from_numpy(flat.copy()) if keep_samples else None,
    )


__all__ = ["hmc_reference", "chain_method_for"]
