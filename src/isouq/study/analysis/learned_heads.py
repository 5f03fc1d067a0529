"""Learned P(correct) heads judged in LM-Polygraph's harness: each answer's uncertainty
1 − P(correct) from a head that never saw it.

A head is what ``isouq calibrate --features ...`` fits (``isouq.calibration.select_map``:
candidate feature sets × maps, chosen by cross-validated log-loss), on the answers of one
model × dataset, labelled by LM-Polygraph's quality of each answer (:func:`labels_for`):
accuracy as its 0/1, ROUGE-L as a fractional label (the head then estimates the expected
ROUGE-L, fitted by weighted log-loss: ``evaluation.fractional.soft_rows``). The heads (:data:`HEADS`):

- ``isouq combined (paper)``: the paper's combined estimate, a logistic regression over log
  epistemic and aleatoric;
- ``isouq scores + MSP``: p̄, the answer's negative log-probability −Σ log pₜ (MSP's own
  quantity, on a log scale: ``evaluation.features``) and isouq's scores;
- ``isouq block head``: the same and the block profile (‖∇θ_b p̄‖² per block of the model).

:func:`cross_fitted`: K folds within the model × dataset (the same folds as LM-Polygraph's
train-split estimators there); the head of fold k is selected and fitted on the other folds'
answers and scores fold k's. :func:`transferred`: a head fitted on every answer of one dataset
scores the answers of another dataset of the same model (:func:`stacked_transferred` with
the probe of :func:`probe_transferred` for the stacked head). :data:`CONTROL`, cross-fitted beside
the heads, shows what cross-fitting itself costs: each fold's values come from another map, and
pooled they no longer rank quite as one map would. The supervised anchor,
:func:`probe_cross_fitted` (:data:`PROBE`), learns P(correct) from the answer's hidden state
instead, on the same folds; :func:`stacked_cross_fitted` (:data:`STACKED`, isouq's head with
``hidden`` among its features) puts the probe's logit under isouq's head as one more feature.
Rows (``evaluation.features``) are answer rows: ``scores`` and ``blocks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import expit

from ...calibration import (
    MAP_KINDS,
    is_soft,
    select_map,
)
from ...evaluation.features import HIDDEN, PROBE_COLUMN, feature_sets, values
from ...evaluation.fractional import enough_of_each
from ...probe import INNER_FOLDS, stack_logits

#: ROUGE-L at or above this counts as a correct answer where a 0/1 label is needed (AUROC)
LABEL_THRESHOLD = 0.5


@dataclass(frozen=True)
class Head:
    """A learned head: the features it may read, the maps it may choose from, and whether its
    candidates are ``isouq calibrate``'s (each feature alone, all together, …) or the features
    together only (``together``)."""

    name: str
    features: tuple[str, ...]
    kinds: tuple[str, ...]
    help: str
    together: bool = False


HEADS: dict[str, Head] = {h.name: h for h in (
    Head("isouq combined (paper)", ("epistemic", "aleatoric"), ("platt",),
         "the paper's combined estimate: logistic regression over log ‖∇θ p̄‖² and aleatoric",
         together=True),
    Head("isouq scores + MSP", ("mean_prob", "nll", "epistemic", "epistemic_log",
                                "aleatoric"), MAP_KINDS,
         "p̄, −log p(answer) and isouq's scores: isouq calibrate's selection over them"),
    Head("isouq block head", ("mean_prob", "nll", "epistemic", "epistemic_log",
                              "aleatoric", "blocks"), MAP_KINDS,
         "the same and the block profile ‖∇θ_b p̄‖²"),
)}


#: not a head of isouq's but a control: Platt scaling of −log p(answer) alone ranks the answers
#: of one fold exactly as MSP does; cross-fitted as the heads are (one map per fold, the folds'
#: values pooled), what it loses against MSP is what cross-fitting itself costs a score
CONTROL = Head("MSP's own map (control)", ("nll",), ("platt",),
               "Platt scaling of −log p(answer) alone, cross-fitted as the heads are: what "
               "cross-fitting costs a score that ranks each fold exactly as MSP does",
               together=True)


#: not a head of isouq's but the supervised anchor a learned head is measured against, a probe
#: on the answer's hidden state (SAPLMA, Azaria & Mitchell 2023, trains one on a layer's state,
#: a middle one telling most): L2-regularised logistic regression on the answer's mean hidden
#: state at the layer the fold's inner cross-validation picks, cross-fitted on the heads' folds
#: (:func:`probe_cross_fitted`)
PROBE = "Hidden-state probe (anchor)"

#: the probe stacked under isouq's head, what ``isouq calibrate --features mean_prob nll
#: epistemic epistemic_log aleatoric hidden`` fits: the features of ``isouq scores + MSP`` and
#: the probe's logit, cross-fitted on the probe's per-fold logits (:func:`stacked_cross_fitted`);
#: the hidden states come from the scores' own forward (``isouq.hidden.StatesOfForward``)
STACKED = Head("isouq scores + MSP + hidden-state probe (stacked)",
               (*HEADS["isouq scores + MSP"].features, HIDDEN), MAP_KINDS,
               "p̄, −log p(answer), isouq's scores and the hidden-state probe's logit (out of "
               "fold on the training answers): isouq calibrate's selection over them")


def binary_labels(quality: np.ndarray, metric: str) -> np.ndarray:
    """(n,) 0/1 correct labels from LM-Polygraph's quality values (NaN stays NaN): accuracy as
    it is, any other metric (ROUGE-L) ≥ :data:`LABEL_THRESHOLD`."""
    q = np.asarray(quality, dtype=float)
    out = (q >= (0.5 if metric == "Accuracy" else LABEL_THRESHOLD)).astype(float)
    return np.where(np.isnan(q), np.nan, out)


def labels_for(quality: np.ndarray, metric: str) -> np.ndarray:
    """(n,) the labels a head is fitted on (NaN stays NaN): accuracy as its 0/1, another
    metric (ROUGE-L) as the fractional quality itself, clipped to [0, 1]."""
    q = np.asarray(quality, dtype=float)
    return binary_labels(q, metric) if metric == "Accuracy" else np.clip(q, 0.0, 1.0)


def _sets(head: Head, rows: Sequence[Mapping]) -> tuple[dict, list[str]]:
    """The head's candidate column sets on these rows, and every column they read."""
    sets = feature_sets(head.features, rows)
    if head.together:
        sets = {k: v for k, v in sets.items() if k == " & ".join(head.features)}
    return sets, list(dict.fromkeys(c for f in sets.values() for c in f))


