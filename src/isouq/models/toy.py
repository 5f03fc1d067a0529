"""Toy torch models for the synthetic experiments and their MAP training (paper §4.1, App. F).

Every model is an ``nn.Sequential`` of ``Linear`` layers with ``Tanh`` between them, described by
an :class:`MLPSpec`. The parameter layout (names ``"0.weight"``, ``"0.bias"``, ``"2.weight"``, …,
weights stored (out, in)) is the one :mod:`isouq.study.reference.jax_models` mirrors, so a flat
parameter vector moves between torch and the NumPyro references unchanged
(``torch.nn.utils.parameters_to_vector`` order).

Likelihoods (the same ones the references use):
- binary: ONE output logit z, p(y=1|x) = σ(z), Bernoulli;
- multiclass: C logits, softmax, categorical;
- regression: one output f(x), y ~ N(f(x), noise_std²) with a stated noise std.
Prior: isotropic Gaussian θ ~ N(0, I / prior_precision) (MAP training and HMC); the VI
reference can also use the fan-in scaled prior of :func:`prior_std`.

Sizes: ``mlp2(2, 32, 1)`` has 2·32+32 + 32·32+32 + 32+1 = 1,185 parameters;
``regression_mlp()`` 1→32→1 has 97; ``logistic_regression()`` 3; ``linear_regression()`` 2.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..choices import TOY_PRIORS as PRIORS  # the reference posteriors' priors (prior_std)
from ..errors import InputError, ModelError

TASKS = ("binary", "multiclass", "regression")


@dataclass(frozen=True)
class MLPSpec:
    """A tanh MLP: in_dim → hidden[0] → … → hidden[-1] → out_dim (no hidden: a linear model)."""

    in_dim: int
    hidden: tuple[int, ...]
    out_dim: int

    @property
    def layer_dims(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each Linear layer, input to output."""
        dims = [self.in_dim, *self.hidden, self.out_dim]
        return list(zip(dims[:-1], dims[1:], strict=True))

    @property
    def n_params(self) -> int:
        """Number of scalar parameters D."""
        return sum(i * o + o for i, o in self.layer_dims)

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """[(name, shape)] in ``model.named_parameters()`` order; weights are (out, in)."""
        out = []
        for k, (i, o) in enumerate(self.layer_dims):
            out += [(f"{2 * k}.weight", (o, i)), (f"{2 * k}.bias", (o,))]
        return out

    def label(self) -> str:
        """Short name: ``"Linear(2→1)"`` or ``"MLP(32,32)"``."""
        if not self.hidden:
            return f"Linear({self.in_dim}->{self.out_dim})"
        return "MLP(" + ",".join(str(h) for h in self.hidden) + ")"

    def to_dict(self) -> dict:
        return {"in_dim": self.in_dim, "hidden": list(self.hidden), "out_dim": self.out_dim,
                "n_params": self.n_params}


# --------------------------------------------------------------------------- specs


def logistic_regression(in_dim: int = 2) -> MLPSpec:
    """Binary logistic regression: one logit, in_dim + 1 parameters."""
    return MLPSpec(in_dim, (), 1)


def softmax_regression(in_dim: int = 2, n_classes: int = 4) -> MLPSpec:
    """Multiclass softmax regression: (in_dim + 1)·C parameters."""
    return MLPSpec(in_dim, (), n_classes)


def linear_regression(in_dim: int = 1) -> MLPSpec:
    """Linear regression f(x) = wᵀx + b: in_dim + 1 parameters (2 for 1D)."""
    return MLPSpec(in_dim, (), 1)


def mlp2(in_dim: int = 2, width: int = 32, out_dim: int = 1) -> MLPSpec:
    """Two hidden tanh layers of ``width`` (MLP(w,w)); (2, 32, 1) has 1,185 parameters."""
    return MLPSpec(in_dim, (width, width), out_dim)


def regression_mlp(in_dim: int = 1, width: int = 32) -> MLPSpec:
    """One hidden tanh layer for regression: 1→32→1 has 97 parameters."""
    return MLPSpec(in_dim, (width,), 1)


def output_dim(task: str, n_classes: int) -> int:
    """Number of model outputs: 1 for binary (one logit) and regression, C for multiclass."""
    check_task(task)
    return n_classes if task == "multiclass" else 1


