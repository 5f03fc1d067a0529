"""Which parameters take part in the gradient: named sets (``all``, ``trainable``, ``adapter``,
``last-layer``), name patterns, or tensors; their count, share of the model and ‖θ*‖²."""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .errors import InputError, ModelError
from .ghost.weights import is_dtensor, is_offloaded, offloaded_ties, resolve
from .param_sets import DEFAULT_SET, PARAM_SETS
from .quantized import check_inputs_not_quantized, dequantized, is_quantized, logical_numel
from .scores import ParamInfo

ParamSpec = None | str | Sequence[str] | Sequence[nn.Parameter]


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters that require grad, by name (shared tensors listed once, first name wins)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """The PEFT adapter weights, by name: the parameters held under a tuner layer's
    ``adapter_layer_names`` (LoRA: ``lora_A``, ``lora_B``, embedding and DoRA variants)."""
    ids: set[int] = set()
    for m in model.modules():
        for attr in getattr(m, "adapter_layer_names", ()) if hasattr(m, "base_layer") else ():
            sub = getattr(m, attr, None)
            if isinstance(sub, nn.Module):
                ids.update(id(p) for p in sub.parameters())
    return {n: p for n, p in model.named_parameters() if id(p) in ids}


def model_numel(model: nn.Module) -> int:
    """Scalar parameters of the model, quantized weights counted as their dequantized values."""
    return sum(logical_numel(p) for p in model.parameters())


def last_layer_names(model: nn.Module, run_forward: Callable[[], object]) -> list[str]:
    """Names of the parameters of the last leaf module with parameters that ``run_forward`` calls."""
    order: list[str] = []
    hooks = []
    for mname, mod in model.named_modules():
        if any(True for _ in mod.parameters(recurse=False)):
            hooks.append(mod.register_forward_hook(lambda m, i, o, _n=mname: order.append(_n)))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for h in hooks:
            h.remove()
    if not order:
        raise ModelError("params='last_layer': the forward pass called no module with parameters")
    last = order[-1]
    prefix = f"{last}." if last else ""
    return [f"{prefix}{n}" for n, p in model.get_submodule(last).named_parameters(recurse=False)]


def select_params(
    model: nn.Module,
    spec: ParamSpec = None,
    *,
    run_forward: Callable[[], object] | None = None,
) -> dict[str, nn.Parameter]:
    """Resolve ``spec`` to the parameters whose gradient enters the score.

    Args:
        model: the network.
        spec: a set's name (``PARAM_SETS``): ``"all"`` (the default, also ``None``: every
            weight as the model computes with it, quantized ones as their dequantized values),
            ``"trainable"`` (those that require grad), ``"adapter"`` (PEFT adapter weights),
            ``"last-layer"`` (the last module with parameters the forward pass calls; needs
            ``run_forward``; ``"last_layer"`` is accepted too); a glob pattern or list of glob
            patterns over parameter names (``"lm_head.*"``, ``["*.mlp.*", "*norm*"]``); or a
            list of parameter tensors.
        run_forward: a function running one forward pass of ``model`` (to find the last layer).

    Returns:
        {name: parameter}, in ``model.named_parameters()`` order.

    Raises:
        ModelError: the model has no parameters (or none requires grad, for "trainable"), or
            torchao rounds its layers' inputs (no gradient passes through them).
        InputError: ``spec`` matches nothing, or is of the wrong type.
    """
    check_inputs_not_quantized(model)
    all_named = dict(model.named_parameters())
    for alias in offloaded_ties(model):  # one weight, as in the model before offloading
        all_named.pop(alias, None)
    if not all_named:
        raise ModelError("the model has no parameters; isouq needs a model with parameters")
    spec = DEFAULT_SET if spec is None else spec
    if isinstance(spec, str) and spec == "last_layer":  # the older spelling
        spec = "last-layer"
    if isinstance(spec, str) and spec in PARAM_SETS:
        return _named_set(model, spec, all_named, run_forward)
    if isinstance(spec, str):
        spec = [spec]
    spec = list(spec)
    if not spec:
        raise InputError("params is an empty list; pass None to use every parameter ('all')")
    if all(isinstance(s, torch.Tensor) for s in spec):
        ids = {id(s) for s in spec}
        chosen = {n: p for n, p in all_named.items() if id(p) in ids}
        if len(chosen) != len(ids):
            raise InputError("params lists tensors that are not parameters of this model")
        return chosen
    if not all(isinstance(s, str) for s in spec):
        raise InputError(f"params must be None, a set name ({', '.join(PARAM_SETS)}), name "
                         "patterns, or parameter tensors")
    chosen = {n: p for n, p in all_named.items() if any(fnmatch.fnmatchcase(n, s) for s in spec)}
    if not chosen:
        some = ", ".join(list(all_named)[:6])
        raise InputError(
            f"params={spec!r} matches no parameter name. Names look like: {some}, ... "
            f"(glob patterns such as 'lm_head.*' or '*.mlp.*' are accepted), or a set name: "
            f"{', '.join(PARAM_SETS)}"
        )
    return chosen


