"""HMC / NUTS reference posteriors of the toy networks (NumPyro), paper §4.1 and App. F.

Reference epistemic = posterior variance of p_c(x) over the draws, aleatoric = posterior mean of
p_c(1 − p_c); for regression the variance of f(x). Several chains; split R-hat and ESS are
reported for the predictive quantity at every evaluation point (summarised), not only for θ.

Defaults follow measurements on 2 CPU cores: plain HMC with a fixed trajectory length of 1.0
(step size by dual averaging, diagonal mass matrix adapted in warmup) gave about 4× the ESS per
second of NUTS for p(x); chains run in parallel when JAX has one host device per chain (set up
by importing :mod:`isouq.study.reference`); everything runs in float64 (float32 mixed poorly).
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

from ...errors import InputError, MemoryBudgetError
from ...models.toy import MLPSpec
from .checkpoint import Checkpoint, Progress, RunningPredictive, kept_indices, segments
from .jax_models import predict_fn
from .model import bnn_model, resolve_inputs
from .predictive import DEFAULT_BUDGET_BYTES, _chunk_points, param_diagnostics, predictive_moments
from .result import Reference

#: R-hat above this on p(x) adds a warning to the diagnostics.
R_HAT_WARN = 1.05
DEFAULT_MEMORY_BUDGET = 2 * 2**30
#: Extra fields recorded at every sampling iteration (all of them, whatever the thinning).
EXTRA_FIELDS = ("accept_prob", "diverging", "num_steps", "adapt_state.step_size")
#: Lags of the autocovariances a compact run keeps for the ESS (``RunningPredictive``).
ESS_MAX_LAG = 32


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


def _round_adaptation(st):
    """The state with the diagonal mass-matrix adaptation held at float32 precision.

    The Welford mean and M2 of the warmup windows and the inverse mass matrix are rounded to
    float32 values (still float64 arrays) and the matrix's square roots recomputed from the
    rounded one as NumPyro does (``sqrt``, ``reciprocal``); so a compact checkpoint stores them
    in 4 bytes a number without losing anything. The rounding (relative 6·10⁻⁸) is far below the
    sampling error of a variance estimated from ≤ 500 draws; positions, gradients, momenta and
    the step size stay float64.
    """
    a = st.adapt_state

    def f32(x):
        return x.astype(jnp.float32).astype(x.dtype)

    inv = jax.tree.map(f32, a.inverse_mass_matrix)
    sqrt_inv = jax.tree.map(jnp.sqrt, inv)
    if isinstance(a.mm_state, dict):
        mm = {k: (f32(m), f32(m2), n) for k, (m, m2, n) in a.mm_state.items()}
    else:
        m, m2, n = a.mm_state
        mm = (f32(m), f32(m2), n)
    return st._replace(adapt_state=a._replace(
        inverse_mass_matrix=inv, mass_matrix_sqrt=jax.tree.map(jnp.reciprocal, sqrt_inv),
        mass_matrix_sqrt_inv=sqrt_inv, mm_state=mm))


def _advance_fn(kernel, n: int, num_chains: int, method: str, model_args,
                round_adaptation: bool = False) -> Callable:
    """A compiled ``state → (state, (theta, *extras))`` running every chain ``n`` iterations.

    One iteration is ``kernel.sample`` (NumPyro's transition: leapfrog trajectory, accept step
    and, while the state's counter is below ``num_warmup``, step-size and mass-matrix
    adaptation), then with ``round_adaptation`` :func:`_round_adaptation`; chains are mapped
    with ``pmap`` (parallel), ``lax.map`` (sequential) or not at all (one chain). Outputs are
    stacked (C, n, ...) (one chain: (n, ...)).
    """

    def one_chain(state):
        def body(st, _):
            st = kernel.sample(st, model_args, {})
            if round_adaptation:
                st = _round_adaptation(st)
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


# --------------------------------------------------------------------------- compact layout

#: Leaves a compact checkpoint does not store: recomputed from the others on reading
#: (potential energy and its gradient at the position; the mass matrix's square roots).
_DERIVED = (".z_grad", ".potential_energy", ".adapt_state.mass_matrix_sqrt")
#: Groups of the stored leaves (each its own file, rewritten only when it changes).
_GROUPS = ((".adapt_state.inverse_mass_matrix", "mass"), (".adapt_state.mm_state", "welford"))


def _leaf_names(template) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(template)[0]]


def pack_state(state) -> dict[str, dict[str, np.ndarray]]:
    """The sampler state as groups of named arrays for a compact checkpoint.

    ``{"sampler": positions, RNG keys, counters, step size and dual averaging, ...,
    "mass": inverse mass matrix, "welford": the warmup window's Welford mean, M2, count}``;
    leaves named ``leaf_<i>`` by their place in the flattened state; the leaves in
    :data:`_DERIVED` are left out (:func:`unpack_state` recomputes them).
    """
    names = _leaf_names(state)
    leaves = jax.tree.leaves(jax.device_get(state))
    out: dict[str, dict[str, np.ndarray]] = {"sampler": {}, "mass": {}, "welford": {}}
    for i, (name, leaf) in enumerate(zip(names, leaves, strict=True)):
        if name.startswith(_DERIVED):
            continue
        group = next((g for prefix, g in _GROUPS if name.startswith(prefix)), "sampler")
        out[group][f"leaf_{i}"] = np.asarray(leaf)
    return out


def _derive_fn(model, model_args, num_chains: int) -> Callable:
    """A compiled ``state → state`` filling the :data:`_DERIVED` leaves from the stored ones."""
    from numpyro.infer.util import potential_energy

    def value_and_grad(z):
        return jax.value_and_grad(lambda q: potential_energy(model, model_args, {}, q))(z)

    vg = value_and_grad if num_chains == 1 else jax.vmap(value_and_grad)

    def derive(st):
        pe, grad = vg(st.z)
        a = st.adapt_state
        sqrt_inv = jax.tree.map(jnp.sqrt, a.inverse_mass_matrix)
        return st._replace(potential_energy=pe, z_grad=grad, adapt_state=a._replace(
            mass_matrix_sqrt=jax.tree.map(jnp.reciprocal, sqrt_inv),
            mass_matrix_sqrt_inv=sqrt_inv))

    return jax.jit(derive)


def unpack_state(groups: dict[str, dict[str, np.ndarray]], template, derive: Callable):
    """The sampler state :func:`pack_state` stored, shaped like ``template`` (a fresh state),
    its derived leaves recomputed by ``derive`` (:func:`_derive_fn`).

    Raises:
        InputError: the stored leaves do not fit this sampler (other numpyro/jax version?).
    """
    names = _leaf_names(template)
    leaves, treedef = jax.tree.flatten(template)
    stored = {k: v for g in groups.values() for k, v in g.items()}
    out = []
    for i, (name, leaf) in enumerate(zip(names, leaves, strict=True)):
        if name.startswith(_DERIVED):
            out.append(leaf)
            continue
        a = stored.pop(f"leaf_{i}", None)
        if a is None or np.shape(a) != np.shape(leaf):
            raise InputError(f"the stored sampler state has no leaf {name} of shape "
                             f"{np.shape(leaf)} (other numpyro/jax version?); delete the "
                             "checkpoint to start over")
        out.append(jnp.asarray(np.asarray(a).astype(np.asarray(leaf).dtype)))
    if stored:
        raise InputError(f"the stored sampler state has leaves this sampler lacks: {sorted(stored)}")
    return derive(jax.tree.unflatten(treedef, out))


class _Online:
    """A compact run's running sums: the predictive quantity on the evaluation points
    (:class:`RunningPredictive`) and the per-iteration fields (sums over every sampling
    iteration, the last step size), updated after each sampling segment."""

    def __init__(self, spec: MLPSpec, task: str, grid: np.ndarray, num_chains: int,
                 num_kept: int, max_lag: int):
        self.spec, self.task, self.grid = spec, task, np.asarray(grid, dtype=np.float64)
        self.n_out = 1 if task == "regression" else (2 if task == "binary" else spec.out_dim)
        shape = (len(grid),) if task == "regression" else (len(grid), self.n_out)
        self.pred = RunningPredictive(num_chains, num_kept, shape, max_lag)
        self.extra = {"accept_prob": np.zeros(num_chains), "num_steps": np.zeros(num_chains),
                      "diverging": np.zeros(num_chains, np.int64), "iterations": np.zeros((), np.int64),
                      "step_size": np.zeros(num_chains)}
        self._batched = jax.jit(jax.vmap(predict_fn(spec, task), in_axes=(0, None)))

    def values(self, draws: np.ndarray) -> np.ndarray:
        """q at every evaluation point for draws (K, k, D): (K, k, G[, C]), chunked as
        :func:`~isouq.study.reference.predictive.predictive_moments`."""
        K, k, D = draws.shape
        thetas = jnp.asarray(draws.reshape(K * k, D))
        G = len(self.grid)
        g = min(G, _chunk_points(K * k, self.spec, self.n_out, DEFAULT_BUDGET_BYTES))
        out = np.empty((K * k, *self.pred.shape))
        for start in range(0, G, g):
            stop = min(start + g, G)
            pts = np.zeros((g, self.grid.shape[1]))  # a fixed chunk size: compile once
            pts[: stop - start] = self.grid[start:stop]
            out[:, start:stop] = np.asarray(self._batched(thetas, jnp.asarray(pts)))[:, : stop - start]
        return out.reshape(K, k, *self.pred.shape)

    def update(self, kept: np.ndarray, extra: dict[str, np.ndarray]) -> None:
        if kept.shape[1]:
            self.pred.update(self.values(kept))
        e = self.extra
        e["accept_prob"] += extra["accept_prob"].sum(1)
        e["num_steps"] += extra["num_steps"].sum(1)
        e["diverging"] += extra["diverging"].sum(1)
        e["iterations"] += extra["accept_prob"].shape[1]
        e["step_size"][:] = extra["adapt_state.step_size"][:, -1]

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {**{f"pred_{k}": v for k, v in self.pred.to_arrays().items()},
                **{f"extra_{k}": np.array(v) for k, v in self.extra.items()}}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        p = self.pred
        self.pred = RunningPredictive.from_arrays(
            {k[5:]: v for k, v in arrays.items() if k.startswith("pred_")},
            p.K, p.N, p.shape, p.L)
        for k, v in self.extra.items():
            self.extra[k] = np.asarray(arrays[f"extra_{k}"]).astype(v.dtype).reshape(v.shape)


def _sample(kernel, model_args, *, num_warmup: int, num_samples: int, num_chains: int,
            method: str, seed: int, init_params, thinning: int, every: int,
            checkpoint: Checkpoint | None, online: _Online | None = None,
            derive: Callable | None = None) -> tuple[np.ndarray | None, dict | None, dict]:
    """Run the chains segment by segment, saving a checkpoint after each one.

    Every segment continues from the previous segment's full state (position, RNG key,
    iteration counter, adaptation state), so the draws do not depend on where the run was cut
    or resumed. Returns draws (C, S // thinning, D), extras {field: (C, S)} over every sampling
    iteration, and run info (seconds of sampling over all sessions, leapfrog steps, the
    iteration this call resumed at).

    Compact (``online`` given): no draws are kept; each sampling segment's kept draws go into
    ``online``'s running sums (returned draws and extras are None), the mass-matrix adaptation
    is held at float32 precision (:func:`_round_adaptation`), and after every segment the run
    continues from the state as the compact checkpoint stores it (:func:`pack_state`, then
    :func:`unpack_state` with ``derive``), whether or not it is saved: so a run resumed from
    the checkpoint continues exactly as the uninterrupted one (for the same segment length).
    """
    advance: dict[int, Callable] = {}
    keys = jax.random.split(jax.random.PRNGKey(seed), num_chains)
    total = num_warmup + num_samples
    state = template = _initial_state(kernel, keys, num_warmup, init_params, model_args,
                                      num_chains)
    prog = checkpoint.load() if checkpoint is not None else None
    parts: list[dict] = []
    if prog is None:
        prog = Progress(done=0, total=total, every=every)
    elif online is not None:
        groups = checkpoint.load_arrays(prog)
        state = unpack_state({g: groups[g] for g in ("sampler", "mass", "welford")}, template,
                             derive)
        online.load(groups["running"])
    else:  # resume: the saved segment length wins, so the cut points are the same
        state = checkpoint.load_state(prog, state) if prog.state_file else state
        parts = checkpoint.load_parts(prog)
    resumed_at = prog.done
    for a, b in segments(num_warmup, num_samples, prog.every):
        if b <= prog.done:
            continue
        t1, c1 = time.perf_counter(), time.process_time()
        if b - a not in advance:
            advance[b - a] = _advance_fn(kernel, b - a, num_chains, method, model_args,
                                         round_adaptation=online is not None)
        draws, extra, state = _run_segment(advance[b - a], state, num_chains)
        part = packed = None
        if a >= num_warmup:
            keep = kept_indices(a - num_warmup, b - num_warmup, num_samples, thinning)
            if online is not None:
                online.update(draws[:, keep], extra)
            else:
                part = {"draws": np.ascontiguousarray(draws[:, keep]), **extra}
                parts.append(part)
        if online is not None:
            packed = pack_state(state)
            state = unpack_state(packed, template, derive)
        dt = time.perf_counter() - t1
        prog.done, prog.seconds = b, prog.seconds + dt
        log = {"start": a, "stop": b, "seconds": round(dt, 3),
               "cpu_seconds": round(time.process_time() - c1, 3),
               "leapfrog_steps": int(extra["num_steps"].sum()),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if checkpoint is None:
            prog.log.append(log)
        elif online is not None:
            checkpoint.save_compact(prog, {**packed, "running": online.to_arrays()}, log)
        else:
            checkpoint.save(prog, state, part, a, log)
    steps = sum(x["leapfrog_steps"] for x in prog.log)
    info = {"seconds": prog.seconds, "leapfrog_steps": steps, "resumed_at": resumed_at}
    if online is not None:
        return None, None, info
    draws = np.concatenate([p["draws"] for p in parts], axis=1)
    extra = {k: np.concatenate([p[k] for p in parts], axis=1) for k in EXTRA_FIELDS}
    return draws, extra, info


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
    compact: bool = False,
    ess_max_lag: int = ESS_MAX_LAG,
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
            ``checkpoint_every`` iterations (:mod:`isouq.study.reference.checkpoint`), and a call with
            the same arguments resumes it (a finished run is read back without sampling). The
            draws are exactly those of an uninterrupted run: every segment continues from the
            whole saved state (positions, RNG keys, iteration counter, step size and mass
            matrix adaptation). A checkpoint made with other settings or data is an InputError.
        checkpoint_every: iterations per segment (default with a checkpoint:
            :func:`auto_checkpoint_every`, a few minutes on 2 CPU cores; without: one segment
            per phase). The segment length does not change the draws (``compact``: it does, at
            rounding level, see there).
        compact: keep no parameter draws: the predictive quantity of every kept draw goes into
            running sums (:class:`~isouq.study.reference.checkpoint.RunningPredictive`: per-chain
            Welford moments of the half-chains, Σ p(1 − p), autocovariances up to
            ``ess_max_lag``), and the checkpoint (``"compact"`` layout) holds the sampler state
            and those sums only: about 2 positions' worth of float64 per chain plus the sums,
            ~40 MB at D = 10⁶ (without the draws; the ``"draws"`` layout holds them all). The
            mass-matrix adaptation is held at float32 precision so its state takes 4 bytes a
            number, and the gradient at the position is recomputed after every segment; so a
            compact run's draws differ (at rounding level, then chaotically) from those of a
            non-compact run with the same seed, or a compact one cut into other segments, but a
            compact run resumed from its checkpoint continues exactly as the uninterrupted one.
            ``mean``/``epistemic``/``aleatoric`` and the R-hat/ESS summaries equal those of the
            stored-draws path on the same draws to rounding (the ESS up to the ``ess_max_lag``
            truncation, counted in ``ess_truncated``); no parameter R-hat/ESS, and
            ``param_mean``/``param_std`` are NaN. Needs a diagonal mass matrix.
        ess_max_lag: ``compact`` only: lags of the autocovariances kept for the ESS.

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
    if compact and (keep_samples or dense_mass):
        raise InputError("compact keeps no draws and a diagonal mass matrix: drop keep_samples "
                         "and dense_mass, or compact")
    if compact and num_samples // thinning < 1:
        raise InputError("compact needs at least one kept draw per chain (num_samples ≥ thinning)")
    if need > memory_budget_bytes and not compact:
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
        if compact:  # only then: checkpoints made before these keys existed still resume
            fp.update(layout="compact", ess_max_lag=ess_max_lag,
                      grid=_digest(np.asarray(inp.grid, dtype=np.float64)))
        ck = Checkpoint(checkpoint, fp, layout="compact" if compact else "draws")
    every = checkpoint_every or (auto_checkpoint_every(D) if ck else num_warmup + num_samples)
    online = derive = None
    if compact:
        online = _Online(spec, inp.task, inp.grid, num_chains, num_samples // thinning,
                         ess_max_lag)
        derive = _derive_fn(model, (X, y), num_chains)
    draws, extra, run_info = _sample(
        k, (X, y), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
        method=method, seed=seed, init_params=init_params, thinning=thinning, every=every,
        checkpoint=ck, online=online, derive=derive)
    t_sample = run_info["seconds"]

    t1 = time.perf_counter()
    if online is not None:
        mean, epi, alea, pdiag = online.pred.finalize(inp.task, inp.noise_std)
        e, n_it = online.extra, max(int(online.extra["iterations"]), 1)
        last_step = e["step_size"]
        run_extra = {"accept_prob": float(e["accept_prob"].sum() / (num_chains * n_it)),
                     "divergences": int(e["diverging"].sum()),
                     "num_steps_mean": float(e["num_steps"].sum() / (num_chains * n_it))}
    else:
        mean, epi, alea, pdiag = predictive_moments(draws, inp.grid, spec, inp.task,
                                                    noise_std=inp.noise_std)
        pdiag.update(param_diagnostics(draws))
        last_step = [s[-1] for s in extra["adapt_state.step_size"]]
        run_extra = {"accept_prob": float(extra["accept_prob"].mean()),
                     "divergences": int(extra["diverging"].sum()),
                     "num_steps_mean": float(extra["num_steps"].mean())}
    t_pred = time.perf_counter() - t1

    diag = {
        **pdiag,
        "step_size": [_effective_step(float(s), kernel, trajectory_length) for s in last_step],
        **run_extra,
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
    if compact:
        diag["checkpoint"] = "compact"
        if pdiag.get("ess_truncated"):
            warn.append(f"ESS at {pdiag['ess_truncated']} points is an upper bound: their "
                        f"autocorrelations stay positive past lag {ess_max_lag}; raise ess_max_lag")
        param_mean = param_std = torch.full((D,), float("nan"), dtype=torch.float64)
    else:
        flat = draws.reshape(-1, D)
        param_mean, param_std = torch.from_numpy(flat.mean(0)), torch.from_numpy(flat.std(0))
    settings = {
        "kernel": kernel, "num_warmup": num_warmup, "num_samples": num_samples,
        "num_chains": num_chains, "thinning": thinning, "seed": seed,
        "trajectory_length": trajectory_length if kernel == "hmc" else None,
        "target_accept_prob": target_accept_prob, "prior_precision": prior_precision,
        "noise_std": inp.noise_std,
        "init": "prior" if init is None or isinstance(init, str) else "given",
        "init_jitter": init_jitter, "spec": spec.to_dict(), "n_train": int(len(inp.X)),
        "n_eval": int(len(inp.grid)), "dtype": "float64", "compact": compact,
    }
    return Reference(
        method=kernel,
        task=inp.task,
        epistemic=torch.from_numpy(epi),
        aleatoric=torch.from_numpy(alea),
        mean=torch.from_numpy(mean),
        param_mean=param_mean,
        param_std=param_std,
        diagnostics=diag,
        settings=settings,
        spec=spec,
        samples=torch.from_numpy(flat.copy()) if keep_samples and not compact else None,
    )


__all__ = ["hmc_reference", "chain_method_for", "pack_state", "unpack_state"]