def spec_for(problem, kind: str = "mlp", width: int = 32) -> MLPSpec:
    """The paper's model for a :class:`~isouq.data.synthetic.Problem`.

    kind: ``"linear"`` (logistic / softmax / linear regression) or ``"mlp"`` (two hidden layers
    of ``width`` for classification, one hidden layer of ``width`` for regression).
    """
    out = output_dim(problem.task, problem.n_classes)
    if kind == "linear":
        return MLPSpec(problem.in_dim, (), out)
    if kind == "mlp":
        if problem.task == "regression":
            return regression_mlp(problem.in_dim, width)
        return mlp2(problem.in_dim, width, out)
    raise InputError(f"unknown model kind {kind!r}; use 'linear' or 'mlp'")


def check_task(task: str) -> None:
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


# --------------------------------------------------------------------------- models


def prior_std(spec: MLPSpec, prior_precision: float, prior: str = "isotropic") -> np.ndarray:
    """Prior standard deviation σ (D,) of every parameter, in θ's flat order; θ ~ N(0, diag(σ²)).

    prior: ``"isotropic"`` (σ = prior_precision^-1/2 everywhere) or ``"fan_in"`` (a weight of a
    layer with fan_in inputs: σ = (prior_precision · fan_in)^-1/2, the scale of the usual
    initialisations, so wide layers do not saturate under the prior; a bias:
    prior_precision^-1/2).
    """
    if prior_precision <= 0:
        raise InputError(f"prior_precision must be positive, got {prior_precision}")
    if prior not in PRIORS:
        raise InputError(f"prior must be one of {PRIORS}, got {prior!r}")
    base = 1.0 / math.sqrt(prior_precision)
    if prior == "isotropic":
        return np.full(spec.n_params, base)
    parts = []
    for fan_in, fan_out in spec.layer_dims:
        parts += [np.full(fan_in * fan_out, base / math.sqrt(fan_in)), np.full(fan_out, base)]
    return np.concatenate(parts)


def build(spec: MLPSpec, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """An ``nn.Sequential`` tanh MLP for ``spec`` with torch's default init, seeded.

    The global torch RNG is left untouched (a private generator draws the initial values).
    """
    layers: list[nn.Module] = []
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init draws from the global RNG
        for k, (i, o) in enumerate(spec.layer_dims):
            if k:
                layers.append(nn.Tanh())
            layers.append(nn.Linear(i, o, dtype=dtype))
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in model:
            if isinstance(lin, nn.Linear):
                bound = 1.0 / math.sqrt(lin.in_features)  # torch's default Linear init range
                for p in (lin.weight, lin.bias):
                    p.copy_(torch.empty_like(p).uniform_(-bound, bound, generator=gen))
    return model


def spec_of(model: nn.Sequential) -> MLPSpec:
    """The :class:`MLPSpec` of a model made by :func:`build` (raises ModelError otherwise)."""
    seq = isinstance(model, nn.Sequential)
    lins = [m for m in model if isinstance(m, nn.Linear)] if seq else []
    expected = []
    for k in range(len(lins)):
        expected += ([nn.Tanh] if k else []) + [nn.Linear]
    if not lins or [type(m) for m in model] != expected:
        raise ModelError(
            "expected an nn.Sequential of Linear layers with Tanh between them "
            "(isouq.models.toy.build); got a different architecture"
        )
    spec = MLPSpec(lins[0].in_features, tuple(m.out_features for m in lins[:-1]),
                   lins[-1].out_features)
    return spec



# --------------------------------------------------------------------------- objective


def neg_log_likelihood(
    outputs: torch.Tensor, y: torch.Tensor, task: str, noise_std: float | None = None
) -> torch.Tensor:
    """Summed negative log-likelihood of targets ``y`` (N,) given model outputs (N, out_dim).

    Regression includes the constant N·log(σ√(2π)), so it is the full −log p(y | θ).
    """
    if task == "binary":
        return nn.functional.binary_cross_entropy_with_logits(
            outputs[:, 0], y.to(outputs.dtype), reduction="sum"
        )
    if task == "multiclass":
        return nn.functional.cross_entropy(outputs, y.long(), reduction="sum")
    if task == "regression":
        if noise_std is None or noise_std <= 0:
            raise InputError(
                f"regression needs a positive noise_std (the likelihood's σ), got {noise_std}; "
                "pass problem.noise_std"
            )
        r = (y.to(outputs.dtype) - outputs[:, 0]) / noise_std
        return 0.5 * (r**2).sum() + y.shape[0] * math.log(noise_std * math.sqrt(2 * math.pi))
    check_task(task)
    raise AssertionError("unreachable")


def neg_log_posterior(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    task: str,
    prior_precision: float,
    noise_std: float | None = None,
) -> torch.Tensor:
    """−log p(θ | data) up to a constant: summed NLL + (prior_precision / 2)·‖θ‖²."""
    sq = sum((p**2).sum() for p in model.parameters())
    return neg_log_likelihood(model(X), y, task, noise_std) + 0.5 * prior_precision * sq


@dataclass
class MapFit:
    """The result of :func:`train_map`.

    model: the trained model (the same object passed in, parameters set to θ*).
    neg_log_posterior: −log p(θ* | data) at the end (float64 evaluation, constants included
        for regression, prior normalizer excluded).
    grad_norm: ‖∇θ (−log posterior)‖₂ at θ* (float64), the stationarity check.
    n_iter: Adam steps + L-BFGS iterations run.  seconds: wall time.
    """

    model: nn.Module
    neg_log_posterior: float
    grad_norm: float
    n_iter: int
    seconds: float

    def to_dict(self) -> dict:
        return {"neg_log_posterior": self.neg_log_posterior, "grad_norm": self.grad_norm,
                "n_iter": self.n_iter, "seconds": self.seconds}


def _check_data(X: torch.Tensor, y: torch.Tensor, task: str) -> None:
    check_task(task)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0] or X.shape[0] == 0:
        raise InputError(
            f"expected X (N, d) and y (N,) with N > 0, got X {tuple(X.shape)} and y "
            f"{tuple(y.shape)}; pass problem.X and problem.y"
        )