def _named_set(model: nn.Module, name: str, all_named: dict[str, nn.Parameter],
               run_forward: Callable[[], object] | None) -> dict[str, nn.Parameter]:
    if name == "all":
        return all_named
    if name == "trainable":
        chosen = trainable(model)
        if not chosen:
            raise ModelError(
                "params='trainable': no parameter of the model requires grad (all are frozen or "
                "quantized); use params='all' (every weight, quantized ones included) or "
                "unfreeze the ones to score with p.requires_grad_(True)")
        return chosen
    if name == "adapter":
        chosen = adapter_params(model)
        if not chosen:
            raise InputError(
                "params='adapter': the model has no PEFT adapter; load one (--adapter PATH, "
                "or peft.PeftModel.from_pretrained) or choose params='all'")
        return chosen
    if run_forward is None:
        raise InputError("params='last-layer' needs example inputs to find the last layer")
    return {n: all_named[n] for n in last_layer_names(model, run_forward)}


def set_name(spec: ParamSpec) -> str:
    """The name a result records for ``spec``: the set's name, the patterns, or "custom"."""
    if spec is None:
        return DEFAULT_SET
    if isinstance(spec, str):
        return "last-layer" if spec == "last_layer" else spec
    if all(isinstance(x, str) for x in spec):
        return ",".join(spec)
    return "custom"


#: id(parameter) -> (weak reference, (version, address, dtype), ‖p‖²): a scoring call reuses
#: the squared norm of a parameter left unchanged since the last call (reading every weight
#: takes 0.08 s for a 135M model on CPU); an in-place update bumps the version, a new tensor
#: moves the address. (By id: tensors compare elementwise, so they cannot be dictionary keys.)
_SQ_NORMS: dict[int, tuple] = {}


def _sq_norm(p: torch.Tensor, owner: nn.Module | None = None) -> float:
    """‖p‖² (float32 norm, squared in Python's float64), cached while p is unchanged; a
    quantized ``p`` as its dequantized values (``owner``: the module holding it)."""
    key = (p._version, _address(p), p.dtype)
    hit = _SQ_NORMS.get(id(p))
    if hit is not None and hit[0]() is p and hit[1] == key:
        return hit[2]
    with torch.no_grad():
        w = dequantized(p, owner) if is_quantized(p) else p.detach()
        sq = float(torch.linalg.vector_norm(w)) ** 2
    i = id(p)
    _SQ_NORMS[i] = (weakref.ref(p, lambda _: _SQ_NORMS.pop(i, None)), key, sq)
    return sq


def _address(p: torch.Tensor) -> int:
    """Where ``p``'s values live: its data pointer, or its codes' for a tensor subclass
    without storage of its own (torchao)."""
    inner = getattr(p, "qdata", None)
    return (inner if isinstance(inner, torch.Tensor) else p).data_ptr()


def _sq_norm_all(params: dict[str, nn.Parameter], model: nn.Module | None) -> float:
    """Σ ‖p‖² over ``params``: a weight accelerate offloads (on ``meta``) read from where it
    keeps it; a sharded one (FSDP2's DTensor) as the sum of every rank's ‖local shard‖², one
    all-reduce per device mesh (every rank calls this with the same parameters)."""
    sq, sharded = 0.0, {}
    for name, p in params.items():
        if is_dtensor(p):
            local = p.detach().to_local()
            part = float(torch.linalg.vector_norm(local)) ** 2 if local.numel() else 0.0
            mesh = p.device_mesh
            sharded.setdefault(id(mesh), [mesh, local.device, 0.0])[2] += part
        elif is_offloaded(p):
            if model is None:
                raise ModelError(f"the weight {name!r} is offloaded (on 'meta'): pass the model "
                                 "to read its values")
            with torch.no_grad():
                w = resolve(model, name, p)
                sq += float(torch.linalg.vector_norm(w)) ** 2
        else:
            owner = (model.get_submodule(name.rpartition(".")[0])
                     if model is not None and is_quantized(p) else None)
            sq += _sq_norm(p, owner)
    for mesh, device, part in sharded.values():
        import torch.distributed as dist

        t = torch.tensor([part], dtype=torch.float64, device=device)
        dist.all_reduce(t, group=mesh.get_group())
        sq += float(t[0])
    return sq


def param_info(params: dict[str, nn.Parameter], model: nn.Module | None = None,
               spec: ParamSpec = None) -> ParamInfo:
    """Names, total count, ‖θ*‖², set name and share of the model of the selected parameters
    (quantized weights as their dequantized values; offloaded and sharded ones read where
    accelerate or FSDP2 keeps them)."""
    # float32 norms per tensor (no float64 copy of a large model), summed in float64
    sq = _sq_norm_all(params, model)
    return ParamInfo(
        names=tuple(params), n_params=sum(logical_numel(p) for p in params.values()),
        sq_norm=sq, set=set_name(spec), n_model=model_numel(model) if model is not None else 0,
    )
