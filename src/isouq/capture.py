"""Graph capture of the batch loop (``score_sequences(..., compile=True)``): offered only where
four checks pass, on the CPU as on a GPU, each on batches made from the caller's own pairs.

1. ``same_sequence``: two batches of one (rows, length) bucket (the caller's first rows, and
   the same rows in reverse order with one answer token moved into its prompt) dispatch the
   same aten operations on tensors of the same shapes, in the same order: one captured graph
   serves every batch of the bucket.
2. ``no_host_read``: isouq's code in a batch (its forward steps, the ghost backward and its
   hooks) reads no value or size back from the device (``.item()``, ``nonzero``, a boolean
   mask); the model's own forward is left to ``torch.compile``'s rules.
3. ``no_graph_break``: the batch's ghost backward, hooks included, runs under compiled
   autograd on the ``aot_eager`` backend with ``fullgraph=True`` (``passes.captured``): one
   graph, no break.
4. ``exact``: the captured backward's scores equal the eager ones.

The checks run in that order (the cheap ones first) and stop at the first that fails; a pass is
remembered per model and (rows, length, options) for the process. :func:`require_capture`
raises :class:`CaptureRefused` naming the check, what failed and the fix.
"""

from __future__ import annotations

import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from .errors import CaptureRefused
from .passes import CAPTURE_BACKEND, score_encoded
from .tokens import Encoded

CHECKS = ("same_sequence", "no_host_read", "no_graph_break", "exact")
#: aten operations that read a value or a size back from the device
READS = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select",
                   "aten.unique", "aten._unique", "aten._unique2", "aten.unique_dim",
                   "aten.unique_consecutive", "aten.equal"})
