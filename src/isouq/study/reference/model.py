"""The NumPyro Bayesian-network model the HMC and VI references share, and input checking.

Prior θ ~ N(0, diag(σ²)) on the flat parameter vector (one sample site ``"theta"``, shape (D,)):
``"isotropic"`` σ² = 1 / prior_precision for every parameter (the default), or ``"fan_in"``
(weights' variance divided by their layer's fan-in; :func:`~isouq.models.toy.prior_std`).
Likelihood Bernoulli(logits = z) for binary, Categorical(logits) for multiclass, N(f(x),
noise_std²) for regression. With the isotropic prior the posterior is exactly
:func:`isouq.models.toy.neg_log_posterior`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import torch

from ...errors import InputError
from ...models.toy import MLPSpec, check_task, output_dim, prior_std
from .jax_models import forward


@dataclass(frozen=True)
class Inputs:
    """Checked float64 numpy inputs of a reference run.

    X (N, d), y (N,) (int labels or float targets), grid (G, d), task, noise_std (regression σ
    or None), n_classes.
    """

    X: np.ndarray
    y: np.ndarray
    grid: np.ndarray
    task: str
    noise_std: float | None
    n_classes: int


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def resolve_inputs(
    data,
    spec: MLPSpec,
    task: str | None,
    grid,
    noise_std: float | None,
) -> Inputs:
    """Turn a :class:`~isouq.data.synthetic.Problem` or an (X, y) pair into :class:`Inputs`.

    From a Problem, ``task``, ``grid`` and (regression) ``noise_std`` default to its own.
    Raises InputError (before any sampling) on missing task, wrong shapes, a spec whose
    output size does not match the task, or non-finite data.
    """
    if hasattr(data, "X") and hasattr(data, "task"):
        X, y = data.X, data.y
        task = task or data.task
        grid = data.grid if grid is None else grid
        if noise_std is None and task == "regression":
            noise_std = data.noise_std
        n_classes = data.n_classes
    else:
        try:
            X, y = data
        except (TypeError, ValueError) as e:
            raise InputError("data must be a synthetic Problem or an (X, y) pair") from e
        n_classes = 0
    if task is None:
        raise InputError("pass task= ('binary', 'multiclass' or 'regression') with an (X, y) pair")
    check_task(task)
    if grid is None:
        raise InputError("pass grid= (G, d) evaluation points with an (X, y) pair")
    X, y, G = _np(X).astype(np.float64), _np(y), _np(grid).astype(np.float64)
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y) or len(X) == 0:
        raise InputError(f"expected X (N, d) and y (N,), got {X.shape} and {y.shape}")
    if G.ndim != 2 or G.shape[1] != X.shape[1]:
        raise InputError(f"grid must be (G, {X.shape[1]}) like X, got {G.shape}")
    if X.shape[1] != spec.in_dim:
        raise InputError(f"{spec.label()} takes {spec.in_dim} inputs but X has {X.shape[1]}")
    if not (np.isfinite(X).all() and np.isfinite(G).all() and np.isfinite(y.astype(float)).all()):
        raise InputError("X, y or grid contain NaN/inf; clean the data first")
    if task == "multiclass":
        n_classes = max(n_classes, int(y.max()) + 1, spec.out_dim)
    elif task == "binary":
        n_classes = 2
    else:
        n_classes = 1
    if spec.out_dim != output_dim(task, n_classes):
        raise InputError(
            f"{spec.label()} has {spec.out_dim} outputs but a {task} task with {n_classes} "
            f"classes needs {output_dim(task, n_classes)} (binary uses ONE logit)"
        )
    if task == "regression":
        if noise_std is None or not noise_std > 0:
            raise InputError("regression needs noise_std > 0 (the likelihood's σ)")
        y = y.astype(np.float64)
    else:
        y = y.astype(np.int64)
    return Inputs(X, y, G, task, None if noise_std is None else float(noise_std), n_classes)


def bnn_model(
    spec: MLPSpec,
    task: str,
    prior_precision: float,
    noise_std: float | None = None,
    batch_size: int | None = None,
    dtype=jnp.float64,
    prior: str = "isotropic",
) -> Callable:
    """NumPyro model ``m(X, y)`` of the Bayesian toy network.

    batch_size: None = full-batch likelihood (HMC); an int subsamples that many points per call
    through ``numpyro.plate(..., subsample_size=batch_size)``, which rescales the minibatch
    log-likelihood by N / batch_size (stochastic VI). prior: see :func:`prior_std`.
    """
    sigma = jnp.asarray(prior_std(spec, prior_precision, prior), dtype=dtype)
    D = spec.n_params

    def model(X, y):
        theta = numpyro.sample(
            "theta", dist.Normal(jnp.zeros(D, dtype), sigma).to_event(1),
        )
        with numpyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
            xb = X if batch_size is None else X[idx]
            yb = y if batch_size is None else y[idx]
            out = forward(theta, xb, spec)
            if task == "binary":
                numpyro.sample("y", dist.Bernoulli(logits=out[:, 0]), obs=yb)
            elif task == "multiclass":
                numpyro.sample("y", dist.Categorical(logits=out), obs=yb)
            else:
                numpyro.sample("y", dist.Normal(out[:, 0], noise_std), obs=yb)

    return model