def train_map(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    task: str,
    prior_precision: float = 1.0,
    *,
    noise_std: float | None = None,
    adam_steps: int = 1000,
    adam_lr: float = 1e-2,
    lbfgs_iter: int = 2000,
    tol: float = 1e-7,
    num_threads: int | None = None,
) -> MapFit:
    """Train ``model`` in place to a MAP estimate θ* under the prior N(0, I / prior_precision).

    Objective: summed NLL over the full batch + (prior_precision / 2)·‖θ‖² (see
    :func:`neg_log_posterior`). The optimisation runs in float64 on a copy: ``adam_steps``
    full-batch Adam steps (to leave the initial region), then L-BFGS with strong-Wolfe line
    search until the gradient's max-norm is below ``tol`` or ``lbfgs_iter`` iterations. θ* is
    then written back to ``model`` in its own dtype. Fully deterministic (no sampling): the
    same initial model and data give the same θ* (for the same torch thread count).
    X: (N, d); y: (N,) labels or targets.

    num_threads: torch intra-op threads while training (restored after). Default: 1 for models
    up to 200,000 parameters (these tiny full-batch problems ran ~25× slower with 2 threads on a
    shared 2-core machine), torch's current setting above that.
    """
    _check_data(X, y, task)
    if prior_precision <= 0:
        raise InputError(f"prior_precision must be positive, got {prior_precision}")
    n_params = sum(p.numel() for p in model.parameters())
    threads = num_threads or (1 if n_params <= 200_000 else torch.get_num_threads())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train_map(model, X, y, task, prior_precision, noise_std, adam_steps, adam_lr,
                          lbfgs_iter, tol)
    finally:
        torch.set_num_threads(before)


def _train_map(model, X, y, task, prior_precision, noise_std, adam_steps, adam_lr, lbfgs_iter,
               tol) -> MapFit:
    t0 = time.perf_counter()
    work = copy.deepcopy(model).double()
    Xd = X.double()
    yd = y if task == "multiclass" else y.double()
    params = [p for p in work.parameters() if p.requires_grad]
    if not params:
        raise ModelError("the model has no trainable parameters to fit")

    def objective() -> torch.Tensor:
        return neg_log_posterior(work, Xd, yd, task, prior_precision, noise_std)

    n_iter = 0
    if adam_steps > 0:
        opt = torch.optim.Adam(params, lr=adam_lr)
        for _ in range(adam_steps):
            opt.zero_grad()
            objective().backward()
            opt.step()
        n_iter += adam_steps
    if lbfgs_iter > 0:
        lbfgs = torch.optim.LBFGS(
            params, lr=1.0, max_iter=lbfgs_iter, tolerance_grad=tol, tolerance_change=1e-15,
            history_size=50, line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        lbfgs.step(closure)
        n_iter += int(lbfgs.state[lbfgs._params[0]].get("n_iter", 0))
    loss = objective()
    grads = torch.autograd.grad(loss, params)
    gnorm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
    loss = float(loss.detach())
    if not math.isfinite(loss):
        raise ModelError("MAP training diverged (non-finite loss); lower adam_lr")
    with torch.no_grad():
        for p, q in zip(model.parameters(), work.parameters(), strict=True):
            p.copy_(q.to(p.dtype))
    return MapFit(model, loss, gnorm, n_iter, time.perf_counter() - t0)
