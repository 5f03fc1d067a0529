"""The hook manager: per-example ‖∇θ sᵢ‖² for a batch from ONE backward pass of Σᵢ sᵢ.

Usage::

    with GhostNorms(model, params) as ghost:
        out = model(x)                      # forward hooks record inputs of the hooked layers
        s = per_example_scalar(out)         # (N,), example i depends on input i only
        sq = ghost.backward(s)              # (N,) = ‖∇θ sᵢ‖² over the selected parameters

Inside the context every model weight is frozen (requires_grad=False), so autograd computes
activation gradients only — the cost floor of any per-example method; hooks on the outputs of
the layers that own selected parameters capture bᵢ = ∂(Σ s)/∂outputᵢ = ∂sᵢ/∂outputᵢ and the
layer rules turn (input, b) into exact per-example norms (``factors.py``). Requirements: examples
are independent in the forward (no batch norm in train mode, masks keep padded rows apart),
and dim 0 of every hooked layer's input/output is the example, or, given ``seq_len`` = T, a
layer may see the batch flattened batch-major to (N·T, …) as ``x.reshape(-1, d)`` of an
(N, T, d) tensor makes it (OPT's feed-forward blocks): its calls are read as (N, T, …).

Layers that read one input tensor (q/k/v, gate/up) share its Gram and one cost rule
(``shared.py``); ``share_grams=False`` (or ``ISOUQ_GHOST_SHARE_GRAMS=0``) computes every
parameter on its own instead, as a side-by-side reference.
"""

from __future__ import annotations

import os
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import InputError, ModelError
from ..quantized import is_quantized, logical_numel
from . import factors, fallback
from .calls import Call
from .factors import Contribution, Materialized, Pair, choose_gram, sq_norms
from .reduction import Reduction
from .registry import owned_parameters
from .registry import rule_for as rule_for  # rules register themselves (ghost/registry.py)
from .shared import SharedInputs
from .weights import execution_device, gathered_copy, is_sharded, offloaded_ties


@dataclass
class GhostResult:
    """total: (N,) ‖g‖²; per_param: (N, n) by parameter tensor, columns in ``names`` order
    (None when not asked for); per_group: (N, G) by group of parameters (``groups`` of
    :meth:`GhostNorms.backward_detailed`; None without groups)."""

    total: torch.Tensor
    per_param: torch.Tensor | None
    names: tuple[str, ...]
    per_group: torch.Tensor | None = None


