"""The floor of every per-example gradient method: a forward and a backward of the same scalar
with every weight frozen, so that autograd computes activation gradients only."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def activation_gradients_only(model):
    """Within it, ``model``'s weights are frozen and its input embeddings' output requires grad
    (the graph starts there, as in the ghost engine); restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: o.detach().requires_grad_(True))
    try:
        yield
    finally:
        hook.remove()
        for p, f in flags:
            p.requires_grad_(f)
