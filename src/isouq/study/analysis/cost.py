"""What does each method cost per answer? Passes beyond the shared generation, and seconds.

Rows carry ``passes`` (method -> extra passes per sample, e.g. gradient 1 backward, naive
entropy K generations) and ``seconds`` (method -> measured wall-clock seconds for that sample,
shared generation excluded). Method keys: ``gradient`` (ours; one pass gives both Epi. and
Alea.), ``naive_entropy``, ``semantic_entropy``, ``p_true``; other keys (the shared
``generation``, ``entailment_calls``) are not methods and are left out. ``timed_on`` (method ->
``runio.machine_label``, absent in rows older than it) says where each timing was taken: a
method added to the rows later may have been timed on another machine than the gradient, and
seconds from two machines do not compare.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping

import numpy as np

from ...errors import DataError
from ...evaluation.rows import to_float

COST_LABELS: dict[str, str] = {
    "gradient": "Gradient norm (ours)",
    "p_true": "P(True)",
    "naive_entropy": "Naive Ent.",
    "semantic_entropy": "Sem. Ent.",
}
REFERENCE = "gradient"


def speedup(reference_seconds: np.ndarray, other_seconds: np.ndarray) -> float:
    """How many times faster the reference is: mean(other) / mean(reference).

    reference_seconds: (n,), other_seconds: (m,) per-sample seconds; NaN if either is empty
    or the reference mean is 0.
    """
    a = np.asarray(reference_seconds, dtype=float)
    b = np.asarray(other_seconds, dtype=float)
    if a.size == 0 or b.size == 0 or a.mean() <= 0:
        return float("nan")
    return float(b.mean() / a.mean())


def _number(v, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise DataError(f"{what} is {v!r}; write a finite number or null")
    return float(v)


def _timings(row: Mapping, i: int) -> dict[str, tuple[float, str | None]]:
    """method -> (seconds, machine or None) of one row, methods of ``COST_LABELS`` only."""
    vals = row.get("seconds") or {}
    where = row.get("timed_on") or {}
    if not isinstance(vals, Mapping) or not isinstance(where, Mapping):
        raise DataError(f"row {i}: 'seconds' and 'timed_on' must be objects keyed by method")
    out = {}
    for method, v in vals.items():
        x = _number(v, f"row {i}: seconds[{method!r}]")
        if method in COST_LABELS and x is not None:
            m = where.get(method)
            out[str(method)] = (x, str(m) if m is not None else None)
    return out


def _speedup_where_comparable(
    timings: list[dict[str, tuple[float, str | None]]], method: str, reference: str
) -> tuple[float, str]:
    """(speed-up of ``reference`` over ``method``, which timings it compares).

    Over the rows where both were timed on one recorded machine when there are any ("same
    machine"); else over all timed rows, as "machine not recorded" when some row lacks the
    record ("different rows" when no row has both), or NaN with "different machines" when
    every row records two machines. ``reference`` itself: 1, "reference"."""
    if method == reference:
        own = np.array([t[method][0] for t in timings if method in t])
        return speedup(own, own), "reference"
    both = [t for t in timings if method in t and reference in t]
    same = [t for t in both if t[method][1] is not None and t[method][1] == t[reference][1]]
    if same:
        return speedup(np.array([t[reference][0] for t in same]),
                       np.array([t[method][0] for t in same])), f"same machine ({len(same)} rows)"
    ref = np.array([t[reference][0] for t in timings if reference in t])
    own = np.array([t[method][0] for t in timings if method in t])
    if not both:
        return speedup(ref, own), "different rows"
    if any(t[method][1] is None or t[reference][1] is None for t in both):
        return speedup(ref, own), "machine not recorded"
    return float("nan"), "different machines"


def cost_table(rows: Iterable[Mapping], reference: str = REFERENCE) -> list[dict]:
    """Row-level: one row per (dataset, model, method) with the per-sample passes (the common
    value, or the mean when rows differ), n timed samples, mean, std (ddof=0) and median
    seconds (the median resists a few samples timed while the machine was busy), the
    number of machines its timings were recorded on, and the speed-up of ``reference`` over
    this method (mean seconds ratio; 1 for itself) with ``compared`` saying on which rows: the
    ones where both were timed on one machine when rows record it (``timed_on``).

    All rows count, judged or not; rows without ``passes``/``seconds`` are skipped.
    """
    acc: dict[tuple[str, str], dict[str, list]] = {}
    for i, row in enumerate(rows):
        for f in ("model", "dataset"):
            if f not in row:
                raise DataError(f"row {i} lacks field {f!r}; re-run the QA pipeline")
        g = acc.setdefault((str(row["dataset"]), str(row["model"])),
                           {"timings": [], "passes": {}})
        vals = row.get("passes") or {}
        if not isinstance(vals, Mapping):
            raise DataError(f"row {i}: 'passes' must be an object of method -> number")
        for method, v in vals.items():
            if method not in COST_LABELS:  # e.g. the shared generation, entailment calls
                continue
            x = _number(v, f"row {i}: passes[{method!r}]")
            if x is not None:
                g["passes"].setdefault(str(method), []).append(x)
        g["timings"].append(_timings(row, i))
    order = list(COST_LABELS)
    table = []
    for (ds, model), g in acc.items():
        timings = g["timings"]
        names = set(g["passes"]) | {m for t in timings for m in t}
        for method in sorted(names, key=lambda k: (order.index(k) if k in order else len(order),
                                                  k)):
            passes = np.asarray(g["passes"].get(method, []))
            secs = np.asarray([t[method][0] for t in timings if method in t])
            machines = {t[method][1] for t in timings if method in t} - {None}
            if passes.size and np.all(passes == passes[0]):
                p0 = float(passes[0])
                p: float | int | None = int(p0) if p0.is_integer() else p0
            else:
                p = to_float(passes.mean()) if passes.size else None
            ratio, compared = _speedup_where_comparable(timings, method, reference)
            table.append({
                "dataset": ds, "model": model, "method": COST_LABELS.get(method, method),
                "passes": p, "n": int(secs.size),
                "mean_s": to_float(secs.mean()) if secs.size else None,
                "std_s": to_float(secs.std()) if secs.size else None,
                "median_s": to_float(np.median(secs)) if secs.size else None,
                "machines": len(machines),
                "speedup": to_float(ratio), "compared": compared,
            })
    return table
