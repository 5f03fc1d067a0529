"""score_classifier and score_regressor: epistemic gᵀCg and aleatoric p(1−p) for any model.

Two exact engines compute the per-example gradients g = ∇θ output(xᵢ):
- ``"ghost"``: per-example ‖g‖² from hooks, one backward per scored column over the whole
  batch (one in all for ``classes="predicted"`` or given classes), never holding a
  per-example gradient of the whole model (identity covariance only);
- ``"per_example"`` (older name ``"functorch"``): per-example Jacobians with torch.func
  (vmap ∘ jacrev), chunked to a memory budget, for any covariance (one row per example for
  selected classes).
``method="auto"`` takes ghost for the identity covariance when every layer has a ghost rule
(``isouq.ghost.register_rule`` adds one for a layer of your own), and otherwise warns once per
layer type and takes per_example (``isouq.engines``: one vocabulary with ``score_sequences``).

Classifiers are differentiated through log p_c (log-softmax, or the logit for a one-logit
binary model): ‖∇θ p_c‖² = p_c² ‖∇θ log p_c‖² (∇ log p = ∇p / p), so both ``epistemic`` and
``epistemic_log`` come from the same pass, without underflow for tiny p_c.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from torch import nn

from .covariance import CurvatureKind, Identity, Likelihood, build_covariance
from .engines import engine_name
from .errors import InputError, ModelError, check_finite
from .ghost.engine import GhostNorms
from .params import ParamSpec, param_info, select_params
from .per_example import chunk_size_for, flatten, functional_model, output_jacobians
from .scores import Scores

Method = Literal["auto", "ghost", "per_example", "functorch"]
ClassSpec = Literal["all", "predicted"] | np.ndarray | torch.Tensor | list
GHOST_BATCH = 256
_WARNED_FALLBACK: set[str] = set()
#: model → the input signatures (:func:`_independence_key`) for which its outputs were found
#: not to mix examples: the check then runs once per model and kind of input, not every call
_INDEPENDENT: weakref.WeakKeyDictionary[nn.Module, set] = weakref.WeakKeyDictionary()


def _independence_key(model: nn.Module, x: torch.Tensor) -> tuple:
    """What the mixing check's verdict depends on: the example shape, dtype and device, and
    every submodule's type and mode (train/eval, BatchNorm's running statistics on or off)."""
    modes = tuple((type(m), m.training, getattr(m, "track_running_stats", None))
                  for m in model.modules())
    return tuple(x.shape[1:]), x.dtype, str(x.device), modes


@contextmanager
def eval_mode(model: nn.Module):
    """Score at θ* deterministically: dropout off, batch-norm running stats; restores the mode.
    A model already in eval mode throughout is left as it is (``model.eval()`` walks every
    module: milliseconds per call on an LLM)."""
    if not any(m.training for m in model.modules()):
        yield
        return
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def as_batch(inputs, model: nn.Module) -> torch.Tensor:
    """Inputs as a batch-first tensor in the model's float dtype; clear errors otherwise."""
    if isinstance(inputs, np.ndarray | list | tuple):
        inputs = torch.as_tensor(np.asarray(inputs))
    if not isinstance(inputs, torch.Tensor):
        raise InputError(f"inputs must be a tensor or array, got {type(inputs).__name__}")
    if inputs.ndim == 0 or inputs.shape[0] == 0:
        raise InputError(f"inputs must be a non-empty batch (N, ...), got shape {tuple(inputs.shape)}")
    p = next(model.parameters(), None)
    if inputs.is_floating_point():
        if not bool(torch.isfinite(inputs).all()):
            raise InputError("inputs contain NaN/inf; clean or impute them before scoring")
        if p is not None:
            inputs = inputs.to(dtype=p.dtype)
    if p is not None:
        inputs = inputs.to(p.device)
    return inputs


def _expected_input(model: nn.Module) -> str:
    first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    return f" (its first Linear layer expects (N, {first.in_features}))" if first else ""


