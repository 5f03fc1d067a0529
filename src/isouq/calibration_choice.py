"""Which P(correct) map to save: every candidate cross-fitted on the user's own answers, judged
against MSP, and the honesty floor.

The predictors (:func:`predictors`), each cross-fitted on the same folds:

- ``MSP``: the answer's sequence probability Π pₜ itself, no fit (what the model already says);
- ``MSP's map``: Platt scaling of the sequence log-probability Σ log pₜ: MSP made a
  probability, the reference every verdict is judged against;
- ``p̄``: Platt scaling of the mean token probability;
- ``hidden-state probe``: a logistic probe on the answer's hidden state alone (rows scored
  with ``--hidden``; ``isouq.probe``), which needs a forward pass only;
- ``forward-only head``: ``isouq calibrate``'s selection over the asked features that need no
  backward pass (p̄, the sequence log-probability, the aleatoric score, the probe);
- ``isouq head``: the selection over every asked feature (the gradient scores and the block
  profile among them).

A head is a selection procedure (``calibration.select_map`` over ``evaluation.features``'
candidate sets and maps, by inner cross-validated log-loss). :func:`cross_fitted` runs it
nested: outer stratified folds, repeated over several fold seeds; in each, the procedure sees
only the training part and predicts the held-out answers. :func:`comparisons` judges each
predictor against MSP's map, and the isouq head against the forward-only head, by
``evaluation.verdict`` (paired bootstrap over answers and fold seeds, Holm over the table).
:func:`decide` applies the floor: a learned head is saved only when its procedure is ahead of
MSP's map beyond noise, the forward-only head when the backward adds nothing beyond noise, and
MSP's map otherwise or below :data:`FLOOR_PER_CLASS` answers of a class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .calibration import MAP_KINDS, CalibrationError, select_map
from .evaluation import verdict as V
from .evaluation.features import (
    FEATURES,
    FORWARD_FEATURES,
    HIDDEN,
    PROBE_COLUMN,
    check_features,
    columns_of,
    feature_sets,
    needs_backward,
)
from .probe import stack_logits

#: the fewest answers of each class a head is fitted on; below it MSP's map is saved
FLOOR_PER_CLASS = V.MIN_PER_CLASS
#: the predictor every verdict is judged against, and the names of the others
MSP, MSP_MAP, PBAR, PROBE, FORWARD, ISOUQ = ("MSP", "MSP's map", "p̄", "hidden-state probe",
                                            "forward-only head", "isouq head")
#: outer folds and fold seeds of the repeated cross-fitting
FOLDS = 5
REPEATS = 5


@dataclass(frozen=True)
class Predictor:
    """One predictor of correctness: its name, the features it reads, whether it is a
    selection procedure (``head``: candidate sets and maps chosen inside each training part)
    or one Platt map, and whether it needs the backward pass (a gradient feature).

    ``features`` empty: a fixed score read off the rows (MSP itself), nothing fitted.
    """

    name: str
    features: tuple[str, ...]
    head: bool = False

    @property
    def backward(self) -> bool:
        """Whether the predictor may read a score that needs the backward pass."""
        return needs_backward(self.features)

    @property
    def fitted(self) -> bool:
        return bool(self.features)


def predictors(features: Sequence[str], *, has_seq_logprob: bool = True) -> dict[str, Predictor]:
    """The predictors compared on a user's answers, by name (see the module docstring).

    Args:
        features: what the isouq head may read (``evaluation.features`` names).
        has_seq_logprob: whether the rows carry the sequence log-probability (MSP); without
            it, p̄'s map is the reference and MSP is left out.

    Returns:
        name -> :class:`Predictor`, the reference first (:func:`reference`).
    """
    features = check_features(features)
    out: dict[str, Predictor] = {}
    if has_seq_logprob:
        out[MSP_MAP] = Predictor(MSP_MAP, ("seq_logprob",))
        out[MSP] = Predictor(MSP, ())
    out[PBAR] = Predictor(PBAR, ("mean_prob",))
    if HIDDEN in features:
        out[PROBE] = Predictor(PROBE, (HIDDEN,))
    forward = tuple(f for f in features if f in FORWARD_FEATURES)
    if forward and len(forward) < len(features):
        out[FORWARD] = Predictor(FORWARD, forward, head=True)
    out[ISOUQ] = Predictor(ISOUQ, features, head=True)
    return out


def reference(preds: Mapping[str, Predictor]) -> str:
    """The predictor the others are judged against: MSP's map, else p̄'s."""
    return MSP_MAP if MSP_MAP in preds else PBAR


def feature_sets_of(p: Predictor, rows: Sequence[Mapping]) -> dict[str, tuple[str, ...]]:
    """A predictor's candidate column sets: a head's as ``isouq calibrate`` builds them, one
    map's its columns."""
    if p.head:
        return feature_sets(p.features, rows)
    return {p.name: columns_of(p.features, rows)}