def _labels(y: np.ndarray) -> np.ndarray:
    """0/1 labels as integers, fractional ones as they are."""
    return y if is_soft(y) else y.astype(int)


def cross_fitted(head: Head, rows: Sequence[Mapping], y: np.ndarray, folds: np.ndarray, *,
                 seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """(n,) cross-fitted uncertainty 1 − P(correct) of ``head`` and the map chosen per fold.

    Args:
        head: the head.
        rows: n answer rows (``scores``, ``blocks``).
        y: (n,) labels, 0/1 or fractional (:func:`labels_for`; NaN: the row takes no part in
            a fit).
        folds: (n,) fold of each row.
        seed: the selection's folds and the networks' seed.

    Returns:
        (uncertainty (n,), NaN for a fold whose training rows hold fewer than
        ``evaluation.fractional.MIN_PER_CLASS`` answers of a class; "fold k: kind on set" per fold).
    """
    sets, cols_needed = _sets(head, rows)
    cols = values(rows, cols_needed)
    out = np.full(len(rows), np.nan)
    chosen = []
    for k in np.unique(folds):
        tr = (folds != k) & ~np.isnan(y)
        te = folds == k
        if not enough_of_each(y[tr]):
            chosen.append(f"fold {k}: too few of a class to fit")
            continue
        m, _ = select_map({c: v[tr] for c, v in cols.items()}, _labels(y[tr]), seed=seed,
                          sets=sets, kinds=head.kinds)
        out[te] = 1.0 - m.predict({c: v[te] for c, v in cols.items()})
        chosen.append(f"fold {k}: {m.kind} on {m.name}")
    return out, chosen


def transferred(head: Head, train_rows: Sequence[Mapping], y_train: np.ndarray,
                test_rows: Sequence[Mapping], *, seed: int = 0) -> tuple[np.ndarray, str]:
    """(n_test,) uncertainty 1 − P(correct) of ``head`` fitted on every labelled training row
    (another dataset of the same model), and the map chosen; all NaN when the training rows
    hold too few of a class."""
    sets, cols_needed = _sets(head, train_rows)
    tr = ~np.isnan(y_train)
    if not enough_of_each(y_train[tr]):
        return np.full(len(test_rows), np.nan), "too few of a class to fit"
    cols = values(train_rows, cols_needed)
    m, _ = select_map({c: v[tr] for c, v in cols.items()}, _labels(y_train[tr]), seed=seed,
                      sets=sets, kinds=head.kinds)
    return 1.0 - m.predict(values(test_rows, m.features)), f"{m.kind} on {m.name}"


class ProbeFit(NamedTuple):
    """What :func:`probe_cross_fitted` gives: the anchor's uncertainty, what each fold chose,
    and per fold the probe's logit of every answer, the feature the stacked head reads."""

    #: (n,) 1 − P(correct), NaN for a fold too small to fit
    uncertainty: np.ndarray
    #: "fold k: <state>, C=…" per fold
    chosen: list[str]
    #: (K, n) logit P(correct) as fold k's stacked head sees it: of its training answers from
    #: the inner folds that chose the probe (out of fold), of its own answers from the probe
    #: refitted on all its training answers; NaN for an answer in neither (no label) or a fold
    #: too small to fit
    fold_logits: np.ndarray


def probe_cross_fitted(states: Mapping[str, np.ndarray], y: np.ndarray, folds: np.ndarray, *,
                       seed: int = 0, inner: int = INNER_FOLDS) -> ProbeFit:
    """Cross-fitted uncertainty 1 − P(correct) of the hidden-state probe (:data:`PROBE`), what
    it chose per fold, and the per-fold logits the stacked head reads (:data:`STACKED`).

    In each outer fold k, the state (one of ``states``, e.g. the answer's mean hidden state at
    a few layers) and the inverse L2 strength C (``isouq.probe.PROBE_C``) with the smallest
    log-loss over ``inner`` seeded folds of the other folds' answers are refitted on all of
    them and score fold k (``isouq.probe.stack_logits``).

    Args:
        states: candidate name (a layer) -> (n, d) hidden states.
        y: (n,) labels, 0/1 or fractional (:func:`labels_for`; NaN: takes no part in a fit).
        folds: (n,) fold of each row (the heads' folds).
        seed: the inner folds' seed.
        inner: inner folds for the choice.

    Returns:
        :class:`ProbeFit` (its uncertainty NaN for a fold whose training rows hold fewer than
        ``evaluation.fractional.MIN_PER_CLASS`` answers of a class).
    """
    states = {name: np.asarray(X, dtype=float) for name, X in states.items()}
    ks = np.unique(folds)
    out = np.full(len(y), np.nan)
    logits = np.full((len(ks), len(y)), np.nan)
    chosen = []
    rng = np.random.default_rng(seed)
    for i, k in enumerate(ks):
        tr = np.flatnonzero((folds != k) & ~np.isnan(y))
        te = folds == k
        if not enough_of_each(y[tr]):
            chosen.append(f"fold {k}: too few of a class to fit")
            continue
        logits[i, tr], probe = stack_logits({n: X[tr] for n, X in states.items()}, y[tr],
                                            rng=rng, inner=inner)
        logits[i, te] = probe.logit(states[probe.state][te])
        out[te] = 1.0 - expit(logits[i, te])
        chosen.append(f"fold {k}: {probe.state}, C={probe.C:g}")
    return ProbeFit(out, chosen, logits)


def stacked_cross_fitted(head: Head, rows: Sequence[Mapping], y: np.ndarray,
                         folds: np.ndarray, fold_logits: np.ndarray, *,
                         seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """(n,) cross-fitted uncertainty 1 − P(correct) of ``head`` with the hidden-state probe's
    logit as one more feature (stacking), and the map chosen per fold.

    Fold k's head is selected and fitted on its training answers, their probe logits out of
    fold (``fold_logits[k]``, :func:`probe_cross_fitted`), and scores fold k with the logits of
    the probe fitted on all its training answers: no answer is scored by a head or a probe that
    saw its label. The candidates: ``head``'s sets (``evaluation.features.feature_sets``: with
    the feature ``hidden``, each set of the others also with the probe's logit, and the logit
    alone), as ``isouq calibrate --features ... hidden`` selects.

    Args:
        head: a head whose features include ``hidden`` (:data:`STACKED`).
        rows: n answer rows (``scores``, ``blocks``).
        y: (n,) labels, 0/1 or fractional (NaN: the row takes no part in a fit).
        folds: (n,) fold of each row, the folds the probe was cross-fitted on.
        fold_logits: (K, n) :attr:`ProbeFit.fold_logits`, row i for the i-th fold in sorted
            order.

    Returns:
        (uncertainty (n,), NaN for a fold too small to fit; "fold k: kind on set" per fold).
    """
    sets, cols_needed = _sets(head, rows)
    cols = values(rows, cols_needed)
    logits = np.asarray(fold_logits, dtype=float)
    out = np.full(len(rows), np.nan)
    chosen = []
    for i, k in enumerate(np.unique(folds)):
        tr = (folds != k) & ~np.isnan(y) & ~np.isnan(logits[i])
        te = folds == k
        if not enough_of_each(y[tr]) or np.isnan(logits[i][te]).any():
            chosen.append(f"fold {k}: too few of a class to fit")
            continue
        here = {**cols, PROBE_COLUMN: logits[i]}
        m, _ = select_map({c: v[tr] for c, v in here.items()}, _labels(y[tr]), seed=seed,
                          sets=sets, kinds=head.kinds)
        out[te] = 1.0 - m.predict({c: v[te] for c, v in here.items()})
        chosen.append(f"fold {k}: {m.kind} on {m.name}")
    return out, chosen


class ProbeTransfer(NamedTuple):
    """What :func:`probe_transferred` gives: the probe fitted on one dataset's answers, its
    logits for stacking on those answers and on another dataset's."""

    #: (n_train,) logit P(correct) of each training answer out of fold (the inner folds), NaN
    #: for an unlabelled one
    train_logits: np.ndarray
    #: (n_test,) logit P(correct) of each test answer by the probe refitted on all training ones
    test_logits: np.ndarray
    #: "<state>, C=…", or why none was fitted
    chosen: str


def probe_transferred(train_states: Mapping[str, np.ndarray], y_train: np.ndarray,
                      test_states: Mapping[str, np.ndarray], *, seed: int = 0,
                      inner: int = INNER_FOLDS) -> ProbeTransfer:
    """The hidden-state probe fitted on every labelled answer of one dataset and applied to
    another dataset's answers of the same model: what the stacked head trained on the first
    (:func:`stacked_transferred`) reads.

    Args:
        train_states: candidate name (a layer) -> (n_train, d) states of the training answers.
        y_train: (n_train,) their labels, 0/1 or fractional (NaN: takes no part).
        test_states: the same names -> (n_test, d) states of the answers to score.
        seed: the inner folds' seed.
        inner: inner folds for the choice of state and C.

    Returns:
        :class:`ProbeTransfer` (all NaN when the training labels hold too few of a class).
    """
    y = np.asarray(y_train, dtype=float)
    n_test = len(next(iter(test_states.values())))
    train, test = np.full(len(y), np.nan), np.full(n_test, np.nan)
    tr = np.flatnonzero(~np.isnan(y))
    if not enough_of_each(y[tr]):
        return ProbeTransfer(train, test, "too few of a class to fit")
    train[tr], probe = stack_logits({n: np.asarray(X, dtype=float)[tr]
                                     for n, X in train_states.items()}, y[tr], seed=seed,
                                    inner=inner)
    test[:] = probe.logit(np.asarray(test_states[probe.state], dtype=float))
    return ProbeTransfer(train, test, f"{probe.state}, C={probe.C:g}")


def stacked_transferred(head: Head, train_rows: Sequence[Mapping], y_train: np.ndarray,
                        train_logits: np.ndarray, test_rows: Sequence[Mapping],
                        test_logits: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, str]:
    """(n_test,) uncertainty 1 − P(correct) of the stacked ``head`` fitted on every labelled
    answer of one dataset (their probe logits out of fold) and applied to another's (their
    logits from the probe refitted on all the training answers: :func:`probe_transferred`), and
    the map chosen; all NaN when the training rows hold too few of a class.

    Args:
        head: a head whose features include ``hidden`` (:data:`STACKED`).
        train_rows, test_rows: answer rows (``scores``, ``blocks``) of the two datasets.
        y_train: (n_train,) labels of the training rows (NaN: takes no part).
        train_logits: (n_train,) :attr:`ProbeTransfer.train_logits` (NaN: takes no part).
        test_logits: (n_test,) :attr:`ProbeTransfer.test_logits`.
    """
    y = np.asarray(y_train, dtype=float)
    lt = np.asarray(train_logits, dtype=float)
    tr = ~np.isnan(y) & ~np.isnan(lt)
    out = np.full(len(test_rows), np.nan)
    if not enough_of_each(y[tr]):
        return out, "too few of a class to fit"
    sets, cols_needed = _sets(head, train_rows)
    here = {**values(train_rows, cols_needed), PROBE_COLUMN: lt}
    m, _ = select_map({c: v[tr] for c, v in here.items()}, _labels(y[tr]), seed=seed,
                      sets=sets, kinds=head.kinds)
    test = {**values(test_rows, m.features), PROBE_COLUMN: np.asarray(test_logits, dtype=float)}
    ok = ~np.isnan(test[PROBE_COLUMN])
    out[ok] = 1.0 - m.predict({c: v[ok] for c, v in test.items()})
    return out, f"{m.kind} on {m.name}"


__all__ = ["CONTROL", "HEADS", "LABEL_THRESHOLD", "PROBE", "STACKED", "Head", "ProbeFit",
           "ProbeTransfer", "binary_labels", "cross_fitted", "labels_for", "probe_cross_fitted",
           "probe_transferred", "stacked_cross_fitted", "stacked_transferred", "transferred"]
