"""Calibrated P(correct) from the gradient scores: the :class:`Calibrator`.

A calibration maps one model's scores of an answer (epistemic ‖∇θ p̄‖², aleatoric, p̄ and,
where present or derivable, epistemic_log = ‖∇θ log p̄‖² = epistemic / p̄²) to the probability
that the answer is correct, learnt from labelled answers of that model (``isouq qa run`` rows,
or any rows with the scores and a 0/1 label).

Candidate maps (all fitted with scikit-learn), for each candidate feature set — by default
:data:`FEATURE_SETS` (each score alone, and the combinations the QA study's logistic
regression uses); with ``features`` (``isouq calibrate --features``), each of the asked scores
alone, all of them together and, with the block profile, the scores without it
(``evaluation.features.feature_sets``; p̄, the sequence log-probability, the gradient scores and
the block profile, the squared norms and ``nll`` on a log scale):

* ``platt``: the study's correctness model (:func:`isouq.evaluation.classifier.correctness_model`:
  standardized features, L2-regularised logistic regression; epistemic scores on a log scale as
  in the study) — Platt scaling when there is one feature;
* ``isotonic``: the same regression's linear score recalibrated by isotonic regression fitted
  on its out-of-fold values (``CalibratedClassifierCV(method="isotonic", ensemble=False)``);
* ``mlp``: a small neural network (scikit-learn's ``MLPClassifier``: standardized features, one
  hidden layer of :data:`MLP_HIDDEN` ReLU units, L2 penalty :data:`MLP_ALPHA`, at most
  :data:`MLP_MAX_ITER` L-BFGS iterations), the nonlinear
  candidate, for sets of two columns or more.

The candidate with the smallest cross-validated log-loss (``cross_val_predict``, stratified
folds) is refitted on all rows and kept. A calibration may also hold a threshold on P(correct)
chosen by Learn then Test (:mod:`isouq.evaluation.risk_control`): answers below it are withheld
so that, with probability ≥ 1 − δ, the error rate among kept answers is ≤ α. The map is then
fitted on one part of the rows and the threshold tested on the other (the guarantee needs rows
the map has not seen).

Files are JSON (``save``/``load``; no pickle): format name and version, the model's name and the
SHA-256 of its weight files, the label source, the features (and, with the block profile, the
blocks' names), the fitted map's numbers, the selection table, the risk control and the rows'
sources. Files of format version 1 (maps on the scores only) are read as they are.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.calibration import CalibratedClassifierCV

from .answer_row import answer_id, scores_of
from .errors import DataError, InputError
from .evaluation import features as feats_
from .evaluation.features import BLOCK, FEATURES, HIDDEN, PROBE_COLUMN, is_log
from .evaluation.fractional import (
    MIN_PER_CLASS,
    fit_labels,
    is_soft,
    soft_log_loss,
)
from .evaluation.rows import GRADIENT_METHODS, LOG_FEATURES, METHODS, log_shift
from .probe import FittedProbe, stack_logits

FORMAT = "isouq-calibration"
FORMAT_VERSION = 3
#: the versions this isouq reads (1: maps on the scores only; 2: also the block profile; 3: also
#: the hidden-state probe)
READS_VERSIONS = (1, 2, 3)
#: the scores a calibration may use (epistemic_log is derived from epistemic and mean_prob)
SCORES: tuple[str, ...] = ("epistemic", "aleatoric", "mean_prob", "epistemic_log")
#: scores that span orders of magnitude: used as log(x) (log(x + shift) when the fit rows hold 0)
LOG_SCORES: tuple[str, ...] = (*LOG_FEATURES, "epistemic_log")


def _feature_sets() -> dict[str, tuple[str, ...]]:
    """p̄, the study's gradient methods (named as in ``evaluation.rows.METHODS``), epistemic_log
    and all three scores together; each feature tuple once."""
    sets: dict[str, tuple[str, ...]] = {}
    for name, feats in [("p̄", ("mean_prob",)), *((m, METHODS[m]) for m in GRADIENT_METHODS),
                        ("Epi. log", ("epistemic_log",)),
                        ("Epi. & Alea. & p̄", ("epistemic", "aleatoric", "mean_prob"))]:
        if tuple(feats) not in sets.values() and set(feats) <= set(SCORES):
            sets[name] = tuple(feats)
    return sets


#: candidate feature sets: each score alone, the study's combination, and all three scores
FEATURE_SETS: dict[str, tuple[str, ...]] = _feature_sets()
#: the single-score feature sets (reported beside the selected map)
SINGLE_SCORES: tuple[str, ...] = tuple(n for n, f in FEATURE_SETS.items() if len(f) == 1)
MAP_KINDS: tuple[str, ...] = ("platt", "isotonic", "mlp")
#: hidden ReLU units of the ``mlp`` candidate, its L2 penalty (scikit-learn's ``alpha``) and
#: its L-BFGS iterations (a cap that also regularises: on 500 answers with a 35-column block
#: profile, 200 iterations gave a lower cross-validated log-loss than 2,000, at a fifth of the
#: time)
MLP_HIDDEN = 16
MLP_ALPHA = 1.0
MLP_MAX_ITER = 200
#: label sources: name -> field of a row (``hand`` reads gold rows instead)
LABEL_FIELDS: dict[str, str] = {"judge": "correct", "lexical": "lexical_correct"}
LABELS: tuple[str, ...] = ("hand", "judge", "lexical")
MIN_ROWS = 20
MAX_FOLDS = 5
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".gguf", ".bin", ".pt", ".pth")


class CalibrationError(DataError):
    """A calibration cannot be fitted, read or used as asked."""


# ---------------------------------------------------------------- scores and labels
def score_columns(scores: Mapping[str, Sequence[float]] | Sequence[Mapping],
                  names: Iterable[str] = SCORES) -> dict[str, np.ndarray]:
    """name -> (n,) float values, NaN where missing or null.

    Args:
        scores: rows (dicts; see :func:`isouq.answer_row.scores_of`) or a mapping name -> (n,) values.
        names: the scores wanted. ``epistemic_log`` is taken as given when present, else
            derived as epistemic / mean_prob² (‖∇θ p̄‖² = p̄² ‖∇θ log p̄‖²).

    Returns:
        name -> (n,) float array.
    """
    names = tuple(names)
    if isinstance(scores, Mapping):
        cols = {k: np.asarray(v, dtype=float).reshape(-1) for k, v in scores.items()
                if k in SCORES}
        n = len(next(iter(cols.values()))) if cols else 0
    else:
        rows = [scores_of(r) for r in scores]
        n = len(rows)
        cols = {}
        for k in SCORES:
            vals = [r.get(k) for r in rows]
            if any(v is not None for v in vals):
                cols[k] = np.array([math.nan if v is None else v for v in vals], dtype=float)
    if "epistemic_log" not in cols and {"epistemic", "mean_prob"} <= cols.keys():
        with np.errstate(divide="ignore", invalid="ignore"):
            cols["epistemic_log"] = cols["epistemic"] / cols["mean_prob"] ** 2
    if "epistemic_log" in cols and {"epistemic", "mean_prob"} <= cols.keys():
        with np.errstate(divide="ignore", invalid="ignore"):  # fill rows that lack it
            derived = cols["epistemic"] / cols["mean_prob"] ** 2
        cols["epistemic_log"] = np.where(np.isnan(cols["epistemic_log"]), derived,
                                         cols["epistemic_log"])
    missing = [k for k in names if k not in cols]
    if missing:
        raise InputError(f"the scores lack {missing}; a calibration needs "
                         f"{list(names)} for each answer (rows of `isouq qa run`, "
                         "`isouq score` or `isouq ask` carry them)")
    out = {}
    for k in names:
        if cols[k].shape != (n,):
            raise InputError(f"score {k!r} has shape {cols[k].shape}; give one value per answer")
        out[k] = np.where(np.isfinite(cols[k]), cols[k], np.nan)
    return out


def labels_of(rows: Sequence[Mapping], source: str,
              gold_rows: Sequence[Mapping] | None = None,
              field: str | None = None) -> tuple[list[dict], np.ndarray]:
    """The labelled rows and their (n,) labels under ``source``.

    Args:
        rows: QA rows (or rows with the scores and a ``correct`` label).
        source: ``judge`` (the row's ``correct``), ``lexical`` (``lexical_correct``) or
            ``hand`` (the gold rows' ``gold_correct``, :mod:`isouq.evaluation.labels`).
        gold_rows: hand labels, needed for ``hand``.
        field: read the label from this field of each row instead (``judge`` and ``lexical``).

    Returns:
        (rows that have a label, (n,) float labels): 0/1 (true/false), or a quality in
        [0, 1] per answer (a ROUGE-L, a judge's probability: fractional labels). Rows whose
        label is null are left out. CalibrationError for a label that is neither.
    """
    from .evaluation.labels import with_gold_labels

    if source not in LABELS:
        raise InputError(f"unknown label source {source!r}; choose from {', '.join(LABELS)}")
    rows = [dict(r) for r in rows]
    if source == "hand":
        if not gold_rows:
            raise CalibrationError(
                "--labels hand needs hand labels (results/qa/gold/<dataset>__<model>.gold.jsonl"
                " beside the rows, or --gold FILE); label answers with `isouq qa label`")
        rows = with_gold_labels(rows, gold_rows)
        if not rows:
            raise CalibrationError("no row has a hand label: the gold rows name other keys, "
                                   "models or datasets; check --gold")
        field = "correct"
    else:
        field = field or LABEL_FIELDS[source]
        if not any(field in r for r in rows):
            raise CalibrationError(
                f"the rows have no {field!r} field, so they carry no labels: judge them "
                "(`isouq qa run`), add a 0/1 or [0, 1] 'correct', or name the field that holds "
                "them (--label-field NAME)")
    kept, y = [], []
    for r in rows:
        v = r.get(field)
        if v is None:
            continue
        if isinstance(v, (bool, np.bool_)):
            v = float(v)
        if not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v <= 1:
            raise CalibrationError(f"row {r.get('key')!r}: {field} = {v!r}; a label is "
                                   "true/false, 0/1, a quality in [0, 1] (a ROUGE-L, a judge's "
                                   "probability) or null: fix the row or leave it out")
        kept.append(r)
        y.append(float(v))
    if not kept:
        raise CalibrationError(f"none of the {len(rows)} rows has a label in {field!r} (null "
                               "everywhere); label them first")
    y = np.asarray(y, dtype=float)
    return kept, (y if is_soft(y) else y.astype(int))


def check_labels(y: np.ndarray, what: str = "the rows", *, per_class: int = MIN_PER_CLASS,
                 min_rows: int = MIN_ROWS) -> None:
    """CalibrationError unless ``y`` (n,) holds both classes (a fractional label counts as
    correct at ≥ 0.5), ≥ ``min_rows`` rows and ≥ ``per_class`` of each class (cross-validation
    needs both classes in every fold)."""
    y = np.asarray(y, dtype=float)
    n, n1 = int(y.size), int((y >= 0.5).sum())
    if n1 == 0 or n1 == n:
        only = "correct" if n1 == n else "wrong"
        raise CalibrationError(f"{what}: all {n} answers are {only} (one label class): "
                               "P(correct) cannot be learnt; add answers of the other class")
    if n < min_rows:
        raise CalibrationError(f"{what}: {n} labelled answers; a calibration needs at least "
                               f"{min_rows} - label more answers")
    if min(n1, n - n1) < per_class:
        raise CalibrationError(
            f"{what}: {n1} correct and {n - n1} wrong answers; a cross-validated calibration "
            f"needs at least {per_class} of each - label more answers")


def check_complete(cols: Mapping[str, np.ndarray], rows: Sequence[Mapping] | None = None) -> None:
    """CalibrationError naming the first row with a NaN or missing score."""
    for k, v in cols.items():
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            key = rows[bad[0]].get("key") if rows is not None else int(bad[0])
            raise CalibrationError(
                f"score {k!r} is missing or NaN in {bad.size} row(s) (first: {key!r}); drop "
                "those rows (an empty answer has no scores) or re-score them")


# ---------------------------------------------------------------- one fitted map
def _cv(y: np.ndarray, seed: int, max_folds: int = MAX_FOLDS):
    from sklearn.model_selection import KFold, StratifiedKFold

    if is_soft(y):  # fractional labels: plain shuffled folds
        return KFold(n_splits=min(max_folds, len(y)), shuffle=True, random_state=seed)

    k = min(max_folds, int(y.sum()), int(y.size - y.sum()))
    if k < 2:
        raise CalibrationError(f"{int(y.sum())} correct of {y.size}: too few of a class to "
                               "cross-validate; label more answers")
    return StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)


class ClippedIsotonic(CalibratedClassifierCV):
    """``CalibratedClassifierCV`` whose P(correct) is kept in [1/(n+1), n/(n+1)] for n fitting
    rows: isotonic regression returns 0 or 1 on a run of one class, which no finite sample
    supports (and which makes the log-loss infinite)."""

    def fit(self, X, y, **kw):  # noqa: D102 - as CalibratedClassifierCV.fit
        self.n_fit_ = len(y)
        return super().fit(X, y, **kw)

    def predict_proba(self, X):  # noqa: D102 - as CalibratedClassifierCV, clipped
        lo = 1.0 / (self.n_fit_ + 1)
        p1 = np.clip(super().predict_proba(X)[:, 1], lo, 1.0 - lo)
        return np.stack([1.0 - p1, p1], axis=1)


def _estimator(kind: str, y: np.ndarray, seed: int):
    from .evaluation.classifier import correctness_model

    if kind == "platt":
        return correctness_model()
    if kind == "isotonic":
        return ClippedIsotonic(correctness_model(), method="isotonic",
                               cv=_cv(y, seed, max_folds=3), ensemble=False)
    if kind == "mlp":
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        return Pipeline([("scale", StandardScaler()), ("mlp", MLPClassifier(
            hidden_layer_sizes=(MLP_HIDDEN,), alpha=MLP_ALPHA, solver="lbfgs",
            max_iter=MLP_MAX_ITER, random_state=seed))])
    raise InputError(f"unknown map {kind!r}; choose from {', '.join(MAP_KINDS)}")


@dataclass(frozen=True)
class FittedMap:
    """A fitted map from scores to P(correct), as numbers (JSON-ready, no pickle).

    features: column names (scores, ``block:<name>`` columns); shifts: column -> shift of its
    log (log columns only); mean, scale: the standardization (d,); hidden: the ``mlp`` map's
    hidden layers, each (weights (d_in, h) as rows, bias (h,)), ReLU (empty otherwise); coef,
    intercept: the logistic output on the standardized features (or on the last hidden
    layer); iso_x, iso_y: the isotonic regression's knots on the linear score (isotonic only,
    else empty). ``predict`` reproduces scikit-learn's ``predict_proba(X)[:, 1]`` of the
    fitted estimator.
    """

    name: str
    kind: str
    features: tuple[str, ...]
    shifts: dict[str, float]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    iso_x: tuple[float, ...] = ()
    iso_y: tuple[float, ...] = ()
    hidden: tuple = ()

    def design(self, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        """(n, d) features: log scores as log(x + shift)."""
        return design_matrix(cols, self.features, self.shifts)

    def predict(self, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        """(n,) P(correct) from name -> (n,) raw scores (NaN where a score is NaN)."""
        from scipy.special import expit

        h = (self.design(cols) - np.asarray(self.mean)) / np.asarray(self.scale)
        for w, b in self.hidden:
            h = np.maximum(h @ np.asarray(w) + np.asarray(b), 0.0)
        z = h @ np.asarray(self.coef) + self.intercept
        if self.kind in ("platt", "mlp"):
            return expit(z)
        p = np.interp(z, self.iso_x, self.iso_y)  # sklearn's interp1d, clipped at the ends
        return np.where(np.isnan(z), np.nan, p)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "features": list(self.features),
                "shifts": self.shifts, "mean": list(self.mean), "scale": list(self.scale),
                "coef": list(self.coef), "intercept": self.intercept,
                "iso_x": list(self.iso_x), "iso_y": list(self.iso_y),
                **({"hidden": [{"weights": [list(r) for r in w], "bias": list(b)}
                               for w, b in self.hidden]} if self.hidden else {})}

    @classmethod
    def from_dict(cls, d: Mapping) -> FittedMap:
        """The map of a calibration file; ValueError when its parts do not fit together."""
        d_feats = len(d["features"])
        hidden = tuple((tuple(tuple(map(float, r)) for r in layer["weights"]),
                        tuple(map(float, layer["bias"]))) for layer in d.get("hidden", ()))
        widths = [d_feats, *(len(b) for _, b in hidden)]
        known = all(f in FEATURES or f.startswith(BLOCK) or f == PROBE_COLUMN
                    for f in d["features"])
        if d["kind"] not in MAP_KINDS or not known or any(
                len(d[k]) != d_feats for k in ("mean", "scale")) or (
                len(d["coef"]) != widths[-1]) or any(
                len(w) != widths[i] or any(len(r) != len(b) for r in w)
                for i, (w, b) in enumerate(hidden)) or (d["kind"] == "mlp") != bool(hidden) or (
                d["kind"] == "isotonic" and not 0 < len(d["iso_x"]) == len(d["iso_y"])):
            raise DataError(f"map {d.get('kind')!r} on {d.get('features')!r} is incomplete; "
                            "re-create the calibration file with isouq calibrate")
        return cls(name=str(d["name"]), kind=str(d["kind"]), features=tuple(d["features"]),
                   shifts={str(k): float(v) for k, v in d["shifts"].items()},
                   mean=tuple(map(float, d["mean"])), scale=tuple(map(float, d["scale"])),
                   coef=tuple(map(float, d["coef"])), intercept=float(d["intercept"]),
                   iso_x=tuple(map(float, d.get("iso_x", ()))),
                   iso_y=tuple(map(float, d.get("iso_y", ()))), hidden=hidden)


def design_matrix(cols: Mapping[str, np.ndarray], features: Sequence[str],
                  shifts: Mapping[str, float]) -> np.ndarray:
    """(n, d) matrix of ``features`` from raw score columns; the log columns (those ``shifts``
    holds: ``evaluation.features.is_log``) become log(x + shift) (NaN for negative values)."""
    out = []
    for f in features:
        x = np.asarray(cols[f], dtype=float)
        if f in shifts:
            with np.errstate(invalid="ignore", divide="ignore"):
                x = np.log(x + shifts.get(f, 0.0))
            x = np.where(np.isfinite(x), x, np.nan)
        out.append(x)
    return np.stack(out, axis=1)


def log_shifts(cols: Mapping[str, np.ndarray], features: Iterable[str]) -> dict[str, float]:
    """score -> the study's log shift (:func:`isouq.evaluation.rows.log_shift`) for the log
    scores among ``features``; CalibrationError on a negative value."""
    out = {}
    for f in features:
        if is_log(f):
            x = np.asarray(cols[f], dtype=float)
            if (x[np.isfinite(x)] < 0).any():
                raise CalibrationError(f"score {f!r} has negative values; it enters on a log "
                                       "scale and must be ≥ 0 - check the scores")
            out[f] = log_shift(x)
    return out


def fit_map(cols: Mapping[str, np.ndarray], y: np.ndarray, name: str, kind: str, *,
            seed: int = 0, sets: Mapping[str, tuple[str, ...]] | None = None) -> FittedMap:
    """Fit one candidate: feature set ``name`` of ``sets`` (default :data:`FEATURE_SETS`),
    map ``kind``.

    cols: column -> (n,) raw values (no NaN); y: (n,) 0/1.
    """
    feats = (FEATURE_SETS if sets is None else sets)[name]
    shifts = log_shifts(cols, feats)
    X = design_matrix(cols, feats, shifts)
    if kind == "isotonic" and is_soft(y):
        raise CalibrationError("the isotonic map needs 0/1 labels; fractional labels take the "
                               "platt or mlp map")
    est = _estimator(kind, y, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fit_labels(est, X, y)
    iso_x: tuple = ()
    iso_y: tuple = ()
    if kind == "mlp":
        scaler, mlp = est.named_steps["scale"], est.named_steps["mlp"]
        hidden = tuple((tuple(tuple(map(float, r)) for r in w), tuple(map(float, b)))
                       for w, b in zip(mlp.coefs_[:-1], mlp.intercepts_[:-1], strict=True))
        return FittedMap(name=name, kind=kind, features=feats, shifts=shifts,
                         mean=tuple(map(float, scaler.mean_)),
                         scale=tuple(map(float, scaler.scale_)),
                         coef=tuple(map(float, mlp.coefs_[-1][:, 0])),
                         intercept=float(mlp.intercepts_[-1][0]), hidden=hidden)
    if kind == "isotonic":
        cal = est.calibrated_classifiers_[0]
        iso = cal.calibrators[0]
        lo = 1.0 / (y.size + 1)  # no frequency from n rows is sharper than 1/(n+1)
        iso_x = tuple(map(float, iso.X_thresholds_))
        iso_y = tuple(float(v) for v in np.clip(iso.y_thresholds_, lo, 1.0 - lo))
        est = cal.estimator
    scaler, lr = est.named_steps["scale"], est.named_steps["logistic"]
    return FittedMap(name=name, kind=kind, features=feats, shifts=shifts,
                     mean=tuple(map(float, scaler.mean_)), scale=tuple(map(float, scaler.scale_)),
                     coef=tuple(map(float, lr.coef_[0])), intercept=float(lr.intercept_[0]),
                     iso_x=iso_x, iso_y=iso_y)


def cv_predict(cols: Mapping[str, np.ndarray], y: np.ndarray, name: str, kind: str, *,
               seed: int = 0, cv=None, sets: Mapping[str, tuple[str, ...]] | None = None
               ) -> np.ndarray:
    """(n,) out-of-fold P(correct) of one candidate (``cross_val_predict``; the log shift is
    taken from all ``cols``, which matters only when a score is exactly 0)."""
    from sklearn.model_selection import cross_val_predict

    feats = (FEATURE_SETS if sets is None else sets)[name]
    X = design_matrix(cols, feats, log_shifts(cols, feats))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if not is_soft(y):
            return cross_val_predict(_estimator(kind, y, seed), X, y, cv=cv or _cv(y, seed),
                                     method="predict_proba")[:, 1]
        out = np.full(len(y), np.nan)
        for tr, te in (cv or _cv(y, seed)).split(X, (np.asarray(y) >= 0.5).astype(int)):
            est = fit_labels(_estimator(kind, y[tr], seed), X[tr], y[tr])
            out[te] = est.predict_proba(X[te])[:, 1]
        return out


def candidates(cols: Mapping[str, np.ndarray],
               sets: Mapping[str, tuple[str, ...]] | None = None,
               kinds: Sequence[str] = MAP_KINDS) -> list[tuple[str, str]]:
    """(feature set, kind) pairs whose columns ``cols`` holds without NaN (``mlp`` for sets of
    two columns or more)."""
    have = {k for k, v in cols.items() if np.isfinite(v).all()}
    return [(n, k) for n, f in (FEATURE_SETS if sets is None else sets).items()
            if set(f) <= have for k in kinds if k != "mlp" or len(f) > 1]


def _kinds(y: np.ndarray, kinds: Sequence[str]) -> tuple[str, ...]:
    """The maps that fit these labels (fractional labels: no isotonic map)."""
    return tuple(k for k in kinds if not (k == "isotonic" and is_soft(y)))


def select_map(cols: Mapping[str, np.ndarray], y: np.ndarray, *, seed: int = 0,
               sets: Mapping[str, tuple[str, ...]] | None = None,
               kinds: Sequence[str] = MAP_KINDS) -> tuple[FittedMap, list[dict]]:
    """The candidate with the smallest cross-validated log-loss, refitted on all rows, and the
    selection table (one dict per candidate: features, map, cv_log_loss, selected).

    Args:
        cols: column -> (n,) raw values.
        y: (n,) 0/1 labels, or fractional ones in [0, 1] (a quality such as ROUGE-L: the maps
            then estimate its expectation, fitted by weighted log-loss,
            ``evaluation.fractional.soft_rows``; no isotonic map).
        seed: the folds' and the networks' seed.
        sets: the candidate feature sets, name -> columns (default :data:`FEATURE_SETS`).
        kinds: the candidate maps (:data:`MAP_KINDS`).
    """
    from sklearn.metrics import log_loss
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):  # small fits: more threads only contend
        return _select_map(cols, y, seed, sets, kinds, log_loss)


def _select_map(cols, y, seed, sets, kinds, log_loss):
    table = []
    for name, kind in candidates(cols, sets, _kinds(y, kinds)):
        p = cv_predict(cols, y, name, kind, seed=seed, sets=sets)
        table.append({"features": name, "map": kind,
                      "cv_log_loss": soft_log_loss(y, p) if is_soft(y)
                      else float(log_loss(y, p, labels=[0, 1]))})
    if not table:
        raise CalibrationError("no candidate map: the rows lack the scores "
                               f"{list(SCORES[:3])}")
    best = min(table, key=lambda r: r["cv_log_loss"])
    for r in table:
        r["selected"] = r is best
    return fit_map(cols, y, best["features"], best["map"], seed=seed, sets=sets), table


def cross_fit(cols: Mapping[str, np.ndarray], y: np.ndarray, *, seed: int = 0,
              sets: Mapping[str, tuple[str, ...]] | None = None,
              states: Mapping[str, np.ndarray] | None = None
              ) -> tuple[dict[str, np.ndarray], np.ndarray, list[str]]:
    """Out-of-fold P(correct) of the whole procedure and of its references.

    Outer stratified folds; in each, :func:`select_map` runs on the training part only (nested
    selection over ``sets``, default :data:`FEATURE_SETS`) and predicts the held-out part. With
    ``states`` (name -> (n, d) hidden states, the feature ``hidden``), the probe is stacked on
    the training part too (``probe.stack_logits``: its logits there out of fold) and the
    held-out part gets the logits of the probe fitted on the training part.
    References on the same folds: the constant base rate of the training part, and Platt
    scaling of each single-column set.

    Returns:
        (predictor -> (n,) out-of-fold P(correct) with keys "calibrated", "base rate" and the
        single-column sets present, (n,) fold index, the map selected in each fold).
    """
    from sklearn.model_selection import cross_val_predict

    cv = _cv(y, seed + 1)
    out: dict[str, np.ndarray] = {"calibrated": np.full(y.size, np.nan),
                                  "base rate": np.full(y.size, np.nan)}
    fold = np.zeros(y.size, dtype=int)
    chosen = []
    for i, (tr, te) in enumerate(cv.split(np.zeros(y.size), y)):
        on_tr = {k: v[tr] for k, v in cols.items()}
        on_te = {k: v[te] for k, v in cols.items()}
        if states is not None:
            on_tr[PROBE_COLUMN], probe = stack_logits({k: v[tr] for k, v in states.items()},
                                                      y[tr], seed=seed)
            on_te[PROBE_COLUMN] = probe.logit(states[probe.state][te])
        m, _ = select_map(on_tr, y[tr], seed=seed, sets=sets)
        out["calibrated"][te] = m.predict(on_te)
        out["base rate"][te] = y[tr].mean()
        fold[te] = i
        chosen.append(f"{m.kind}: {m.name}")
    sets = FEATURE_SETS if sets is None else sets
    have = {n for n, _ in candidates(cols, sets)}
    for name in (n for n, f in sets.items() if len(f) == 1):
        if name in have:
            X = design_matrix(cols, sets[name], log_shifts(cols, sets[name]))
            out[name] = cross_val_predict(_estimator("platt", y, seed), X, y, cv=cv,
                                          method="predict_proba")[:, 1]
    return out, fold, chosen


# ---------------------------------------------------------------- model identity
def weight_hashes(files: Mapping[str, str] | None) -> dict[str, str]:
    """{file name: SHA-256} of the weight files among {path: SHA-256} (a model's ``files``
    as ``load_model`` and QA ``run.json`` files record them)."""
    return {Path(p).name: h for p, h in (files or {}).items()
            if str(p).endswith(WEIGHT_SUFFIXES) and h}


def _describe(name: str, hashes: Mapping[str, str]) -> str:
    if not hashes:
        return repr(name)
    return f"{name!r} (weights " + ", ".join(f"{k} {v[:12]}…" for k, v in hashes.items()) + ")"


# ---------------------------------------------------------------- the calibrator
def label_words(source: str, field: str | None = None) -> str:
    """Where a calibration's labels came from, in words: ``"judge labels"`` (``--labels``), or
    ``"labels from the field 'rouge'"`` (``--label-field``)."""
    return f"labels from the field {field!r}" if field else f"{source} labels"


class Calibrator:
    """A fitted map from one model's scores to P(correct), with an optional withholding
    threshold. Make one with :meth:`fit` or :meth:`load`.

    Example::

        cal = Calibrator.fit(rows, labels="judge", model="smollm2")
        p = cal.predict({"epistemic": [16.5], "aleatoric": [0.12], "mean_prob": [0.7]})
        cal.save("calibration.json"); Calibrator.load("calibration.json")
    """

    def __init__(self, doc: Mapping):
        self.doc = dict(doc)
        self.map = FittedMap.from_dict(self.doc["map"])
        probe = self.doc.get("hidden_probe")
        self.probe = FittedProbe.from_dict(probe) if probe else None
        if (PROBE_COLUMN in self.map.features) != (self.probe is not None):
            raise DataError("the map and its hidden-state probe do not go together; re-create "
                            "the calibration file with isouq calibrate")

    # ------------------------------------------------ fitting
    @classmethod
    def fit(
        cls,
        rows: Sequence[Mapping],
        *,
        labels: str = "judge",
        gold_rows: Sequence[Mapping] | None = None,
        model: str | None = None,
        model_files: Mapping[str, str] | None = None,
        sources: Sequence[Mapping] = (),
        max_risk: float | None = None,
        delta: float = 0.1,
        risk_fraction: float = 0.5,
        seed: int = 0,
        features: Sequence[str] | None = None,
        kinds: Sequence[str] = MAP_KINDS,
        label_field: str | None = None,
        verdict: Mapping | None = None,
    ) -> Calibrator:
        """Fit a calibration on labelled rows of one model.

        Args:
            rows: QA rows (``scores`` object) or flat rows with the scores; one model.
            labels: label source, ``judge``, ``lexical`` or ``hand`` (:func:`labels_of`).
            gold_rows: hand labels for ``labels="hand"``.
            model: the model's name; default: the rows' ``model`` field (one model only).
            model_files: {path: SHA-256} of the model's files (QA ``run.json`` ``model.files``);
                the weight files' hashes are recorded and checked where it is used.
            sources: where the rows came from (recorded as given, e.g. path and row count).
            max_risk: α; with it, Learn then Test chooses a threshold on P(correct) on a
                held-out ``risk_fraction`` of the rows (stratified) and the map is fitted on
                the rest. None: the map is fitted on all rows, no threshold.
            delta: δ, the allowed probability that the threshold misses α.
            risk_fraction: share of the rows kept apart for the threshold.
            seed: folds and split.
            features: what the map may read (``evaluation.features.FEATURES``: ``mean_prob``,
                ``seq_logprob``, ``nll``, ``aleatoric``, ``epistemic``, ``epistemic_log``,
                ``normalized_epistemic``, ``blocks``); the candidates are each alone, all
                together and, with ``blocks``, the scores without the profile. None: the
                scores' default sets (:data:`FEATURE_SETS`).
            kinds: the maps the selection may choose from (:data:`MAP_KINDS`); ``("platt",)``
                on one feature is a single Platt map (MSP's map), which needs only 2 answers
                of each class.
            label_field: read the labels from this field of the rows (:func:`labels_of`).
            verdict: what ``isouq calibrate`` found on these rows (its comparisons against MSP
                and the choice it made, ``calibration_choice``), kept in the file as given.

        Returns:
            The fitted :class:`Calibrator`.
        """
        from .evaluation.risk_control import check_target, learn_then_test, threshold_grid

        rows = list(rows)
        model = one_model(rows, model)
        rows = [r for r in rows if r.get("model") in (None, model)]
        rows, y = labels_of(rows, labels, gold_rows, field=label_field)
        kinds = tuple(kinds)
        sets = None
        states = None
        if features is None:
            cols = score_columns(rows, SCORES[:3])
            check_complete(cols, rows)
            cols = score_columns(rows)
        else:
            sets = feats_.feature_sets(features, rows)
            cols = feats_.values(rows, dict.fromkeys(c for f in sets.values() for c in f))
            check_complete(cols, rows)
            if HIDDEN in feats_.check_features(features):
                states = feats_.hidden_states(rows)
        one_map = kinds == ("platt",) and sets is not None and len(sets) == 1
        check_labels(y, f"model {model!r}", per_class=2 if one_map else MIN_PER_CLASS,
                     min_rows=4 if one_map else MIN_ROWS)

        def select(idx: np.ndarray):
            """The map selected on rows ``idx`` (with ``hidden``: the probe's logit out of fold
            as one more column), its table, its columns there, and the probe (or None)."""
            here = {k: v[idx] for k, v in cols.items()}
            fitted_probe = None
            if states is not None:
                here[PROBE_COLUMN], fitted_probe = stack_logits(
                    {k: v[idx] for k, v in states.items()}, y[idx], seed=seed)
            fitted, table = select_map(here, y[idx], seed=seed, sets=sets, kinds=kinds)
            return fitted, table, here, fitted_probe

        risk = None
        split = None
        if max_risk is None:
            fitted, table, _, probe = select(np.arange(y.size))
        else:
            from sklearn.model_selection import train_test_split

            check_target(max_risk, delta)
            if not 0 < risk_fraction < 1:
                raise InputError(f"risk_fraction = {risk_fraction}: give a share in (0, 1)")
            right = (y >= 0.5).astype(int)  # a fractional label is an error below 0.5
            fit_idx, risk_idx = train_test_split(np.arange(y.size), test_size=risk_fraction,
                                                 stratify=right, random_state=seed)
            check_labels(y[fit_idx], f"model {model!r}, the {len(fit_idx)} rows the map is "
                                     "fitted on (the others set the threshold)",
                         per_class=2 if one_map else MIN_PER_CLASS,
                         min_rows=4 if one_map else MIN_ROWS)
            fitted, table, on_fit, probe = select(fit_idx)
            grid = threshold_grid(fitted.predict(on_fit), len(risk_idx), alpha=max_risk,
                                  delta=delta)
            on_risk = {k: v[risk_idx] for k, v in cols.items()}
            if probe is not None:  # the risk rows' logits from the probe fitted on the others
                on_risk[PROBE_COLUMN] = probe.logit(states[probe.state][risk_idx])
            p_risk = fitted.predict(on_risk)
            risk = learn_then_test(p_risk, right[risk_idx], grid, alpha=max_risk, delta=delta)
            risk = {**risk.to_dict(), "grid": [float(x) for x in grid]}
            split = {"fit_rows": len(fit_idx), "risk_rows": len(risk_idx),
                     "risk_fraction": risk_fraction, "stratified": True}
        doc = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "isouq": _isouq_version(),
            "model": {"name": model, "sha256": weight_hashes(model_files)},
            "labels": {"source": labels, "n": int(y.size), "correct": int(y.sum()),
                       # what the rows say made their 'correct' (e.g. judge, or lexical when
                       # `isouq qa run --judge-model none`)
                       "row_label_source": sorted({str(r["label_source"]) for r in rows
                                                   if r.get("label_source")})},
            "datasets": sorted({str(r.get("dataset")) for r in rows if r.get("dataset")}),
            "features": list(fitted.features), "scores": list(SCORES),
            "feature_set": None if features is None else list(feats_.check_features(features)),
            "blocks": [c[len(BLOCK):] for c in fitted.features if c.startswith(BLOCK)],
            "map": fitted.to_dict(), "selection": table, "risk_control": risk,
            "hidden_probe": (probe.to_dict() if PROBE_COLUMN in fitted.features else None),
            "split": split, "seed": seed, "sources": [dict(s) for s in sources],
            # the answers it saw (answer_row.answer_id): `isouq calibrate --check` leaves them out
            "fitted_answers": sorted(answer_id(r) for r in rows),
            **({"label_field": label_field} if label_field else {}),
            **({"verdict": dict(verdict)} if verdict is not None else {}),
        }
        return cls(doc)

    # ------------------------------------------------ use
    @property
    def model(self) -> str:
        """The name of the model the calibration was made for."""
        return str(self.doc["model"]["name"])

    @property
    def threshold(self) -> float | None:
        """λ̂ on P(correct) (``inf``: no threshold certified, every answer withheld); None when
        the calibration was made without ``max_risk``."""
        rc = self.doc.get("risk_control")
        if rc is None:
            return None
        return math.inf if rc["threshold"] is None else float(rc["threshold"])

    @property
    def block_names(self) -> tuple[str, ...]:
        """The blocks whose profile the map reads (empty: it reads no profile)."""
        return tuple(c[len(BLOCK):] for c in self.map.features if c.startswith(BLOCK))

    @property
    def needs_blocks(self) -> bool:
        """Whether the answers must be scored with their block profile (``blocks=True``)."""
        return bool(self.block_names)

    @property
    def hidden_state(self) -> str | None:
        """The hidden state the map's probe reads (e.g. ``hidden_states[12]``); None: it reads
        none."""
        return None if self.probe is None else self.probe.state

    @property
    def needs_backward(self) -> bool:
        """Whether the map reads a score that needs the backward pass (a gradient score or the
        block profile); False: a forward pass gives everything it reads."""
        return feats_.needs_backward(self.map.features)

    @property
    def needs_hidden(self) -> bool:
        """Whether the answers must be scored with their hidden states (``hidden=True``)."""
        return self.probe is not None

    def check_hidden(self, states: Mapping[str, int]) -> None:
        """CalibrationError unless the model's hidden states ``states`` ({name: width},
        ``isouq.hidden.model_states``) hold the one the probe reads, at its width (a probe
        trained on one model's states and used on another's)."""
        if self.probe is None:
            return
        width = states.get(self.probe.state)
        if width != len(self.probe.coef):
            have = ", ".join(f"{n} ({w})" for n, w in states.items())
            raise CalibrationError(
                f"the calibration's probe reads {self.probe.state} ({len(self.probe.coef)} "
                f"wide) of {self.model!r}, but this model's states are {have}: calibrate this "
                "model's rows scored with --hidden (`isouq calibrate ROWS --features ... "
                "hidden`)")

    def check_blocks(self, names: Sequence[str] | None) -> None:
        """CalibrationError unless a model's blocks ``names`` are those the map reads (a head
        trained on one model's profile and used on another's)."""
        if self.needs_blocks and tuple(names or ()) != self.block_names:
            raise CalibrationError(
                f"the calibration reads the block profile of {self.model!r} "
                f"({len(self.block_names)} blocks: {', '.join(self.block_names[:3])}, …), but "
                f"this model's blocks are {len(names or ())}: calibrate this model's rows "
                "(`isouq calibrate ROWS --features ... blocks`)")

    def predict(self, scores: Mapping[str, Sequence[float]] | Sequence[Mapping]) -> np.ndarray:
        """P(correct) of each answer.

        Args:
            scores: column -> (n,) values (``epistemic``, ``aleatoric``, ``mean_prob``, …;
                optional ``epistemic_log``; ``block:<name>`` for a map on the block profile),
                or n rows carrying them (:func:`isouq.answer_row.scores_of`, the row's
                ``blocks``).

        Returns:
            (n,) P(correct) in [0, 1]; NaN for an answer with a NaN score (e.g. empty).
        """
        rows = (feats_.rows_of_columns(scores) if isinstance(scores, Mapping)
                else list(scores))
        if self.needs_blocks:
            self.check_blocks(feats_.block_names(rows))
        cols = feats_.values(rows, self.map.features)
        if self.probe is not None:
            states = feats_.hidden_states(rows)
            if self.probe.state not in states:
                raise CalibrationError(
                    f"the calibration's probe reads {self.probe.state} of {self.model!r}, but "
                    f"the answers carry {', '.join(states)}: score them with this model's "
                    "hidden states (isouq score --hidden), or calibrate the rows you have")
            cols[PROBE_COLUMN] = self.probe.logit(states[self.probe.state])
        return self.map.predict(cols)

    def withheld(self, p_correct: np.ndarray) -> np.ndarray | None:
        """(n,) bool, True where P(correct) is below the threshold (or NaN); None without one."""
        t = self.threshold
        if t is None:
            return None
        p = np.asarray(p_correct, dtype=float)
        return ~(p >= t)

    def annotate(self, rows: Sequence[dict]) -> None:
        """Add ``p_correct`` (and ``withheld`` when the calibration has a threshold) to each
        row in place; rows carry their scores as :meth:`predict` reads them."""
        if not rows:
            return
        p = self.predict(rows)
        w = self.withheld(p)
        for i, r in enumerate(rows):
            r["p_correct"] = float(p[i])
            if w is not None:
                r["withheld"] = bool(w[i])

    def check_model(self, name: str, files: Mapping[str, str] | None = None) -> None:
        """CalibrationError when the calibration was made for another model than ``name``
        (with {path: SHA-256} ``files``): weight hashes decide when both sides have them,
        else the names."""
        mine = self.doc["model"].get("sha256") or {}
        theirs = weight_hashes(files)
        same = (bool(set(mine.values()) & set(theirs.values())) if mine and theirs
                else name == self.model)
        if not same:
            raise CalibrationError(
                f"the calibration {self.doc.get('path', '')!s} was made for model "
                f"{_describe(self.model, mine)}, not for {_describe(name, theirs)}: calibrate "
                f"this model's labelled rows (`isouq calibrate ROWS --model {name}`) or ask "
                f"with --model {self.model}")

    @property
    def labels_said(self) -> str:
        """Where the labels came from, in words (:func:`label_words`)."""
        return label_words(self.doc["labels"]["source"], self.doc.get("label_field"))

    def describe(self) -> str:
        """One line: model, map, labels and threshold."""
        lab = self.doc["labels"]
        of = ", ".join(self.doc.get("datasets") or [])
        split = self.doc.get("split")
        halves = (f": map on {split['fit_rows']}, threshold on {split['risk_rows']}"
                  if split else "")
        line = (f"P(ok) = calibrated P(correct) for {self.model} ({self.map.kind} on "
                f"{self.map.name}{' (the block profile)' if self.needs_blocks else ''}"
                f"{f' (a probe on {self.hidden_state})' if self.needs_hidden else ''}; "
                f"{self.labels_said}, {lab['n']} answers"
                f"{f' of {of}' if of else ''}{halves})")
        rc = self.doc.get("risk_control")
        if rc is not None:
            if rc["threshold"] is None:
                line += (f"; no threshold keeps the error rate ≤ {rc['alpha']:g} with "
                         f"probability ≥ {1 - rc['delta']:g}: every answer withheld")
            else:
                line += (f"; withheld = P(ok) < {rc['threshold']:.3f}, which keeps the error "
                         f"rate among kept answers ≤ {rc['alpha']:g} with probability ≥ "
                         f"{1 - rc['delta']:g} (Learn then Test)")
        return line

    # ------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write the calibration as JSON (atomically); return the path."""
        from .runio import dumps

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        doc = {k: v for k, v in self.doc.items() if k != "path"}
        tmp.write_text(dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibrator:
        """Read a calibration file; CalibrationError for a missing, unreadable, foreign or
        other-version file."""
        path = Path(path)
        if not path.is_file():
            raise CalibrationError(f"calibration file {path} does not exist; make one with "
                                   "`isouq calibrate ROWS --out DIR` (DIR/calibration.json)")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CalibrationError(f"cannot read {path} as JSON ({e}); re-run "
                                   "`isouq calibrate`") from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CalibrationError(f"{path} is not an isouq calibration (no format "
                                   f"{FORMAT!r}); pass DIR/calibration.json of `isouq calibrate`")
        version = doc.get("format_version")
        if version not in READS_VERSIONS:
            how = ("re-run `isouq calibrate` on the same rows to rewrite it"
                   if isinstance(version, int) and version < min(READS_VERSIONS)
                   else "upgrade isouq to read it")
            raise CalibrationError(f"{path} has calibration format version {version!r}; this "
                                   f"isouq reads versions "
                                   f"{', '.join(map(str, READS_VERSIONS))}: {how}")
        try:
            cal = cls({**doc, "path": str(path)})
        except (KeyError, TypeError, ValueError) as e:
            raise CalibrationError(f"{path} is damaged ({type(e).__name__}: {e}); re-run "
                                   "`isouq calibrate`") from e
        return cal


def one_model(rows: Sequence[Mapping], model: str | None) -> str:
    """The model of the rows: ``model`` when given, else the rows' one ``model`` field."""
    names = list(dict.fromkeys(str(r["model"]) for r in rows if r.get("model") is not None))
    if model is not None:
        if names and model not in names:
            raise CalibrationError(f"no row is of model {model!r} (models there: "
                                   f"{', '.join(names)}); pass one of them to --model")
        return model
    if not names:
        raise CalibrationError("the rows name no model; pass --model NAME (the model that "
                               "answered and was scored)")
    if len(names) > 1:
        raise CalibrationError(f"the rows hold {len(names)} models ({', '.join(names)}); a "
                               "calibration is per model: pass --model NAME")
    return names[0]


def _isouq_version() -> str:
    from ._version import __version__

    return __version__


__all__ = ["CalibrationError", "Calibrator", "FEATURE_SETS", "cross_fit",
           "fit_labels", "fit_map", "labels_of", "score_columns", "select_map"]
