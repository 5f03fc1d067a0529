"""The registry of ghost rules: which layer types have an exact fast per-example rule.

A rule turns one recorded call of a layer (its inputs, and the gradient of Σᵢ sᵢ with respect
to its output) into per-example gradient contributions of the layer's own parameters
(:class:`~isouq.ghost.factors.Pair` or :class:`~isouq.ghost.factors.Materialized`). Each rule
file registers itself, as Opacus's ``register_grad_sampler`` does::

    from isouq.ghost import Call, Materialized, register_rule

    @register_rule(MyScale)                       # MyScale: y = x * w, w of shape (d,)
    def my_scale(module: MyScale, call: Call) -> dict:
        x, b = call.args[0], call.grad            # (N, ..., d) each, batch first
        return {"w": Materialized((x * b).reshape(x.shape[0], -1, x.shape[-1]).sum(1))}

The keys are the parameter names local to the module (``"weight"``, ``"bias"``); a parameter
left out gets no contribution from that call. The result must be exact: test a new rule
against per-example autograd (``tests/ghost/test_rules.py`` shows how).

Lookup (:func:`rule_for`) walks the module type's MRO and takes the first registered class.
A subclass that overrides ``forward`` (quantized layers, LoRA wrappers) computes something
else, so it gets no rule (the exact generic fallback runs) unless the rule was registered with
``subclasses=True``; ``applies`` adds conditions (e.g. an embedding with ``max_norm``);
``match`` registers by a predicate instead of a type (classes of optional packages matched by
name). A module with child modules gets no rule, unless registered with ``composite=True``: then
it owns its children's parameters too (``nn.MultiheadAttention`` uses ``out_proj.weight``
without calling ``out_proj``), under their dotted names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch import nn

from .calls import Call
from .factors import Contribution

RuleFn = Callable[[nn.Module, Call], dict[str, Contribution]]


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``contributions(module, call)`` -> {local name: Contribution}."""

    contributions: RuleFn
    name: str
    subclasses: bool = False
    composite: bool | Callable[[nn.Module], bool] = False
    applies: Callable[[nn.Module], bool] | None = None

    def owns_children(self, module: nn.Module) -> bool:
        """True if ``module``'s forward uses its children's parameters (``composite``)."""
        return bool(self.composite(module) if callable(self.composite) else self.composite)
    uses_output: bool = True
    reads_params: bool = True
    #: called as ``before_backward(module, call)`` for each recorded call before the backward
    #: runs: decisions that read a weight's values (and caches keyed by its storage) are made
    #: there, outside the backward (which may be captured as one graph, ``isouq.capture``)
    before_backward: Callable[[nn.Module, Call], None] | None = None


_BY_TYPE: dict[type, Rule] = {}
_BY_MATCH: list[tuple[Callable[[nn.Module], bool], Rule]] = []
#: module-name prefix of an optional package -> the function registering its rules (once)
_PACKAGES: dict[str, Callable[[], None]] = {}


def register_rule(
    *types: type,
    match: Callable[[nn.Module], bool] | None = None,
    applies: Callable[[nn.Module], bool] | None = None,
    subclasses: bool = False,
    composite: bool | Callable[[nn.Module], bool] = False,
    uses_output: bool = True,
    reads_params: bool = True,
    before_backward: Callable[[nn.Module, Call], None] | None = None,
) -> Callable[[RuleFn], RuleFn]:
    """Decorator registering ``fn(module, call) -> {local param name: Contribution}``.

    Args:
        *types: module classes the rule is for (a later registration of a class replaces an
            earlier one, so a user can override a built-in rule).
        match: instead of (or besides) types, a predicate selecting modules.
        applies: extra condition; when it returns False the exact fallback runs.
        subclasses: True if the rule is exact for subclasses that override ``forward``.
        composite: True if the module's children's parameters are used by its own forward
            (they are then owned by this module, under dotted names), or a predicate saying
            so of a module (a PEFT layer with a DoRA adapter; when ``applies`` then says no,
            the fallback differentiates the whole module).
        uses_output: False if the rule never reads ``call.output``: the engine then does not
            keep the layer's output alive until the backward (a Linear layer's output is
            memory autograd itself would free early: 0.6 GiB for SmolLM2 at batch 32).
        reads_params: False if the rule never reads the module's parameter values (shapes and
            ``is None`` aside): under FSDP2 the engine then makes no copy of the gathered
            weights for it. A rule that reads them must do so through
            ``isouq.ghost.weights.rule_params(module, call)``, exact for weights accelerate
            offloads or FSDP2 shards.
        before_backward: ``fn(module, call)`` run for each recorded call before the backward
            (outside it): what a rule decides from a weight's values goes there (it may leave
            its result in ``call.extra``).

    Returns:
        The decorator; it returns ``fn`` unchanged.
    """
    if not types and match is None:
        raise TypeError("register_rule needs at least one module type or match=")
    for t in types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"register_rule: {t!r} is not an nn.Module subclass")

    def deco(fn: RuleFn) -> RuleFn:
        rule = Rule(fn, getattr(fn, "__qualname__", repr(fn)), subclasses, composite, applies,
                    uses_output, reads_params, before_backward)
        for t in types:
            _BY_TYPE[t] = rule
        if match is not None:
            _BY_MATCH.append((match, rule))
        return fn

    return deco


def register_package(prefix: str, register: Callable[[], None]) -> None:
    """Call ``register`` (which registers rules for an optional package's layer types, and may
    import that package) the first time a module of a class from ``prefix`` is looked up: a
    model holding such a layer has the package loaded already; isouq never imports it."""
    _PACKAGES[prefix] = register


def _registered(module: nn.Module) -> Rule | None:
    cls = type(module)
    for prefix in [p for p in _PACKAGES if cls.__module__.startswith(p)]:
        _PACKAGES.pop(prefix)()  # once: the package's rules
    for k in cls.__mro__:
        rule = _BY_TYPE.get(k)
        if rule is None:
            continue
        if k is not cls and not rule.subclasses and cls.forward is not k.forward:
            return None  # a subclass that computes something else: exact fallback
        return rule
    for pred, rule in reversed(_BY_MATCH):
        if pred(module):
            return rule
    return None


def is_composite(module: nn.Module) -> bool:
    """True if ``module``'s type is registered as owning its children's parameters."""
    rule = _registered(module)
    if rule is None:  # a subclass with its own forward still uses its children's weights
        rule = next((r for k in type(module).__mro__ if (r := _BY_TYPE.get(k))), None)
    return bool(rule and rule.owns_children(module))


def rule_for(module: nn.Module) -> Rule | None:
    """The registered rule for ``module``, or None (the exact generic fallback runs)."""
    rule = _registered(module)
    if rule is None:
        return None
    if not rule.owns_children(module) and any(True for _ in module.children()):
        return None
    if rule.applies is not None and not rule.applies(module):
        return None
    return rule


def owned_parameters(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Parameter]]:
    """(module, local name, parameter) for every parameter and each module that uses it.

    A parameter belongs to the module holding it, except inside a composite module (e.g.
    ``nn.MultiheadAttention``), which owns its children's parameters under dotted names.
    A parameter held by several modules (tied weights) is listed once per holder.
    """
    claimed: set[int] = set()
    for mod in model.modules():
        if id(mod) in claimed:
            continue
        if is_composite(mod):
            for sub in mod.modules():
                claimed.add(id(sub))
            for local, p in mod.named_parameters(remove_duplicate=False):
                yield mod, local, p
            continue
        for local, p in mod._parameters.items():
            if p is not None:
                yield mod, local, p
