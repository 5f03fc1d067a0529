"""JAX mirror of the torch toy models (:mod:`isouq.models.toy`), for the references.

A model is an :class:`~isouq.models.toy.MLPSpec` plus a flat parameter vector θ
(D,) in ``torch.nn.utils.parameters_to_vector`` order: ``0.weight`` (out, in) row-major,
``0.bias``, ``2.weight``, … . :func:`forward` computes the same outputs as the torch model
with those parameters; :func:`to_state_dict` / :func:`flat_params` move θ between the two.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from ...errors import InputError
from ...models.toy import MLPSpec


def unflatten(theta: jax.Array, spec: MLPSpec) -> list[tuple[jax.Array, jax.Array]]:
    """[(W (out, in), b (out,))] per Linear layer from flat θ (D,)."""
    layers, i = [], 0
    for fan_in, fan_out in spec.layer_dims:
        W = theta[i : i + fan_in * fan_out].reshape(fan_out, fan_in)
        i += fan_in * fan_out
        b = theta[i : i + fan_out]
        i += fan_out
        layers.append((W, b))
    return layers


def forward(theta: jax.Array, X: jax.Array, spec: MLPSpec) -> jax.Array:
    """Model outputs (N, out_dim) for inputs X (N, in_dim) and flat parameters θ (D,)."""
    h = X
    layers = unflatten(theta, spec)
    for k, (W, b) in enumerate(layers):
        h = h @ W.T + b
        if k < len(layers) - 1:
            h = jnp.tanh(h)
    return h


def outputs_to_quantity(out: jax.Array, task: str) -> jax.Array:
    """What the references average: (N, C) class probabilities, or (N,) f(x) for regression.

    Binary: [1 − σ(z), σ(z)] (C = 2) from the single logit; multiclass: softmax.
    """
    if task == "binary":
        p1 = jax.nn.sigmoid(out[:, 0])
        return jnp.stack([1.0 - p1, p1], axis=1)
    if task == "multiclass":
        return jax.nn.softmax(out, axis=1)
    if task == "regression":
        return out[:, 0]
    raise InputError(f"unknown task {task!r}; use binary, multiclass or regression")


def predict_fn(spec: MLPSpec, task: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """q(θ, X): (N, C) probabilities or (N,) regression means for one parameter vector."""

    def q(theta: jax.Array, X: jax.Array) -> jax.Array:
        return outputs_to_quantity(forward(theta, X, spec), task)

    return q


# --------------------------------------------------------------------------- torch bridge


def flat_params(model: nn.Module) -> np.ndarray:
    """θ (D,) float64 of a torch model, in ``named_parameters()`` order."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().double().cpu().numpy()


def to_state_dict(
    theta: np.ndarray | jax.Array | torch.Tensor,
    spec: MLPSpec,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """A ``state_dict`` for ``toy.build(spec)`` from flat θ (D,) (e.g. a VI mean).

    >>> model = build(spec); model.load_state_dict(to_state_dict(ref.param_mean, spec))
    """
    t = torch.as_tensor(np.asarray(theta), dtype=dtype).reshape(-1)
    if t.numel() != spec.n_params:
        raise InputError(
            f"θ has {t.numel()} values but {spec.label()} has {spec.n_params} parameters; "
            "pass the parameters of a model with this spec"
        )
    out, i = {}, 0
    for name, shape in spec.param_shapes():
        n = int(np.prod(shape))
        out[name] = t[i : i + n].reshape(shape).clone()
        i += n
    return out


def load_into(model: nn.Module, theta: np.ndarray | jax.Array | torch.Tensor) -> nn.Module:
    """Write flat θ (D,) into a toy model in place (its own dtype) and return it."""
    p0 = next(model.parameters())
    t = torch.as_tensor(np.asarray(theta), dtype=p0.dtype).reshape(-1)
    n = sum(p.numel() for p in model.parameters())
    if t.numel() != n:
        raise InputError(f"θ has {t.numel()} values but the model has {n} parameters")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(t, model.parameters())
    return model
