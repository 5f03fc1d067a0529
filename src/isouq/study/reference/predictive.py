"""Posterior predictive moments and convergence diagnostics of p_c(x) from parameter draws.

Given draws θ (K chains, S draws, D), evaluates the quantity q(θ, x) on the evaluation points
(class probabilities p_c(x) (C per point), or f(x) for regression) chunk by chunk, so memory is
bounded by ``budget_bytes`` whatever the grid size, and returns
  mean = E[q], epistemic = Var[q] (population variance over all K·S draws),
  aleatoric = E[p_c(1 − p_c)] (classification) or noise_std² (regression),
and, with K ≥ 2 chains, split R-hat and ESS (``numpyro.diagnostics``) of q at every point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

from ...errors import InputError
from ...models.toy import MLPSpec
from .jax_models import predict_fn

DEFAULT_BUDGET_BYTES = 256 * 2**20


def _chunk_points(n_draws: int, spec: MLPSpec, n_out: int, budget_bytes: int) -> int:
    width = max([*spec.hidden, spec.in_dim, n_out])
    per_point = n_draws * (2 * width + 3 * n_out) * 8
    return max(1, budget_bytes // per_point)


def _summarise(values: np.ndarray, prefix: str) -> dict:
    """max / median / 95th percentile / min of an array, ignoring NaN (flat points)."""
    v = values.ravel()
    ok = v[np.isfinite(v)]
    out = {f"{prefix}_n_nan": int(v.size - ok.size)}
    if ok.size:
        out.update({f"{prefix}_max": float(ok.max()), f"{prefix}_median": float(np.median(ok)),
                    f"{prefix}_q95": float(np.quantile(ok, 0.95)),
                    f"{prefix}_min": float(ok.min())})
    return out


def predictive_moments(
    draws: np.ndarray,
    grid: np.ndarray,
    spec: MLPSpec,
    task: str,
    *,
    noise_std: float | None = None,
    diagnostics: bool = True,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """(mean, epistemic, aleatoric, diag) of q on ``grid`` from ``draws``.

    draws: (K, S, D) parameter draws (K chains; K = 1 for VI or independent draws).
    grid: (G, d) evaluation points.
    Returns mean, epistemic, aleatoric of shape (G, C) (classification, binary C = 2) or (G,)
    (regression), float64, and diag: R-hat / ESS summaries of q over the grid (``r_hat_max``,
    ``r_hat_median``, ``ess_min``, ``ess_median``, …; binary uses p_1 only since p_0 = 1 − p_1)
    when K ≥ 2, S ≥ 4 and ``diagnostics``; points where q does not vary count in ``*_n_nan``.
    """
    K, S, D = draws.shape
    if D != spec.n_params:
        raise InputError(f"draws have D={D} but {spec.label()} has {spec.n_params} parameters")
    q = predict_fn(spec, task)
    n_out = 1 if task == "regression" else (2 if task == "binary" else spec.out_dim)
    thetas = jnp.asarray(draws.reshape(K * S, D))
    batched = jax.jit(jax.vmap(q, in_axes=(0, None)))
    g = min(len(grid), _chunk_points(K * S, spec, n_out, budget_bytes))
    G = len(grid)
    shape = (G,) if task == "regression" else (G, n_out)
    mean, var, alea = np.empty(shape), np.empty(shape), np.empty(shape)
    want_diag = diagnostics and K >= 2 and S >= 4
    rhat, ess = [], []
    for start in range(0, G, g):
        stop = min(start + g, G)
        pts = np.zeros((g, grid.shape[1]))  # pad to a fixed chunk size: compile once
        pts[: stop - start] = grid[start:stop]
        vals = np.asarray(batched(thetas, jnp.asarray(pts)))[:, : stop - start]
        mean[start:stop] = vals.mean(0)
        var[start:stop] = vals.var(0)
        if task != "regression":
            alea[start:stop] = (vals * (1.0 - vals)).mean(0)
        if want_diag:
            v = vals.reshape(K, S, *vals.shape[1:])
            if task == "binary":
                v = v[..., 1]
            with np.errstate(all="ignore"):
                rhat.append(np.asarray(split_gelman_rubin(v)).ravel())
                ess.append(np.asarray(effective_sample_size(v)).ravel())
    if task == "regression":
        alea[:] = noise_std**2
    diag: dict = {"n_draws": int(K * S), "n_chains": int(K)}
    if want_diag:
        diag.update(_summarise(np.concatenate(rhat), "r_hat"))
        diag.update(_summarise(np.concatenate(ess), "ess"))
    return mean, var, alea, diag


def param_diagnostics(draws: np.ndarray, max_params: int = 20000) -> dict:
    """Split R-hat and ESS of the parameters (K, S, D), summarised (the first ``max_params``).

    For networks these are pessimistic by construction (hidden-unit permutations and sign flips
    leave p(x) unchanged); the predictive diagnostics are the ones that matter.
    """
    K, S, D = draws.shape
    if K < 2 or S < 4:
        return {}
    sub = draws[:, :, : min(D, max_params)]
    with np.errstate(all="ignore"):
        out = _summarise(np.asarray(split_gelman_rubin(sub)), "param_r_hat")
        out.update(_summarise(np.asarray(effective_sample_size(sub)), "param_ess"))
    return out


def ess_per_param(draws: np.ndarray) -> np.ndarray:
    """ESS (D,) of each parameter from (K, S, D) draws (numpyro.diagnostics)."""
    return np.asarray(effective_sample_size(draws))


def mc_standard_error(sd: np.ndarray, ess: np.ndarray) -> np.ndarray:
    """Monte-Carlo standard error sd / √ESS of a posterior mean estimate (elementwise)."""
    return sd / np.sqrt(np.maximum(ess, 1.0))


__all__ = ["predictive_moments", "param_diagnostics", "ess_per_param", "mc_standard_error"]