def forward_all(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """model(x) in chunks without gradients; turns a failing call into an InputError."""
    outs = []
    with torch.no_grad():
        for s in range(0, x.shape[0], batch_size):
            outs.append(_call_model(model, x[s : s + batch_size], tuple(x.shape), x.dtype))
    out = torch.cat(outs)
    check_finite(out, "the model's output", "Check the model weights and inputs (θ* must be finite).")
    return out


def _logits_2d(out: torch.Tensor, what: str) -> torch.Tensor:
    if out.ndim == 1:
        return out.unsqueeze(1)
    if out.ndim != 2:
        raise ModelError(
            f"{what}: expected model outputs of shape (N,) or (N, C), got {tuple(out.shape)}; "
            "wrap the model so it returns one row of logits per example"
        )
    return out


def class_probs(logits: torch.Tensor) -> torch.Tensor:
    """(N, 1) logit -> (N, 2) [1 − σ, σ]; (N, C ≥ 2) -> softmax."""
    if logits.shape[1] == 1:
        p1 = torch.sigmoid(logits)
        return torch.cat([1 - p1, p1], dim=1)
    return torch.softmax(logits, dim=1)


def _ghost_epistemic(
    model: nn.Module,
    params: dict,
    x: torch.Tensor,
    outputs: Callable[[torch.Tensor], torch.Tensor],
    columns: int,
    batch_size: int,
) -> torch.Tensor:
    """(N, columns) ‖∇θ outputs(model(x))[:, c]‖², one backward per column per batch."""
    res = []
    with GhostNorms(model, params, warn=False) as ghost:
        for s in range(0, x.shape[0], batch_size):
            with torch.enable_grad():
                o = outputs(model(x[s : s + batch_size]))
                cols = [
                    ghost.backward(o[:, c], retain_graph=c < columns - 1) for c in range(columns)
                ]
            ghost.calls.clear()
            res.append(torch.stack(cols, dim=1))
    return torch.cat(res).detach()


def _engine(model: nn.Module, params: dict, cov, method: Method) -> str:
    """'ghost' or 'per_example' (torch.func Jacobians) for this model, covariance and
    ``method`` (``isouq.engines``; "functorch" is per_example's older name)."""
    method = engine_name(method, ("auto", "ghost", "per_example"))
    if not isinstance(cov, Identity):
        if method == "ghost":
            raise InputError("method='ghost' computes ‖g‖² only: use covariance='identity'")
        return "per_example"
    if method == "per_example":
        return "per_example"
    seq_first = sorted({n for n, m in model.named_modules()
                        if isinstance(m, nn.MultiheadAttention) and not m.batch_first})
    if method == "ghost":
        if seq_first:
            raise InputError(
                f"method='ghost' needs batch-first layers; nn.MultiheadAttention {seq_first[0]!r} "
                "has batch_first=False: build it with batch_first=True (same weights, inputs "
                "(N, L, E)) or use method='per_example'"
            )
        return "ghost"
    missing = GhostNorms(model, params, warn=False).fallbacks
    if not missing:
        return "ghost"
    new = [t for t in missing if t not in _WARNED_FALLBACK]
    if new:
        _WARNED_FALLBACK.update(new)
        warnings.warn(
            f"isouq: no ghost rule for layer type(s) {', '.join(new)}; method='auto' uses the "
            "exact but slower per_example engine (register a rule with "
            "isouq.ghost.register_rule, or pass method='ghost' to use the exact generic "
            "fallback for those layers only)",
            stacklevel=3,
        )
    return "per_example"


def _epistemic(
    model, params, x, outputs, n_out, cov, method: Method, batch_size
) -> torch.Tensor:
    """(N, n_out) gᵀCg per output column of ``outputs(model(x))``."""
    if _engine(model, params, cov, method) == "ghost":
        epi = _ghost_epistemic(model, params, x, outputs, n_out, batch_size or GHOST_BATCH)
        return cov.scale * epi
    epi = torch.empty(x.shape[0], n_out, dtype=x.dtype if x.is_floating_point() else torch.float32,
                      device=x.device)

    def single(o):
        return outputs(o).reshape(-1)

    for rows, _, J in output_jacobians(model, params, x, single, n_out, chunk_size=batch_size):
        epi[rows] = cov.quadratic(J)
    return epi


def _classes_spec(classes, n: int) -> str | torch.Tensor:
    """'all', 'predicted', or an int64 tensor (N,) of one class per example (range checked later)."""
    if isinstance(classes, str):
        if classes not in ("all", "predicted"):
            raise InputError(f"classes={classes!r}: use 'all', 'predicted', or one class index "
                             "per example (an integer array of shape (N,))")
        return classes
    t = torch.as_tensor(np.asarray(classes) if not isinstance(classes, torch.Tensor) else classes)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise InputError(f"classes must hold integer class indices, got dtype {t.dtype}; "
                         "pass e.g. labels.astype(int)")
    if t.ndim != 1 or t.shape[0] != n:
        raise InputError(f"classes must have shape (N,) = ({n},), one class per example, got "
                         f"{tuple(t.shape)}")
    return t.long().cpu()


def _log_columns(logits: torch.Tensor, cls: torch.Tensor | None) -> torch.Tensor:
    """The scalars whose gradients are taken: (n, K).

    Binary one-logit model: the logit z (K = 1; ∇ log p₁ = p₀ ∇z, ∇ log p₀ = −p₁ ∇z).
    Softmax: log p_c for every class (K = C), or for the given class of each row (K = 1).
    """
    if logits.shape[1] == 1:
        return logits
    lp = torch.log_softmax(logits, dim=1)
    return lp if cls is None else lp.gather(1, cls.view(-1, 1).to(lp.device))


def _from_log(G: torch.Tensor, probs: torch.Tensor, cls: torch.Tensor | None, binary: bool):
    """(epistemic, epistemic_log) from G = gᵀCg of the columns of :func:`_log_columns`."""
    if binary:  # G = ‖∇z‖²: ‖∇p_c‖² = (p₀p₁)² G, ‖∇ log p_c‖² = p_{1−c}² G
        G = G[:, 0]
        other = probs.flip(1) if cls is None else probs.gather(1, 1 - cls.view(-1, 1)).view(-1)
        epi_log = other.pow(2) * (G[:, None] if cls is None else G)
        prod = (probs[:, 0] * probs[:, 1]).pow(2)
        epi = prod[:, None] * G[:, None] if cls is None else prod * G
        return (epi.expand(-1, 2) if cls is None else epi), epi_log
    if cls is None:
        return probs.pow(2) * G, G
    pc = probs.gather(1, cls.view(-1, 1)).view(-1)
    return pc.pow(2) * G[:, 0], G[:, 0]


def _call_model(model: nn.Module, xb: torch.Tensor, shape: tuple, dtype=None) -> torch.Tensor:
    """model(xb); a failing call becomes an InputError naming the inputs' shape (and dtype)."""
    try:
        return model(xb)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        raise InputError(
            f"the model failed on inputs of shape {shape}{f' ({dtype})' if dtype else ''}: "
            f"{type(e).__name__}: "
            f"{str(e).splitlines()[0]}. Pass a batch-first tensor the model accepts"
            f"{_expected_input(model)}"
        ) from e


def _check_independent(row: torch.Tensor, alone: torch.Tensor) -> None:
    """Example 0's output in its batch vs alone: a difference means a layer mixes examples."""
    scale = 1.0 + float(alone.abs().max())
    diff = float((row - alone).abs().max())
    if diff > 1e-3 * scale:
        raise ModelError(
            f"the model's output for an example changes with the other examples in its batch "
            f"(by {diff:.3g}): a layer mixes examples (e.g. BatchNorm with "
            "track_running_stats=False, or a custom batch-level layer), so per-example "
            "gradients are not defined; normalize per example (GroupNorm, LayerNorm) or with "
            "running statistics"
        )


def _check_range(spec: str | torch.Tensor, n_logits: int) -> None:
    n_classes = 2 if n_logits == 1 else n_logits
    if isinstance(spec, torch.Tensor) and bool(((spec < 0) | (spec >= n_classes)).any()):
        bad = spec[(spec < 0) | (spec >= n_classes)][0].item()
        raise InputError(f"classes holds index {bad}, outside 0..{n_classes - 1} for a model "
                         f"with {n_classes} classes")


def _resolve(spec: str | torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
    """The class of each row of ``logits`` (None for 'all')."""
    if isinstance(spec, str):
        if spec == "all":
            return None
        if logits.shape[1] == 1:
            return (logits[:, 0] > 0).long().cpu()
        return logits.argmax(1).cpu()
    return spec


def _ghost_classifier(model, params, x, spec, batch_size: int, alone):
    """Logits (N, C') and G (N, K), one backward per column (K = 1 with selected classes)."""
    logits, G = [], []
    with GhostNorms(model, params, warn=False) as ghost:
        for s in range(0, x.shape[0], batch_size):
            with torch.enable_grad():
                out = _logits_2d(_call_model(model, x[s : s + batch_size], tuple(x.shape)),
                                 "score_classifier")
                check_finite(out.detach(), "the model's output",
                             "Check the model weights and inputs (θ* must be finite).")
                if s == 0:  # before any backward through a layer that mixes examples
                    _check_range(spec, out.shape[1])
                    if alone is not None:
                        _check_independent(out[0].detach(), alone[0])
                cls = _resolve(spec, out.detach())
                if isinstance(spec, torch.Tensor):
                    cls = cls[s : s + len(out)]
                cols = _log_columns(out, cls)
                K = cols.shape[1]
                G.append(torch.stack([ghost.backward(cols[:, k], retain_graph=k < K - 1)
                                      for k in range(K)], dim=1).detach())
            ghost.calls.clear()
            logits.append(out.detach())
    return torch.cat(logits), torch.cat(G)


def _functorch_classifier(model, params, x, logits, cls, cov, batch_size: int | None):
    """G (N, K) = gᵀCg of the log columns, by vmap over examples (and their classes)."""
    f = functional_model(model, params)
    theta = {n: p.detach() for n, p in params.items()}
    n_params = sum(p.numel() for p in theta.values())
    C1 = logits.shape[1]
    K = 1 if (C1 == 1 or cls is not None) else C1
    c_all = torch.zeros(x.shape[0], dtype=torch.long) if cls is None else cls

    def one(th, xi, ci):
        out = f(th, xi.unsqueeze(0))
        return _log_columns(out, None if cls is None else ci.view(1))[0]

    jac = torch.func.vmap(torch.func.jacrev(one), in_dims=(None, 0, 0))
    size = batch_size or chunk_size_for(K * n_params)
    G = torch.empty(x.shape[0], K, dtype=logits.dtype)
    for start in range(0, x.shape[0], size):
        rows = slice(start, min(start + size, x.shape[0]))
        J = flatten(jac(theta, x[rows], c_all[rows].to(x.device)), batch_dims=2).detach()
        G[rows] = cov.quadratic(J).to(G.dtype).cpu()
    return G.to(logits.device)


def score_classifier(
    model: nn.Module,
    inputs,
    *,
    classes: ClassSpec = "all",
    covariance="identity",
    params: ParamSpec = None,
    batch_size: int | None = None,
    data: tuple | None = None,
    prior_precision: float = 1.0,
    hessian: CurvatureKind = "ggn",
    method: Method = "auto",
    check_independent: bool = True,
) -> Scores:
    """Epistemic and aleatoric uncertainty of a classifier at its trained θ*.

    Args:
        model: maps a batch (N, ...) to logits (N, C); C = 1 (or outputs (N,)) is a binary
            sigmoid model, reported as C = 2 columns [class 0, class 1]; C ≥ 2 is softmax.
            Scored in eval mode (dropout off, BatchNorm on running statistics).
        inputs: (N, ...) tensor or array, batch first.
        classes: which class each example is scored for: ``"all"`` (every class, one
            backward pass per class), ``"predicted"`` (the argmax class) or an integer array
            (N,) of one class per example (e.g. the true labels); the last two take ONE
            backward pass per batch whatever C is.
        covariance: ``"identity"`` (‖g‖², the paper's estimator), ``"diagonal"``,
            ``"laplace"`` (full H + λI), ``"last_layer"`` (full Laplace on the last layer), or
            a covariance object from ``isouq.covariance``.
        params: which parameters take part (see ``isouq.params.select_params``).
        batch_size: examples per forward/backward (ghost) or per Jacobian chunk (functorch).
        data: (X, y) proxy data for the curvature of a Laplace covariance.
        prior_precision: λ of a Laplace covariance.
        hessian: curvature kind of a Laplace covariance ("ggn", "ef", "hessian").
        method: the engine (``isouq.engines.ENGINES``): ``"auto"``, ``"ghost"`` (identity
            covariance only) or ``"per_example"`` (torch.func per-example Jacobians; older
            name ``"functorch"``).
        check_independent: compare example 0's output alone with its output in the batch
            (one extra forward of one example) and refuse a model whose layers mix examples.
            A model that passed is remembered for inputs of the same shape, dtype and device
            and the same module modes: later calls skip the extra forward.

    Returns:
        Scores with ``probs`` (N, C), and, for ``classes="all"``, ``epistemic`` =
        ‖∇θ p_c‖² (probability² units, or gᵀCg), ``epistemic_log`` = ‖∇θ log p_c‖²
        (= epistemic / p_c²) and ``aleatoric`` = p_c(1 − p_c), each (N, C); for
        ``"predicted"`` or indices each is (N,) for the scored class, recorded in
        ``classes`` (N,) int64.
    """
    x = as_batch(inputs, model)
    n = x.shape[0]
    spec = _classes_spec(classes, n)
    with eval_mode(model):
        alone = None
        key = _independence_key(model, x) if check_independent and n > 1 else None
        if key is not None and key in _INDEPENDENT.get(model, ()):
            key = None  # checked before with inputs like these
        if key is not None:
            with torch.no_grad():  # example 0 alone (or beside a copy of itself, for models
                try:                # that refuse a batch of one, e.g. batch-statistics BatchNorm)
                    alone = model(x[:1])
                except (RuntimeError, ValueError):
                    alone = _call_model(model, x[[0, 0]], tuple(x.shape))[:1]
                alone = _logits_2d(alone, "score_classifier")
                _check_range(spec, alone.shape[1])
        pspec = "last_layer" if covariance == "last_layer" and params is None else params
        sel = select_params(model, pspec, run_forward=lambda: model(x[:1]))
        cov = build_covariance(covariance, model=model, params=sel, data=data,
                               likelihood="classification", prior_precision=prior_precision,
                               hessian=hessian)
        engine = _engine(model, sel, cov, method)
        if engine == "ghost":
            logits, G = _ghost_classifier(model, sel, x, spec, batch_size or GHOST_BATCH, alone)
            G = cov.scale * G
        else:
            logits = _logits_2d(forward_all(model, x, batch_size or GHOST_BATCH), "score_classifier")
            _check_range(spec, logits.shape[1])
            if alone is not None:
                _check_independent(logits[0], alone[0])
        cls = _resolve(spec, logits)
        if engine != "ghost":
            G = _functorch_classifier(model, sel, x, logits, cls, cov, batch_size)
        probs = class_probs(logits)
        epi, epi_log = _from_log(G, probs, None if cls is None else cls.to(probs.device),
                                 logits.shape[1] == 1)
    if key is not None:  # the check passed
        _INDEPENDENT.setdefault(model, set()).add(key)
    if cls is None:
        alea = probs * (1 - probs)
    else:
        pc = probs.gather(1, cls.view(-1, 1).to(probs.device)).view(-1)
        alea = pc * (1 - pc)
    return Scores(
        epistemic=epi,
        aleatoric=alea,
        probs=probs,
        params=param_info(sel, model, pspec),
        covariance=getattr(cov, "name", str(covariance)),
        epistemic_log=epi_log,
        classes=None if cls is None else cls.to(probs.device),
    )


def score_regressor(
    model: nn.Module,
    inputs,
    *,
    covariance="identity",
    params: ParamSpec = None,
    batch_size: int | None = None,
    data: tuple | None = None,
    prior_precision: float = 1.0,
    hessian: CurvatureKind = "ggn",
    sigma_noise: float = 1.0,
    method: Method = "auto",
) -> Scores:
    """Epistemic uncertainty gᵀCg, g = ∇θ f(xᵢ, θ*), of a scalar regressor.

    Args:
        model: maps a batch (N, ...) to outputs (N,) or (N, 1); scored in eval mode.
        inputs: (N, ...) tensor or array, batch first.
        covariance: ``"identity"`` (‖g‖², the paper's estimator), ``"diagonal"``,
            ``"laplace"``, ``"last_layer"``, or a covariance object from ``isouq.covariance``.
        params: which parameters take part (see ``isouq.params.select_params``).
        batch_size: examples per forward/backward (ghost) or per Jacobian chunk (functorch).
        data: (X, y) proxy data for the curvature of a Laplace covariance.
        prior_precision: λ of a Laplace covariance.
        hessian: curvature kind of a Laplace covariance ("ggn", "ef", "hessian").
        sigma_noise: σ of the Gaussian likelihood of a Laplace covariance (output units).
        method: the engine (``isouq.engines.ENGINES``): ``"auto"``, ``"ghost"`` (identity
            covariance only) or ``"per_example"`` (torch.func per-example Jacobians; older
            name ``"functorch"``).

    Returns:
        Scores with ``epistemic`` (N,) in output units squared and ``mean`` (N,) = f(xᵢ, θ*);
        ``aleatoric`` and ``probs`` are None.
    """
    x = as_batch(inputs, model)
    with eval_mode(model):
        out = _logits_2d(forward_all(model, x, batch_size or GHOST_BATCH), "score_regressor")
        if out.shape[1] != 1:
            raise ModelError(
                f"score_regressor needs one output per example, got {out.shape[1]}; "
                "score each output with a wrapper module that selects it"
            )
        spec = "last_layer" if covariance == "last_layer" and params is None else params
        sel = select_params(model, spec, run_forward=lambda: model(x[:1]))
        lik: Likelihood = "regression"
        cov = build_covariance(covariance, model=model, params=sel, data=data, likelihood=lik,
                               prior_precision=prior_precision, hessian=hessian,
                               sigma_noise=sigma_noise)

        def outputs(o):
            return _logits_2d(o, "score_regressor")

        epi = _epistemic(model, sel, x, outputs, 1, cov, method, batch_size)[:, 0]
    return Scores(
        epistemic=epi,
        mean=out[:, 0],
        params=param_info(sel, model, spec),
        covariance=getattr(cov, "name", str(covariance)),
    )
