"""Per-example Jacobians of a model's outputs with torch.func (vmap over jacrev), chunked.

For small and mid-size models. For large ones with the identity covariance, ghost norms
(``isouq.ghost``) give ‖g‖² without ever holding a per-example gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from .runtime import env_int

#: the memory budget of one chunk of per-example Jacobians unless ``ISOUQ_CHUNK_BYTES`` says
#: otherwise (:func:`chunk_bytes`)
DEFAULT_CHUNK_BYTES = 512 * 2**20


def chunk_bytes() -> int:
    """The memory budget (bytes) of one chunk of per-example Jacobians: ``ISOUQ_CHUNK_BYTES``,
    read now, else :data:`DEFAULT_CHUNK_BYTES` (512 MiB).

    Raises:
        InputError: naming the variable, when it is not a whole number ≥ 1.
    """
    return env_int("ISOUQ_CHUNK_BYTES", DEFAULT_CHUNK_BYTES, low=1)


def flatten(tensors: dict[str, torch.Tensor], batch_dims: int = 0) -> torch.Tensor:
    """Concatenate tensors into (*batch, P), keeping the first ``batch_dims`` dims."""
    parts = [t.reshape(*t.shape[:batch_dims], -1) for t in tensors.values()]
    return torch.cat(parts, dim=-1)


def unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten` for a 1-D ``flat`` of length P."""
    out, i = {}, 0
    for n, t in like.items():
        out[n] = flat[i : i + t.numel()].view_as(t)
        i += t.numel()
    return out


def functional_model(
    model: nn.Module, params: dict[str, nn.Parameter]
) -> Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]:
    """f(theta, x_batch) = model(x_batch) with the selected parameters replaced by ``theta``."""
    sel = set(params)
    fixed = {n: p.detach() for n, p in model.named_parameters() if n not in sel}
    fixed.update(dict(model.named_buffers()))

    def f(theta: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, {**fixed, **theta}, (x,))

    return f


def chunk_size_for(per_example_floats: int, budget_bytes: int | None = None) -> int:
    """How many examples fit a memory budget when each needs ``per_example_floats`` floats.

    The factor 3 leaves room for vmap's intermediates next to the Jacobian itself.

    Args:
        per_example_floats: floats one example's Jacobian holds.
        budget_bytes: the budget; None: :func:`chunk_bytes` (``ISOUQ_CHUNK_BYTES``).

    Returns:
        The chunk size, at least 1.
    """
    budget = chunk_bytes() if budget_bytes is None else budget_bytes
    return max(1, budget // max(1, 3 * 4 * per_example_floats))


def output_jacobians(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    inputs: torch.Tensor,
    output_fn: Callable[[torch.Tensor], torch.Tensor],
    n_outputs: int,
    *,
    chunk_size: int | None = None,
) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """Yield (rows, outputs, J) per chunk of ``inputs`` (N, ...).

    output_fn maps the model's output for a batch of one (1, ...) to a vector of K = n_outputs
    values (e.g. class probabilities). outputs: (n, K). J: (n, K, P), J[i, k] = ∇θ out_k(x_i),
    flattened over the selected parameters in ``params`` order. Memory per chunk is bounded
    by ``chunk_size`` (default: from ISOUQ_CHUNK_BYTES, 512 MiB).
    """
    f = functional_model(model, params)
    theta = {n: p.detach() for n, p in params.items()}
    n_params = sum(p.numel() for p in theta.values())

    def one(th, x):
        out = output_fn(f(th, x.unsqueeze(0)))
        return out, out

    jac = vmap(jacrev(one, has_aux=True), in_dims=(None, 0))
    size = chunk_size or chunk_size_for(n_outputs * n_params)
    for start in range(0, inputs.shape[0], size):
        rows = slice(start, min(start + size, inputs.shape[0]))
        grads, outs = jac(theta, inputs[rows])
        yield rows, outs.detach(), flatten(grads, batch_dims=2).detach()
