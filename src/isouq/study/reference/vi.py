"""Mean-field variational inference reference for the large toy networks (NumPyro SVI).

q(θ) = N(μ, diag(s²)) (``AutoNormal``), fitted by stochastic VI: reparameterised single-sample
ELBO gradients (``Trace_ELBO``) on random minibatches (``numpyro.plate`` subsampling, likelihood
scaled by N / batch), Adam with an exponentially decaying step size. The ELBO estimate of every
step is kept (``Reference.elbo``). Predictive moments come from independent draws of q;
``param_mean`` = μ, the point where the paper computes the gradient norm (load it into torch
with ``Reference.state_dict()``).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from numpyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO, init_to_value
from numpyro.infer.autoguide import AutoNormal
from numpyro.optim import Adam

from ...errors import InputError, MemoryBudgetError
from ...models.toy import MLPSpec, build
from .jax_models import flat_params
from .model import bnn_model, resolve_inputs
from .predictive import predictive_moments
from .result import Reference

DEFAULT_DRAW_BUDGET = 512 * 2**20
#: SVI loss per ``elbo=`` option (see :func:`vi_reference`).
ELBO_ESTIMATORS = {"trace": Trace_ELBO, "analytic_kl": TraceMeanField_ELBO}


def _init_loc(init, spec: MLPSpec, seed: int) -> np.ndarray:
    if init is None or (isinstance(init, str) and init == "torch"):
        return flat_params(build(spec, seed))
    if isinstance(init, str):
        raise InputError(f"init must be None, 'torch' or parameters θ; got {init!r}")
    a = init.detach().cpu().double().numpy() if isinstance(init, torch.Tensor) else np.asarray(init)
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    if a.shape != (spec.n_params,):
        raise InputError(f"init must have D={spec.n_params} values, got {a.size}")
    return a


def _streamed_moments(
    loc: jax.Array, scale: jax.Array, n_draws: int, key: jax.Array, grid: np.ndarray,
    spec: MLPSpec, task: str, noise_std: float | None, budget_bytes: int,
):
    """Predictive mean/var/aleatoric from ``n_draws`` draws of q, generated chunk by chunk."""
    D = loc.shape[0]
    per = max(1, min(n_draws, budget_bytes // (8 * D)))
    n_done, mean, m2, alea = 0, None, None, None
    for i, start in enumerate(range(0, n_draws, per)):
        m = min(per, n_draws - start)
        eps = jax.random.normal(jax.random.fold_in(key, i), (m, D), dtype=loc.dtype)
        draws = np.asarray(loc + scale * eps, dtype=np.float64)[None]
        mu, var, al, _ = predictive_moments(draws, grid, spec, task, noise_std=noise_std,
                                            diagnostics=False)
        if mean is None:
            mean, m2, alea, n_done = mu, var * m, al * m, m
            continue
        n_new = n_done + m  # Chan et al. pooled mean / sum of squares
        delta = mu - mean
        mean = mean + delta * m / n_new
        m2 = m2 + var * m + delta**2 * n_done * m / n_new
        alea = alea + al * m
        n_done = n_new
    return mean, m2 / n_done, alea / n_done


def vi_reference(
    data,
    spec: MLPSpec,
    task: str | None = None,
    prior_precision: float = 1.0,
    grid=None,
    *,
    noise_std: float | None = None,
    num_steps: int = 5000,
    batch_size: int | None = 128,
    lr: float = 1e-2,
    final_lr_ratio: float = 0.1,
    init=None,
    init_scale: float = 1e-2,
    num_predictive_draws: int = 1000,
    seed: int = 0,
    dtype: str = "float64",
    keep_samples: bool = False,
    draw_budget_bytes: int = DEFAULT_DRAW_BUDGET,
    prior: str = "isotropic",
    elbo: str = "trace",
) -> Reference:
    """Fit a mean-field Gaussian q(θ) by stochastic VI and summarise its predictive on ``grid``.

    data / spec / task / prior_precision / grid / noise_std: as :func:`~.hmc.hmc_reference`.
    num_steps: SVI steps; batch_size: minibatch size (None or ≥ N: full batch).
    lr: initial Adam step size, decayed exponentially to ``lr · final_lr_ratio``.
    init: starting μ: None / ``"torch"`` (torch's default init, seeded), or θ (D,) such as the
        MAP; ``init_scale``: starting s (in units of θ).
    num_predictive_draws: draws of q for the predictive moments.
    dtype: ``"float64"`` or ``"float32"`` (use float32 for models with millions of parameters).
    prior: ``"isotropic"`` N(0, I / prior_precision) or ``"fan_in"`` (weights' variance divided
        by their layer's fan-in; see :func:`isouq.models.toy.prior_std`).
    elbo: the gradient estimator: ``"trace"`` (``Trace_ELBO``: one draw estimates the
        likelihood and KL(q‖p) alike) or ``"analytic_kl"`` (``TraceMeanField_ELBO``: the
        Gaussian KL in closed form, only the likelihood sampled; far less noise when D is large).
        Both maximise the same ELBO.

    Returns a :class:`Reference` (method ``"vi"``) with epistemic/aleatoric/mean (G, C) or (G,),
    param_mean = μ and param_std = s (D,), ``elbo`` (num_steps,) = −loss per step (nats, a
    one-sample, minibatch estimate), and diagnostics (seconds, final ELBO = mean of the last
    10 % of steps, its relative change from the 10 % before, ...).
    """
    inp = resolve_inputs(data, spec, task, grid, noise_std)
    if dtype not in ("float64", "float32"):
        raise InputError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    if elbo not in ELBO_ESTIMATORS:
        raise InputError(f"elbo must be one of {tuple(ELBO_ESTIMATORS)}, got {elbo!r}")
    if num_steps < 1 or num_predictive_draws < 2 or lr <= 0:
        raise InputError("need num_steps ≥ 1, num_predictive_draws ≥ 2 and lr > 0")
    D = spec.n_params
    if 8 * D > draw_budget_bytes:
        raise MemoryBudgetError(f"one draw of {D} parameters exceeds draw_budget_bytes; raise it")
    jdt = jnp.float64 if dtype == "float64" else jnp.float32
    N = len(inp.X)
    bs = None if batch_size is None or batch_size >= N else int(batch_size)
    model = bnn_model(spec, inp.task, prior_precision, inp.noise_std, batch_size=bs, dtype=jdt,
                      prior=prior)
    loc0 = jnp.asarray(_init_loc(init, spec, seed), dtype=jdt)
    guide = AutoNormal(model, init_loc_fn=init_to_value(values={"theta": loc0}),
                       init_scale=init_scale)
    decay = final_lr_ratio ** (1.0 / num_steps)
    optim = Adam(lambda i: lr * decay**i)
    svi = SVI(model, guide, optim, loss=ELBO_ESTIMATORS[elbo]())
    X = jnp.asarray(inp.X, dtype=jdt)
    y = jnp.asarray(inp.y, dtype=jdt) if inp.task == "regression" else jnp.asarray(inp.y)
    key_fit, key_pred = jax.random.split(jax.random.PRNGKey(seed))
    t0 = time.perf_counter()
    res = svi.run(key_fit, num_steps, X, y, progress_bar=False)
    losses = np.asarray(jax.block_until_ready(res.losses), dtype=np.float64)
    t_fit = time.perf_counter() - t0
    loc = res.params["theta_auto_loc"]
    scale = res.params["theta_auto_scale"]
    if not (np.isfinite(losses[-1]) and bool(jnp.isfinite(loc).all())):
        raise InputError(f"VI diverged (ELBO {-losses[-1]}); lower lr (now {lr})")

    t1 = time.perf_counter()
    mean, epi, alea = _streamed_moments(loc, scale, num_predictive_draws, key_pred, inp.grid,
                                        spec, inp.task, inp.noise_std, draw_budget_bytes)
    t_pred = time.perf_counter() - t1
    tail = max(1, num_steps // 10)
    last = float(-losses[-tail:].mean())
    prev = float(-losses[-2 * tail : -tail].mean()) if num_steps >= 2 * tail + 1 else last
    diag = {
        "seconds": round(t_fit, 3),
        "seconds_predictive": round(t_pred, 3),
        "elbo_first": float(-losses[0]),
        "elbo_final": last,
        "elbo_rel_change_last_10pct": abs(last - prev) / max(abs(last), 1e-12),
        "param_std_median": float(jnp.median(scale)),
        "param_std_max": float(jnp.max(scale)),
        "n_draws": num_predictive_draws,
    }
    samples = None
    if keep_samples:
        eps = jax.random.normal(jax.random.fold_in(key_pred, 10**6), (num_predictive_draws, D))
        samples = torch.from_numpy(np.array(loc + scale * eps, dtype=np.float64))
    settings = {
        "num_steps": num_steps, "batch_size": bs or N, "lr": lr, "final_lr_ratio": final_lr_ratio,
        "init": "given" if init is not None and not isinstance(init, str) else "torch",
        "init_scale": init_scale, "seed": seed, "dtype": dtype,
        "prior_precision": prior_precision, "prior": prior, "elbo": elbo, "noise_std": inp.noise_std,
        "spec": spec.to_dict(),
        "n_train": N, "n_eval": int(len(inp.grid)), "guide": "AutoNormal (mean-field)",
    }
    return Reference(
        method="vi",
        task=inp.task,
        epistemic=torch.from_numpy(np.asarray(epi, dtype=np.float64)),
        aleatoric=torch.from_numpy(np.asarray(alea, dtype=np.float64)),
        mean=torch.from_numpy(np.asarray(mean, dtype=np.float64)),
        param_mean=torch.from_numpy(np.array(loc, dtype=np.float64)),
        param_std=torch.from_numpy(np.array(scale, dtype=np.float64)),
        diagnostics=diag,
        settings=settings,
        spec=spec,
        samples=samples,
        elbo=torch.from_numpy(-losses),
    )
