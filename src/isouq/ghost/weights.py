"""The weights a rule computes with, where the module does not hold them between calls.

Two ways of running a model larger than one device leave a layer's parameters somewhere else
than the layer while no forward of it runs:

- accelerate's offloading (``dispatch_model`` with "cpu"/"disk" in the device map, what
  ``device_map="auto"`` does with a model larger than its devices; ``cpu_offload``,
  ``disk_offload``): the parameter is a tensor on ``meta``; the module's ``AlignDevicesHook``
  copies the values from its ``weights_map`` (CPU memory or memory-mapped files) to its
  execution device just before the forward and puts ``meta`` back just after. Torch's forward
  hooks run outside that window, so a rule reads the values from the hook's ``weights_map``
  itself (:func:`resolve`), and calls the module's own forward without the hook
  (:func:`unhooked`) when it re-runs it with other weights (``functional_call``).
- FSDP2 (``torch.distributed.fsdp.fully_shard``): the parameter is a sharded DTensor; FSDP
  all-gathers a layer's parameters before its forward and frees them after. The engine copies
  what a rule reads while they are gathered, in its forward hook (:func:`gathered_copy`, only
  for rules that read parameters and the fallback; a few vectors per call for norm layers).

Rules read parameters through :func:`rule_params` (``call.extra["params"]`` when the engine
copied them, else the module's own, resolved): exact whichever way the model is placed. A rule
that only needs the input and the output gradient (``nn.Linear``, ``nn.Embedding``) reads no
weight at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .calls import Call


def accelerate_hooks(module: nn.Module) -> list:
    """The accelerate hooks attached to ``module`` (a ``SequentialHook`` unrolled)."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", None) or [hook])


def execution_device(module: nn.Module) -> torch.device | None:
    """The device accelerate runs ``module`` on (its hook's execution device), else None."""
    for hook in accelerate_hooks(module):
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}")
    return None


def is_offloaded(t: torch.Tensor | None) -> bool:
    """True for a tensor accelerate keeps on ``meta`` between forwards."""
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def is_dtensor(t: torch.Tensor | None) -> bool:
    """True for a DTensor (FSDP2's sharded parameter: a shard per rank on a device mesh), told
    without importing ``torch.distributed.tensor``."""
    return isinstance(t, torch.Tensor) and (type(t).__name__ == "DTensor" or (
        hasattr(t, "device_mesh") and hasattr(t, "to_local")))


def placement(t: torch.Tensor) -> str:
    """Where a parameter's values are: ``"sharded"`` (a DTensor: FSDP2), ``"offloaded"`` (on
    ``meta``: accelerate keeps them elsewhere between forwards) or ``"local"``."""
    return "sharded" if is_dtensor(t) else "offloaded" if is_offloaded(t) else "local"


def _holder(root: nn.Module, name: str) -> tuple[list[str], list[nn.Module]]:
    """The name's parts and the modules along it, ``root`` first."""
    parts = name.split(".")
    mods = [root]
    for p in parts[:-1]:
        mods.append(getattr(mods[-1], p))
    return parts, mods


def resolve(root: nn.Module, name: str, t: torch.Tensor | None = None) -> torch.Tensor:
    """The value of ``root``'s parameter or buffer ``name`` (dotted), detached: the module's own
    tensor, or, for one accelerate keeps on ``meta``, the copy its hook would load before the
    forward (``weights_map``, on the hook's execution device, in the tensor's dtype).

    Raises:
        RuntimeError: the tensor is on ``meta`` and no accelerate hook from ``root`` down to
            its holder has its values.
    """
    if t is None:
        try:
            t = root.get_parameter(name)
        except AttributeError:
            t = root.get_buffer(name)
    if not is_offloaded(t):
        return t.detach()
    parts, mods = _holder(root, name)
    # the holder's own hook first, then an ancestor's that places its submodules
    for k in range(len(mods) - 1, -1, -1):
        for hook in accelerate_hooks(mods[k]):
            wmap = getattr(hook, "weights_map", None)
            if not getattr(hook, "offload", False) or wmap is None:
                continue
            if k != len(mods) - 1 and not getattr(hook, "place_submodules", False):
                continue
            try:
                value = wmap[".".join(parts[k:])]
            except KeyError:
                continue
            dev = execution_device(mods[k])
            return value.detach().to(device=dev if dev is not None else value.device,
                                     dtype=t.dtype)
    raise RuntimeError(
        f"the weight {name!r} is on the 'meta' device and no accelerate hook holds its values: "
        "load the model with its weights (or dispatch it with accelerate's dispatch_model)")


def offloaded_ties(model: nn.Module) -> dict[str, str]:
    """{alias: name} of tied weights that offloading split into two parameter objects.

    accelerate gives each module its own ``meta`` parameter, so a tied pair (an LM head sharing
    the input embedding) becomes two tensors loaded from the same values: the model still
    computes with one weight, whose gradient is the sum of both uses. The pairs are the ones
    the model declares tied (transformers' ``all_tied_weights_keys``, {tied: source}) that are
    now different objects, one of them offloaded; scoring takes the alias as the source."""
    declared = getattr(model, "all_tied_weights_keys", None) or {}
    out = {}
    for target, source in declared.items():
        try:
            t, s = model.get_parameter(target), model.get_parameter(source)
        except AttributeError:
            continue
        if t is not s and (is_offloaded(t) or is_offloaded(s)) and t.shape == s.shape:
            out[target] = source
    return out


def module_tensors(module: nn.Module, *, recurse: bool = False, buffers: bool = False
                   ) -> dict[str, torch.Tensor]:
    """{local name: detached value} of the module's parameters (and buffers), offloaded ones
    read where accelerate keeps them (:func:`resolve`)."""
    named = list(module.named_parameters(recurse=recurse))
    if buffers:
        named += list(module.named_buffers(recurse=recurse))
    return {n: resolve(module, n, t) for n, t in named}


def rule_params(module: nn.Module, call: Call, *, recurse: bool = False
                ) -> dict[str, torch.Tensor]:
    """The parameters a rule computes ``call`` with, detached: the engine's copy made during the
    forward (FSDP2 frees gathered weights after it), else the module's own, resolved."""
    copied = call.extra.get("params")
    if copied is not None:
        return dict(copied)
    return module_tensors(module, recurse=recurse)


def gathered_copy(module: nn.Module, *, recurse: bool = False) -> dict[str, torch.Tensor]:
    """A copy of the module's parameters as they are now (inside its forward hook, FSDP2's
    gathered ones), kept for the rule after FSDP frees them."""
    return {n: p.detach().clone() for n, p in module.named_parameters(recurse=recurse)}


def is_sharded(model: nn.Module) -> bool:
    """True if FSDP2 (``fully_shard``) manages some part of ``model``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without distributed
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextmanager
def unhooked(module: nn.Module) -> Iterator[None]:
    """Within it, calling ``module`` (and its submodules) runs their own forward without
    accelerate's hook, which would put the offloaded weights in place of the ones a
    ``functional_call`` passes (and reject a plain tensor where a parameter was)."""
    swapped = []
    for m in module.modules():
        if accelerate_hooks(m) and hasattr(m, "_old_forward"):
            swapped.append((m, m.__dict__.get("forward")))
            m.forward = m._old_forward
    try:
        yield
    finally:
        for m, fwd in swapped:
            if fwd is None:
                del m.forward
            else:
                m.forward = fwd