class GhostNorms:
    """Context manager computing exact per-example squared gradient norms with hooks.

    Args:
        model: the model; inside the context every weight is frozen (activation gradients
            only) and the layers owning ``params`` are hooked.
        params: name -> parameter of the parameters that take part (e.g.
            ``dict(model.named_parameters())``).
        warn: warn once when a layer type has no rule (the exact fallback runs).
        seq_len: T, when a layer sees the batch flattened to (N·T, …) (OPT's feed-forward
            blocks): such calls are read as (N, T, …).
        share_grams: layers reading one input tensor (q/k/v, gate/up) compute its Gram once
            and follow one cost rule (``shared.py``); ``backward`` then also sums their
            output-gradient Grams before one inner product. False: every parameter on its own
            (the reference the shared path is measured against). Default: on, unless the
            environment variable ``ISOUQ_GHOST_SHARE_GRAMS`` is ``0``.
    """

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter], *, warn: bool = True,
                 seq_len: int | None = None, share_grams: bool | None = None):
        self.model = model
        self.seq_len = seq_len
        self.share_grams = (os.environ.get("ISOUQ_GHOST_SHARE_GRAMS", "1") != "0"
                            if share_grams is None else bool(share_grams))
        self._shared: SharedInputs | None = None
        self.params = params
        self.names = tuple(params)
        by_id = {id(p): n for n, p in params.items()}
        for alias, source in offloaded_ties(model).items():  # tied, split by offloading
            if id(src := model.get_parameter(source)) in by_id:
                by_id[id(model.get_parameter(alias))] = by_id[id(src)]
        # owners: module -> [(local attribute name, global parameter name)]
        self.owners: dict[nn.Module, list[tuple[str, str]]] = {}
        for mod, local, p in owned_parameters(model):  # composite layers own their children's
            if id(p) in by_id:
                self.owners.setdefault(mod, []).append((local, by_id[id(p)]))
        self.rules = {m: rule_for(m) for m in self.owners}
        # a language model's head: its output gradient is zero outside the scored positions
        head = getattr(model, "get_output_embeddings", None)
        try:
            head = head() if callable(head) else None
        except (NotImplementedError, AttributeError):
            head = None
        self._head = head if isinstance(head, nn.Module) else None
        #: (positions (N, K), T) set by a caller that knows where the output layer's output
        #: (N, T, ·) can carry gradient (the batch loop: the answer positions, each row's,
        #: padded with a position that carries none): its rule keeps those and reads nothing
        #: back from the device (``Pair.compacted``); None: read from the gradient
        self.head_positions: tuple[torch.Tensor, int] | None = None
        stuck = sorted({type(m).__name__ for m, r in self.rules.items() if r is None
                        and any(is_quantized(params[n]) for _, n in self.owners[m])})
        if stuck:
            raise ModelError(
                f"isouq has no ghost rule for the quantized layer type(s) {', '.join(stuck)}: "
                "their integer weights cannot be differentiated; score the other parameters "
                "with params='trainable' (or name patterns that leave those layers out)")
        self.fallbacks = sorted(
            {type(m).__name__ for m, r in self.rules.items() if r is None}
        )
        if self.fallbacks and warn:
            warnings.warn(
                "isouq ghost norms: no rule for module type(s) "
                f"{', '.join(self.fallbacks)}; their parameters use the exact but slower "
                "per-example fallback",
                stacklevel=2,
            )
        # a parameter owned by one module called once per forward has one contribution: its
        # norm is computed inside the backward, as soon as its output gradient is known, and
        # the call's tensors are released (memory near the activation-gradient floor)
        n_owners: dict[str, int] = {}
        for owned in self.owners.values():
            for _, name in owned:
                n_owners[name] = n_owners.get(name, 0) + 1
        self._solo = {m for m, owned in self.owners.items()
                      if self.rules[m] is not None and all(n_owners[n] == 1 for _, n in owned)}
        # entries of each solo module's parameters: what the batched reduction may materialize
        self._numel = {m: sum(logical_numel(params[n]) for _, n in self.owners[m])
                       for m in self._solo}
        self._reduce: Reduction | None = None
        self._group_of: dict[str, int] | None = None
        self._n_calls: dict[nn.Module, int] = {}
        self._now: dict[str, torch.Tensor] = {}
        self._cache: dict = {}
        self._retain, self._N = False, 0
        self.calls: list[Call] = []
        self._hooks: list = []
        self._saved_flags: list[tuple[nn.Module, str, bool]] = []
        self._capturing = False
        # FSDP2 frees a layer's gathered weights after its forward: the rules that read them
        # (norms, the fallback) get a copy made in the forward hook (ghost/weights.py)
        self._copy = ({m for m, r in self.rules.items() if r is None or r.reads_params}
                      if is_sharded(model) else set())
        # accelerate moves a layer's inputs to its device inside the forward, after torch's
        # hooks saw them: the recorded ones are moved the same way
        self._device = {m: d for m in self.owners if (d := execution_device(m)) is not None}

    # ------------------------------------------------------------------ context
    def __enter__(self) -> GhostNorms:
        # by (module, name): accelerate and FSDP2 put new parameter objects in place of the
        # old ones (offloading to meta, resharding); the flags go back on whichever is there
        self._saved_flags = [(m, n, p.requires_grad) for m in self.model.modules()
                             for n, p in m._parameters.items() if p is not None]
        for m, n, _ in self._saved_flags:
            m._parameters[n].requires_grad_(False)
        for mod in self.owners:
            self._hooks.append(mod.register_forward_hook(self._on_forward, with_kwargs=True))
        self.calls = []
        self._n_calls = {}
        self._capturing = True
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for m, n, flag in self._saved_flags:
            p = m._parameters.get(n)
            if p is not None:
                p.requires_grad_(flag)
        self._saved_flags = []
        self._capturing = False
        self._release_calls()
        self._n_calls = {}
        self._now, self._cache = {}, {}

    def _release_calls(self) -> None:
        """Drop every recorded tensor. A call's output holds the gradient hook, which refers
        back to the call: the tensors must be released explicitly (no memory growth per batch)."""
        for c in self.calls:
            c.args, c.kwargs, c.output, c.grad = (), {}, None, None
        self.calls = []

    def _maybe_now(self, call: Call) -> None:
        """Inside backward: a solo call's norms now, then release what it holds."""
        if (call.module not in self._solo or self._n_calls.get(call.module) != 1
                or call.grad.shape[0] != self._N):  # a broadcast input: _norms says so
            return
        local = self.rules[call.module].contributions(call.module, call)
        named = {name: local[lo] for lo, name in self.owners[call.module] if lo in local}
        if self._shared is not None:  # members of a group wait for it (shared.py)
            named = self._shared.add(call, named)
        for name, c in named.items():
            if self._reduce is not None:
                self._reduce_one(c, name)
            else:
                self._now[name] = sq_norms([c], self._cache)
        call.grad = None
        if not self._retain:  # another backward over the same graph needs the inputs again
            call.args, call.kwargs, call.output = (), {}, None

    def _reduce_one(self, c: Contribution, name: str) -> None:
        """A solo parameter's one contribution into the batched reduction (``reduction.py``):
        materialized, a one-hot Pair's Gram or block, a dense Pair's Gram or block; anything
        else as its squared norm."""
        red, group = self._reduce, None if self._group_of is None else self._group_of[name]
        if isinstance(c, Materialized) and isinstance(c.grad, torch.Tensor):
            red.materialized(c, group)
        elif (isinstance(c, Pair) and c.fold == 1 and c.right_gram is None
              and c.right_fn is None):
            if not choose_gram([c]):
                red.block(c, group)
            elif c.is_index:
                red.index_gram(c, group)
            else:
                red.gram(c.right, [c.left], group)
        else:
            red.square(sq_norms([c], self._cache), group)

    def _unflatten(self, call: Call) -> None:
        """A call that saw the batch flattened to (N·T, …) (``seq_len`` = T): its input,
        output and gradient viewed as (N, T, …), the layout ``reshape(-1, d)`` flattened."""
        N, T = self._N, self.seq_len
        rows = call.grad.shape[0]
        if not T or T == 1 or rows != N * T:
            return

        def view(t):
            if isinstance(t, torch.Tensor) and t.ndim >= 1 and t.shape[0] == rows:
                return t.reshape(N, T, *t.shape[1:])
            return t

        call.grad = view(call.grad)
        call.args = tuple(view(a) for a in call.args)
        call.output = view(call.output)

    def _on_forward(self, module, args, kwargs, output):
        if not self._capturing or not torch.is_grad_enabled():
            return None
        first = output[0] if isinstance(output, tuple | list) else output
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return None
        replaced = None
        if not first.requires_grad:  # nothing upstream requires grad: start the graph here
            first = first.detach().requires_grad_(True)
            replaced = first
        dev = self._device.get(module)
        call = Call(module=module, args=tuple(
            (a.detach() if dev is None else a.detach().to(dev)) if isinstance(a, torch.Tensor)
            else a for a in args), kwargs=kwargs, output=first,
            sparse_output=module is self._head, index=len(self.calls))
        if call.sparse_output and self.head_positions is not None:
            kept, length = self.head_positions
            if first.ndim == 3 and tuple(first.shape[:2]) == (kept.shape[0], length):
                call.positions = kept
        if dev is not None:
            call.kwargs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v
                           for k, v in kwargs.items()}
        if module in self._copy:
            call.extra["params"] = gathered_copy(module, recurse=True)

        # weak references: the hook lives on ``first`` (held by the call and the graph), so a
        # strong one would make a cycle through autograd that Python's GC cannot see
        call_ref, me_ref = weakref.ref(call), weakref.ref(self)

        def keep(g):
            _call, me = call_ref(), me_ref()
            if _call is None or me is None:
                return
            _call.grad = g.detach()
            me._unflatten(_call)
            me._maybe_now(_call)

        first.register_hook(keep)
        rule = self.rules[module]
        if replaced is None and (rule is None or not rule.uses_output):
            # the hook lives on the output's graph node, not on the tensor: a rule that never
            # reads the output (and the fallback, which re-runs the forward) lets it go
            call.output = None
        self.calls.append(call)
        self._n_calls[module] = self._n_calls.get(module, 0) + 1
        if replaced is None:
            return None
        if isinstance(output, tuple | list):
            return type(output)([replaced, *output[1:]])
        return replaced

    # ------------------------------------------------------------------ compute
    def backward(self, s: torch.Tensor, *, retain_graph: bool = False) -> torch.Tensor:
        """Backward of Σᵢ sᵢ, the per-example squared gradient norms.

        Args:
            s: (N,) per-example scalars computed inside the context; example i must depend on
                input i only.
            retain_graph: keep the graph (and the recorded inputs) for another backward.

        Returns:
            (N,) ‖∇θ sᵢ‖² over the selected parameters (s's units squared), float32 or wider.
        """
        return self.backward_detailed(s, retain_graph=retain_graph, per_param=False).total

    def backward_detailed(self, s: torch.Tensor, *, retain_graph: bool = False,
                          per_param: bool = True,
                          groups: tuple[int, ...] | None = None) -> GhostResult:
        """Backward of Σᵢ sᵢ; per-example squared norms, total and per parameter tensor.

        Args:
            s: (N,) per-example scalars computed inside the context.
            retain_graph: keep the graph (and the recorded inputs) for another backward.
            per_param: also the norms by parameter tensor; False: the total only, which lets
                layers sharing an input sum their Grams before one inner product.
            groups: per parameter (in ``names`` order) the index of its group (e.g. its block,
                ``isouq.blocks``): the norms are also summed by group, ‖∇_{θ_g} sᵢ‖², from the
                same backward; layers sharing an input still sum their Grams before one inner
                product when they are of one group (without ``per_param``).

        Returns:
            GhostResult: ``total`` (N,), ``per_param`` (N, n) in the order of ``names`` (None
            without ``per_param``), ``per_group`` (N, G), G = max(groups) + 1 (None without
            ``groups``).
        """
        if groups is not None and len(groups) != len(self.names):
            raise InputError(f"groups has {len(groups)} entries for {len(self.names)} "
                             "parameters; give one group index per parameter")
        total, per, by_group = self._run(s, retain_graph, per_param=per_param, groups=groups)
        return GhostResult(total=total, per_param=per, names=self.names, per_group=by_group)

    def _run(self, s: torch.Tensor, retain_graph: bool, per_param: bool,
             groups: tuple[int, ...] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The backward of Σᵢ sᵢ: (the total (N,), the per-parameter norms (N, n) with
        ``per_param``, else None, the per-group norms (N, G) with ``groups``, else None)."""
        if s.ndim != 1:
            raise InputError(f"s must be (N,), one scalar per example, got shape {tuple(s.shape)}")
        N = s.shape[0]
        for c in self.calls:
            c.grad = None
        self._now, self._cache, self._retain, self._N = {}, {}, retain_graph, N
        group_of = None if groups is None else dict(zip(self.names, groups, strict=True))
        self._group_of = group_of
        solo = [c for c in self.calls if c.module in self._solo
                and self._n_calls.get(c.module) == 1]
        if self.share_grams and not per_param and factors.setting("GRAM_BLOCKS") == 1:
            # only the total (by group) is wanted: every part is written into buffers and
            # reduced at the end in a few batched operations (reduction.py)
            self._reduce = Reduction(
                N, torch.promote_types(s.dtype, torch.float32), s.device,
                slots=len(solo), columns=sum(self._numel[c.module] for c in solo),
                main=self.seq_len or _main_length(solo),
                groups=None if group_of is None else max(group_of.values(), default=-1) + 1)
        if self.share_grams:  # the calls _maybe_now will compute, grouped by their input
            self._shared = SharedInputs(solo, summed=not per_param, group_of=group_of,
                                        reduction=self._reduce)
        for c in self.calls:  # weight-dependent decisions, outside the backward
            rule = self.rules[c.module]
            if rule is not None and rule.before_backward is not None:
                rule.before_backward(c.module, c)
        try:
            if s.requires_grad:
                s.sum().backward(retain_graph=retain_graph)
            return self._norms(N, s.dtype, s.device, per_param, group_of)
        finally:
            if retain_graph:  # another backward over the same graph re-reads the inputs
                for c in self.calls:
                    c.grad = None
            else:
                self._release_calls()
            self._now, self._cache, self._shared, self._reduce = {}, {}, None, None

    def _norms(self, N: int, dtype: torch.dtype, device=None, per_param: bool = True,
               group_of: dict[str, int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(total (N,), per-parameter norms (N, n) or None without ``per_param``, per-group
        norms (N, G) or None without ``group_of``): the norms the backward computed, those
        that waited for its end, and the shared groups' sums."""
        contribs: dict[str, list[Contribution]] = {n: [] for n in self.names}
        self._capturing = False  # fallbacks re-run forwards: record nothing
        try:
            for call in self.calls:
                if call.grad is None:
                    continue  # did not influence s, or its norms were computed in backward
                if call.grad.shape[0] != N:
                    raise InputError(
                        f"a {type(call.module).__name__} layer ran on a batch of "
                        f"{call.grad.shape[0]} while s has {N} examples: an input was broadcast "
                        "across the batch (e.g. position_ids of shape (1, T)); pass it per "
                        "example (a layer that flattens (N, T, d) to (N·T, d) needs seq_len=T)"
                    )
                owned = self.owners[call.module]
                rule = self.rules[call.module]
                if rule is None:
                    local = fallback.contributions(call.module, call, [lo for lo, _ in owned])
                else:
                    local = rule.contributions(call.module, call)
                for lo, name in owned:
                    if lo in local:
                        contribs[name].append(local[lo])
        finally:
            self._capturing = True
        out = torch.promote_types(dtype, torch.float32)
        if self._reduce is not None:  # only the total (by group): one batched reduction
            self._shared.flush()
            for name, c in contribs.items():
                if c:
                    self._reduce.square(sq_norms(c, self._cache),
                                        None if group_of is None else group_of[name])
            total, by_group = self._reduce.result()
            return total, None, by_group
        terms: list[tuple[int | None, torch.Tensor]] = []  # (group, (N,)) of the total
        if self._shared is not None:  # groups with a member s does not depend on
            self._shared.flush()
            self._now.update(self._shared.norms)
            terms += self._shared.totals  # only without per_param: in no column
        cols = []
        for name, c in contribs.items():
            col = self._now.get(name)
            if col is None and c:
                col = sq_norms(c, self._cache)
            if per_param:
                cols.append(torch.zeros(N, dtype=out, device=device) if col is None else col)
            elif col is not None:
                terms.append((None if group_of is None else group_of[name], col))
        # layers may live on different devices (device_map="auto"): gathered on s's device
        per = (torch.stack([c.to(device=device, dtype=out) for c in cols], dim=1) if per_param
               else None)
        terms = [(g, t.to(device=device, dtype=out)) for g, t in terms]
        by_group = None
        if group_of is not None:
            G = max(group_of.values(), default=-1) + 1
            by_group = torch.zeros(N, G, dtype=out, device=device)
            if per is not None:
                index = torch.tensor([group_of[n] for n in self.names], device=device)
                by_group.index_add_(1, index, per)
            for g, t in terms:
                by_group[:, g] += t
            return by_group.sum(1), per, by_group
        parts = [t for _, t in terms]
        if per is not None:
            parts.insert(0, per.sum(1))
        total = (torch.stack(parts).sum(0) if len(parts) > 1 else parts[0] if parts
                 else torch.zeros(N, dtype=out, device=device))
        return total, per, None


def _main_length(calls: list[Call]) -> int | None:
    """The positions most recorded inputs (N, T, d) have: the T of the backward's main Gram
    shape (T × T), or None."""
    counts: dict[int, int] = {}
    for c in calls:
        x = c.args[0] if c.args else None
        if isinstance(x, torch.Tensor) and x.ndim >= 3:
            counts[x.shape[1]] = counts.get(x.shape[1], 0) + 1
    return max(counts, key=counts.get) if counts else None
