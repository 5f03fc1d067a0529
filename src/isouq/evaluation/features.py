"""The features a learned head reads off a scored answer (``isouq.calibration``): the answer's
scores (``isouq.SequenceScores.KEYS``: p̄, the sequence log-probability, aleatoric, the epistemic
scores) and its block profile (``isouq score --blocks``: ‖∇θ_b p̄‖² per block of the model).

A head is fitted on columns: one per score, and with ``blocks`` one per block of the model,
named ``block:<module path>`` (``block:model.layers.3``). The scores that span orders of
magnitude — the squared gradient norms, the block profile, the answer's negative
log-probability ``nll`` — enter on a log scale (:func:`is_log`): on a linear scale a few long
answers' large −Σ log pₜ would set the fit's scale where the confident answers lie.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..answer_row import scores_of
from ..errors import InputError

#: the prefix of a block column: ``block:<module path>``
BLOCK = "block:"
#: the column of the hidden-state probe's logit, which the feature ``hidden`` adds to a head
#: (``isouq.probe``: fitted on the answers' states, not read from a row)
PROBE_COLUMN = "hidden_probe"
#: the feature that stacks the probe under a head
HIDDEN = "hidden"


@dataclass(frozen=True)
class Feature:
    """One feature a head may be asked to use (``isouq calibrate --features``): whether it
    enters on a log scale, whether it is one column per block, and what it is."""

    name: str
    log: bool
    help: str
    per_block: bool = False


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("mean_prob", False, "p̄, the answer's mean token probability"),
    Feature("seq_logprob", False, "Σ log pₜ, the answer's log-probability (LM-Polygraph's "
                                  "maximum sequence probability, negated)"),
    Feature("nll", True, "−Σ log pₜ, the answer's negative log-probability (LM-Polygraph's "
                         "maximum sequence probability), on a log scale"),
    Feature("aleatoric", False, "(1/T) Σ pₜ(1 − pₜ)"),
    Feature("epistemic", True, "‖∇θ p̄‖², on a log scale"),
    Feature("epistemic_log", True, "‖∇θ log p̄‖², on a log scale"),
    Feature("normalized_epistemic", True, "‖∇θ p̄‖² / ‖θ*‖², on a log scale"),
    Feature("blocks", True, "‖∇θ_b p̄‖² of each block of the model (score with --blocks), "
                            "one column per block, on a log scale", per_block=True),
    Feature(HIDDEN, False, "the answer's mean hidden state at a few depths (score with "
                           "--hidden): a logistic probe on it, its logit stacked under the "
                           "other features (isouq.probe)"),
)}


#: the features read off the forward pass alone, no backward: p̄, the sequence log-probability
#: and its negation, the aleatoric score (from the token probabilities) and the hidden states
FORWARD_FEATURES: tuple[str, ...] = ("mean_prob", "seq_logprob", "nll", "aleatoric", HIDDEN)


def needs_backward(columns: Sequence[str]) -> bool:
    """Whether a head reading these columns (feature names, ``block:<name>`` columns, the
    probe's logit) needs the backward pass: a block column or a gradient score."""
    return any(c.startswith(BLOCK) or c not in (*FORWARD_FEATURES, PROBE_COLUMN)
               for c in columns)


def check_features(names: Sequence[str]) -> tuple[str, ...]:
    """The feature names, checked: InputError naming an unknown one and the choices."""
    names = tuple(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
    unknown = [n for n in names if n not in FEATURES]
    if unknown or not names:
        raise InputError(f"unknown feature(s) {unknown or names!r}; choose from "
                         f"{', '.join(FEATURES)}")
    return names


def is_log(column: str) -> bool:
    """Whether a column enters a head on a log scale (the squared norms and the blocks)."""
    return column.startswith(BLOCK) or (column in FEATURES and FEATURES[column].log)


def _names(rows: Sequence[Mapping], field: str, what: str, flag: str) -> tuple[str, ...]:
    """The keys of each row's ``field`` mapping, the same in every row; InputError when a row
    has none (naming the ``isouq score`` flag that writes them) or other keys than the first."""
    names = None
    for r in rows:
        got = r.get(field)
        if not isinstance(got, Mapping) or not got:
            raise InputError(f"row {r.get('key')!r} has no {what}; score the answers with "
                             f"them (isouq score {flag}) to use the feature {field!r}")
        if names is None:
            names = tuple(got)
        elif tuple(got) != names:
            raise InputError(f"row {r.get('key')!r} has other {what} than the first row; a "
                             "head reads those of one model: score every row with it")
    return names or ()


def block_names(rows: Sequence[Mapping]) -> tuple[str, ...]:
    """The block names of the rows' profiles (``blocks`` of ``isouq score --blocks``), the same
    in every row; InputError when a row has none or other blocks."""
    return _names(rows, "blocks", "block profile", "--blocks")


def columns_of(features: Sequence[str], rows: Sequence[Mapping]) -> tuple[str, ...]:
    """The columns of ``features``: a score's name, and for ``blocks`` one ``block:<name>``
    per block of the rows' profiles."""
    out: list[str] = []
    for f in check_features(features):
        if FEATURES[f].per_block:
            out += [BLOCK + b for b in block_names(rows)]
        else:
            out.append(PROBE_COLUMN if f == HIDDEN else f)
    return tuple(out)


def values(rows: Sequence[Mapping], columns: Sequence[str]) -> dict[str, np.ndarray]:
    """column -> (n,) float values of the rows, NaN where a value is missing or null;
    ``epistemic_log`` is derived as epistemic / mean_prob² where a row lacks it, ``nll`` as
    −seq_logprob. The probe's column (:data:`PROBE_COLUMN`) is not a row's value but the
    probe's (``isouq.probe``): it is left out.

    Raises:
        InputError: no row carries a column (the rows were scored without it), naming the fix.
    """
    n = len(rows)
    out: dict[str, np.ndarray] = {}
    for c in columns:
        if c == PROBE_COLUMN:
            continue
        if c.startswith(BLOCK):
            name = c[len(BLOCK):]
            col = [_num((r.get("blocks") or {}).get(name)) for r in rows]
            what = f"block {name!r} (score with --blocks)"
        elif c == "nll":
            col = [-_num(scores_of(r).get("seq_logprob")) for r in rows]
            what = "the score 'seq_logprob' (nll is −seq_logprob)"
        else:
            col = [_num(scores_of(r).get(c)) for r in rows]
            what = f"the score {c!r}"
            if c == "epistemic_log":
                col = [v if not math.isnan(v) else _derived(scores_of(r))
                       for v, r in zip(col, rows, strict=True)]
        if n and all(math.isnan(v) for v in col):
            raise InputError(f"the rows lack {what}; score them with what the head reads, or "
                             "choose other --features")
        out[c] = np.asarray(col, dtype=float).reshape(n)
    return out


def rows_of_columns(cols: Mapping[str, Sequence[float]]) -> list[dict]:
    """Answer rows (``scores``, ``blocks``) from columns: name -> (n,) values, a
    ``block:<name>`` column going to each row's block profile. InputError when the columns'
    lengths differ."""
    arrays = {k: np.asarray(v, dtype=float).reshape(-1) for k, v in cols.items()}
    sizes = {a.size for a in arrays.values()}
    if len(sizes) > 1:
        raise InputError(f"the score columns have {sorted(sizes)} values; give one value per "
                         "answer in each")
    n = sizes.pop() if sizes else 0
    blocks = {k[len(BLOCK):]: a for k, a in arrays.items() if k.startswith(BLOCK)}
    plain = {k: a for k, a in arrays.items() if not k.startswith(BLOCK)}
    return [{"scores": {k: float(a[i]) for k, a in plain.items()},
             **({"blocks": {b: float(a[i]) for b, a in blocks.items()}} if blocks else {})}
            for i in range(n)]


def _num(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def _derived(scores: Mapping) -> float:
    """epistemic / mean_prob² (‖∇θ p̄‖² = p̄² ‖∇θ log p̄‖²), NaN when either is missing."""
    e, m = _num(scores.get("epistemic")), _num(scores.get("mean_prob"))
    return e / m**2 if m and not math.isnan(e) and not math.isnan(m) else math.nan


def feature_sets(features: Sequence[str], rows: Sequence[Mapping]) -> dict[str, tuple[str, ...]]:
    """The candidate column sets of a head asked to use ``features``: each score alone, all of
    them together, and with ``blocks`` also the scores without the profile (so that selection
    can tell whether the profile helps); with ``hidden``, each of those sets also with the
    probe's logit (:data:`PROBE_COLUMN`), and the logit alone. Named by their features joined
    with " & "."""
    features = check_features(features)
    rest = [f for f in features if f != HIDDEN]
    scalars = [f for f in rest if not FEATURES[f].per_block]
    sets: dict[str, tuple[str, ...]] = {f: (f,) for f in scalars}
    for group in (rest, scalars):
        cols = columns_of(group, rows) if group else ()
        if cols and cols not in sets.values():
            sets[" & ".join(group)] = cols
    if HIDDEN in features:
        sets = {**sets, **{f"{name} & {HIDDEN}": (*cols, PROBE_COLUMN)
                           for name, cols in sets.items()}, HIDDEN: (PROBE_COLUMN,)}
    return sets


def hidden_states(rows: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """The rows' hidden states (``hidden`` of ``isouq score --hidden``): state name (e.g.
    ``hidden_states[12]``) -> (n, d) array; InputError when a row has none or other states
    than the first row."""
    names = _names(rows, HIDDEN, "hidden states", "--hidden")
    try:
        return {n: np.asarray([r[HIDDEN][n] for r in rows], dtype=float) for n in names}
    except ValueError as e:
        raise InputError(f"the rows' hidden states differ in width ({e}); score every row with "
                         "one model") from e


__all__ = ["BLOCK", "FEATURES", "FORWARD_FEATURES", "HIDDEN", "PROBE_COLUMN", "Feature",
           "block_names", "check_features", "columns_of", "feature_sets", "hidden_states",
           "is_log", "needs_backward", "rows_of_columns", "values"]