#: model -> {(rows, length, options): the verdicts}
_VERDICTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: its name (of :data:`CHECKS`), whether it passed, and what it
    found (one line)."""

    check: str
    passed: bool
    detail: str = ""


def op_trace(fn: Callable[[], object]) -> list[tuple]:
    """The aten operations ``fn`` dispatches, in order, each with the shapes and dtypes of its
    tensor arguments and results (tensors made from host data, ``lift_fresh``, left out: the
    batch's host-side facts are not device work)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    trace: list[tuple] = []

    def shapes(xs) -> tuple:
        out = []
        for x in xs:
            if isinstance(x, torch.Tensor):
                out.append((tuple(x.shape), str(x.dtype)))
            elif isinstance(x, list | tuple):
                out.append(shapes(x))
        return tuple(out)

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            res = func(*args, **(kwargs or {}))
            if func is not torch.ops.aten.lift_fresh.default:  # a tensor made from host data
                trace.append((str(func), shapes(args), shapes(res if isinstance(res, tuple)
                                                              else (res,))))
            return res

    with Trace():
        fn()
    return trace


def same_sequence(run_a: Callable[[], object], run_b: Callable[[], object]) -> Verdict:
    """Whether two runs dispatch the same operations on the same shapes, in the same order."""
    a, b = op_trace(run_a), op_trace(run_b)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return Verdict("same_sequence", False,
                           f"operation {i} is {x[0]} {x[1]} → {x[2]} in one batch, {y[0]} "
                           f"{y[1]} → {y[2]} in the other")
    if len(a) != len(b):
        return Verdict("same_sequence", False, f"{len(a)} operations against {len(b)}")
    return Verdict("same_sequence", True, f"{len(a)} operations")


def host_reads(fn: Callable[[], object], skip: nn.Module | None = None) -> dict[str, int]:
    """{operation: count} of the value and size reads ``fn`` makes, those inside ``skip``'s
    forward left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict[str, int] = {}
    inside = [0]

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            mask = name in ("aten.index", "aten.index_put", "aten.index_put_") and any(
                isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                for t in (args[1] if len(args) > 1 and isinstance(args[1], list | tuple)
                          else ()))
            if not inside[0] and (name in READS or mask):
                seen[name] = seen.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    hooks = []
    if skip is not None:
        hooks = [skip.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] + 1)),
                 skip.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] - 1))]
    try:
        with Reads():
            fn()
    finally:
        for h in hooks:
            h.remove()
    return seen


def no_host_read(fn: Callable[[], object], skip: nn.Module | None = None) -> Verdict:
    """Whether ``fn`` reads nothing back from the device (``skip``'s forward aside)."""
    seen = host_reads(fn, skip)
    if seen:
        return Verdict("no_host_read", False, "reads " + ", ".join(
            f"{k.removeprefix('aten.')} ×{v}" for k, v in sorted(seen.items())))
    return Verdict("no_host_read", True)


def no_graph_break(fn: Callable[[], object]) -> Verdict:
    """Whether ``fn`` runs whole (its captured region compiled with ``fullgraph=True``): the
    first graph break, where isouq's code met it, otherwise."""
    import torch._dynamo

    torch._dynamo.reset()  # compiled afresh: a graph cached from other code would hide a break
    try:
        fn()
    except Exception as e:  # dynamo's Unsupported, or an error its tracing raised
        torch._dynamo.reset()  # nothing half-compiled is kept
        return Verdict("no_graph_break", False, _first_break(e))
    return Verdict("no_graph_break", True, f"backend {CAPTURE_BACKEND}")


def _first_break(e: Exception) -> str:
    """What broke the graph (dynamo's reason and explanation), and the innermost line of isouq's
    code it broke in (dynamo's ``real_stack``: the traced code's stack, else the traceback),
    or of the code traced when isouq's is not on it; one line."""
    stack = list(getattr(e, "real_stack", None) or traceback.extract_tb(e.__traceback__))
    ours = [f for f in stack if "/isouq/" in f.filename
            and not f.filename.endswith(("capture.py", "passes.py"))]
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    what = getattr(e, "gb_type", None) or (lines[0] if lines else type(e).__name__)
    why = next((ln.removeprefix("Explanation:").strip() for ln in lines
                if ln.startswith("Explanation:")), "")
    what = f"{what}: {why}" if why and why not in what else what
    frames = ours or stack[-1:]
    if not frames:
        return what
    f = frames[-1]
    code = f" `{f.line.strip()}`" if f.line else ""
    where = f.filename.rsplit("/isouq/", 1)[-1] if ours else f.filename.rsplit("/", 1)[-1]
    return f"{what} in {where}:{f.lineno} {f.name}{code}"


def exact(eager: torch.Tensor, captured_: torch.Tensor, rtol: float = 1e-5) -> Verdict:
    """Whether the captured scores equal the eager ones (to ``rtol``)."""
    if torch.allclose(captured_, eager, rtol=rtol, atol=0.0):
        return Verdict("exact", True)
    worst = float(((captured_ - eager).abs() / eager.abs().clamp_min(1e-30)).max())
    return Verdict("exact", False, f"scores differ by up to {worst:.2g} (relative)")


def bucket_pairs(enc: Sequence[Encoded], rows: int) -> tuple[list[Encoded], list[Encoded]]:
    """Two batches of one (rows, length) bucket from the caller's pairs: the first ``rows``,
    and the same in reverse order with one answer token of the first answer longer than one
    token moved into its prompt (every row as long as before, the answers' split not)."""
    a = list(enc[:rows])
    b = list(reversed(a))
    for i, e in enumerate(b):
        if len(e.answer) - e.scored_from > 1:
            b[i] = replace(e, prompt=e.prompt + e.answer[:1], answer=e.answer[1:],
                           scored_from=max(0, e.scored_from - 1), offsets=None)
            break
    return a, b


def check_capture(model: nn.Module, enc: Sequence[Encoded], params: dict, info,
                  options: dict) -> list[Verdict]:
    """The checks of :data:`CHECKS` on batches of the caller's pairs, in order, up to the
    first that fails (remembered per model, rows, length and options).

    Args:
        model: the causal LM.
        enc: the prepared pairs (their first ``batch_size`` make the batches checked).
        params, info: the parameters that take part and their ``ParamInfo``.
        options: ``score_encoded``'s keyword arguments (``pad``, ``method``, ``covariance``,
            ``batch_size``, ``per_param``, ``blocks``, ``padding_side``).

    Returns:
        The verdicts, the last one failed unless all four passed.
    """
    rows = min(options["batch_size"], len(enc))
    a, b = bucket_pairs(enc, rows)
    length = max(e.length for e in a)
    key = (rows, length, tuple(id(q) for q in params.values()),
           tuple(sorted((k, repr(v)) for k, v in options.items())))
    known = _VERDICTS.setdefault(model, {})
    if key in known:
        return known[key]
    opts = {**options, "batch_size": rows, "progress": False}

    def run(pairs, capture=False):
        return lambda: score_encoded(model, pairs, params, info, fixed_shapes=True,
                                     capture=capture, **opts)

    eager = run(a)()  # first calls' checks (norm formulas) and caches before anything is traced
    verdicts = [same_sequence(run(a), run(b))]
    if verdicts[-1].passed:
        verdicts.append(no_host_read(run(a), skip=model))
    if verdicts[-1].passed:
        got: list = []
        verdicts.append(no_graph_break(lambda: got.append(run(a, capture=True)())))
    if verdicts[-1].passed:
        verdicts.append(exact(eager.epistemic, got[0].epistemic))
    known[key] = verdicts
    return verdicts


def require_capture(model: nn.Module, enc: Sequence[Encoded], params: dict, info,
                    options: dict) -> None:
    """Return when graph capture is offered for these pairs and options; else raise
    :class:`CaptureRefused` naming the first check that failed and what it found."""
    verdicts = check_capture(model, enc, params, info, options)
    if not verdicts[-1].passed:
        v = verdicts[-1]
        raise CaptureRefused(f"compile=True is not offered here: the {v.check} check failed "
                             f"({v.detail}); score without compile=True")


__all__ = ["CHECKS", "Verdict", "bucket_pairs", "check_capture", "exact", "host_reads",
           "no_graph_break", "no_host_read", "op_trace", "require_capture", "same_sequence"]