def _outer_folds(y: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified (by the class ``y`` ≥ 0.5) outer folds of one seed."""
    from sklearn.model_selection import StratifiedKFold

    cls = (np.asarray(y) >= V.CLASS_THRESHOLD).astype(int)
    k = min(folds, int(cls.sum()), int(cls.size - cls.sum()))
    if k < 2:
        raise CalibrationError(f"{int(cls.sum())} correct of {cls.size}: too few of a class to "
                               "cross-fit; label more answers")
    return list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(
        np.zeros(cls.size), cls))


def _subsample(tr: np.ndarray, y: np.ndarray, fraction: float,
               rng: np.random.Generator) -> np.ndarray:
    """A stratified share ``fraction`` of the training indices ``tr``."""
    if fraction >= 1.0:
        return tr
    cls = np.asarray(y)[tr] >= V.CLASS_THRESHOLD
    keep = [rng.permutation(tr[cls == c])[:max(1, round(fraction * int((cls == c).sum())))]
            for c in (False, True)]
    return np.sort(np.concatenate(keep))


def cross_fitted(rows: Sequence[Mapping], cols: Mapping[str, np.ndarray], y: np.ndarray,
                 preds: Mapping[str, Predictor], *, seeds: Sequence[int] = range(REPEATS),
                 folds: int = FOLDS, states: Mapping[str, np.ndarray] | None = None,
                 fraction: float = 1.0, progress: Callable[[], None] | None = None
                 ) -> dict[str, np.ndarray]:
    """Each predictor's out-of-fold P(correct), nested and repeated over fold seeds.

    Args:
        rows: the answer rows (the candidate sets' block columns are read off them).
        cols: column -> (n,) raw values of every column the predictors read (no NaN), with
            ``seq_logprob`` for MSP.
        y: (n,) labels, 0/1 or fractional in [0, 1].
        preds: the predictors (:func:`predictors`).
        seeds: one outer split per seed (stratified ``folds`` folds).
        folds: outer folds.
        states: hidden state name -> (n, d), for the predictors reading ``hidden``: the probe
            is fitted on each training part (its logits there out of fold) and scores the
            held-out part.
        fraction: the share of each training part the procedures see (a learning curve;
            stratified), 1: all of it.
        progress: called once per (seed, fold).

    Returns:
        name -> (len(seeds), n) out-of-fold P(correct); NaN where a fit was impossible (a
        training share with too few answers of a class).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):  # small fits: threads only contend
        return _cross_fitted(rows, cols, y, preds, seeds, folds, states, fraction, progress)


def _cross_fitted(rows, cols, y, preds, seeds, folds, states, fraction, progress):
    n = len(y)
    sets = {name: feature_sets_of(p, rows) for name, p in preds.items() if p.fitted}
    reads_probe = any(PROBE_COLUMN in c for s in sets.values() for c in s.values())
    out = {name: np.full((len(seeds), n), np.nan) for name in preds}
    for r, seed in enumerate(seeds):
        rng = np.random.default_rng(seed)
        for tr, te in _outer_folds(y, folds, seed):
            tr = _subsample(tr, y, fraction, rng)
            on_tr = {k: v[tr] for k, v in cols.items()}
            on_te = {k: v[te] for k, v in cols.items()}
            if reads_probe:
                if states is None:
                    raise CalibrationError("the hidden-state probe needs the rows' hidden "
                                           "states (score them with --hidden)")
                on_tr[PROBE_COLUMN], probe = stack_logits(
                    {k: v[tr] for k, v in states.items()}, y[tr], seed=seed)
                on_te[PROBE_COLUMN] = probe.logit(states[probe.state][te])
            for name, p in preds.items():
                if not p.fitted:  # MSP itself: the sequence probability, nothing fitted
                    out[name][r, te] = np.exp(cols["seq_logprob"][te])
                    continue
                try:
                    m, _ = select_map(on_tr, y[tr], seed=seed, sets=sets[name],
                                      kinds=MAP_KINDS if p.head else ("platt",))
                except CalibrationError:
                    continue  # too few of a class in this training share
                out[name][r, te] = m.predict(on_te)
            if progress is not None:
                progress()
    return out


def comparisons(oof: Mapping[str, np.ndarray], quality: np.ndarray, *,
                against: str, n_bootstrap: int = V.N_BOOTSTRAP, seed: int = 0) -> list[dict]:
    """Each predictor against ``against`` (and the isouq head against the forward-only head),
    judged together: ``evaluation.verdict.compare``'s rows with ``p_holm``, ``verdict`` and
    ``family`` (``evaluation.verdict.judge``: Holm over the rows, verdict by PRR)."""
    pairs = [(name, against) for name in oof if name != against]
    if FORWARD in oof and ISOUQ in oof:
        pairs.append((ISOUQ, FORWARD))
    return V.judge(V.compare(oof, quality, pairs, n_bootstrap=n_bootstrap, seed=seed))


@dataclass(frozen=True)
class Decision:
    """What ``isouq calibrate`` saves and why.

    saved: the predictor whose procedure is refitted on every answer and saved; reason: one
    sentence; backward: whether scoring for it needs the backward pass; short: for a floor,
    how many more answers of each class would be needed ({"correct": k, "wrong": m}).
    """

    saved: str
    reason: str
    backward: bool
    short: dict

    def to_dict(self) -> dict:
        return {"saved": self.saved, "reason": self.reason, "backward": self.backward,
                "short_of_floor": self.short}


def shortfall(quality: np.ndarray, floor: int = FLOOR_PER_CLASS) -> dict[str, int]:
    """How many more answers of each class the floor needs ({} when it is met)."""
    right, wrong = V.class_counts(quality)
    need = {"correct": max(0, floor - right), "wrong": max(0, floor - wrong)}
    return {k: v for k, v in need.items() if v}


def decide(rows: Sequence[Mapping], preds: Mapping[str, Predictor],
           quality: np.ndarray) -> Decision:
    """The honesty floor (see the module docstring) over judged comparison rows
    (:func:`comparisons`)."""
    ref = reference(preds)
    short = shortfall(quality)
    if short:
        more = " and ".join(f"{k} more {c}" for c, k in short.items())
        return Decision(ref, f"fewer than {FLOOR_PER_CLASS} answers of a class: no head is "
                        f"fitted; label {more} answers for one", False, short)
    said = {(r["predictor"], r["against"]): r["verdict"] for r in rows}
    ahead = [h for h in (FORWARD, ISOUQ) if said.get((h, ref)) == V.AHEAD]
    if FORWARD in ahead and said.get((ISOUQ, FORWARD)) != V.AHEAD:
        return Decision(FORWARD, f"the forward-only head is ahead of {ref} beyond noise and "
                        "the backward adds nothing beyond noise: no backward pass is needed",
                        False, {})
    if ISOUQ in ahead:
        over_forward = said.get((ISOUQ, FORWARD))
        return Decision(ISOUQ, f"the isouq head is ahead of {ref} beyond noise"
                        + ("" if over_forward is None else
                           " and ahead of the forward-only head" if over_forward == V.AHEAD
                           else ", and the forward-only head is not"),
                        preds[ISOUQ].backward, {})
    return Decision(ref, f"no head is ahead of {ref} beyond noise on these answers: "
                    f"{ref} is saved", False, {})


def learning_curve(rows: Sequence[Mapping], cols: Mapping[str, np.ndarray], y: np.ndarray,
                   preds: Mapping[str, Predictor], *, fractions: Sequence[float] = (0.25, 0.5, 1.0),
                   seed: int = 0, folds: int = FOLDS,
                   states: Mapping[str, np.ndarray] | None = None,
                   progress: Callable[[], None] | None = None) -> list[dict]:
    """Nested AUROC and PRR of the heads and the reference when each training part is cut to
    a share of itself: does more labelling help?

    Returns:
        one row per (fraction, predictor): fraction, labelled (answers each fit saw, mean over
        folds), predictor, AUROC, PRR (over every answer with a value; None where no fit was
        possible).
    """
    n_train = (folds - 1) / folds * len(y)
    out = []
    for f in fractions:
        oof = cross_fitted(rows, cols, y, preds, seeds=(seed,), folds=folds, states=states,
                           fraction=f, progress=progress)
        for name, p in oof.items():
            ok = ~np.isnan(p[0])
            auc = V.auroc_at(p[0][ok], y[ok]) if ok.any() else math.nan
            prr = V.prr(p[0][ok], y[ok]) if ok.any() else math.nan
            out.append({"fraction": f, "labelled": int(round(f * n_train)), "predictor": name,
                        "AUROC": None if math.isnan(auc) else auc,
                        "PRR": None if math.isnan(prr) else prr})
    return out


def default_features(rows: Sequence[Mapping]) -> tuple[str, ...]:
    """What the isouq head reads when the user names nothing: every score the rows carry among
    p̄, the sequence log-probability, the aleatoric and gradient scores, and the block
    profile and hidden states when every row has them."""
    from .answer_row import scores_of

    have = set.intersection(*(set(k for k, v in scores_of(r).items() if v is not None)
                              for r in rows)) if rows else set()
    if "epistemic" in have and "mean_prob" in have:
        have.add("epistemic_log")
    out = [f for f in ("mean_prob", "seq_logprob", "aleatoric", "epistemic", "epistemic_log")
           if f in have]
    for f in ("blocks", HIDDEN):
        if rows and all(isinstance(r.get(f), Mapping) and r.get(f) for r in rows):
            out.append(f)
    if not out:
        raise CalibrationError("the rows carry no score a head can read (mean_prob, "
                               "seq_logprob, aleatoric, epistemic): score them with isouq score")
    return tuple(f for f in out if f in FEATURES)


__all__ = ["FLOOR_PER_CLASS", "FOLDS", "FORWARD", "FORWARD_FEATURES", "ISOUQ", "MSP", "MSP_MAP",
           "PBAR", "PROBE", "REPEATS", "Decision", "Predictor", "comparisons", "cross_fitted",
           "decide", "default_features", "feature_sets_of", "learning_curve", "needs_backward", "predictors",
           "reference", "shortfall"]
