"""QA result rows -> validated per-(dataset, model) arrays, and the methods of the study.

A row (one per question: the answer row of ``isouq.answer_row`` as the QA pipeline writes it to
JSONL; the fields read here)::

    {"key": str, "model": str, "dataset": str, "question": str, "answer": str,
     "correct": 0 | 1 | null,                      # null = unjudged, the row is dropped
     "scores": {"epistemic": float, "aleatoric": float, "normalized_epistemic": float,
                "mean_prob": float, "epistemic_log": float,
                "naive_entropy": float, "semantic_entropy": float, "p_true": float},
     "passes": {"gradient": 1, ...}, "seconds": {"gradient": float, ...}}

Any score may be missing or null; a method is evaluated on the rows that have all its features.
``epistemic_log`` = ‖∇θ log p̄‖² is derived as epistemic / mean_prob² (the same identity the
scorer uses) for rows written before it was recorded.
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from ..methods import evaluated_labels, evaluated_methods

#: method label -> the score(s) its logistic regression uses as features (``isouq.methods``).
METHODS: dict[str, tuple[str, ...]] = evaluated_methods()
#: the paper's three (aleatoric, epistemic, both) and ‖∇θ log p̄‖²
GRADIENT_METHODS: tuple[str, ...] = evaluated_labels(ours=True)
#: the sampling baselines and p̄ (mean token probability; the maximum sequence probability of
#: LM-Polygraph, length-normalized), which costs nothing beyond the forward pass and is the
#: baseline to beat
BASELINES: tuple[str, ...] = evaluated_labels(ours=False)
#: scores that span orders of magnitude and are log-transformed when ``log_epistemic=True``.
LOG_FEATURES: tuple[str, ...] = ("epistemic", "normalized_epistemic", "epistemic_log")
REQUIRED_FIELDS: tuple[str, ...] = ("key", "model", "dataset", "correct", "scores")


@dataclass(frozen=True)
class QAGroup:
    """The judged rows of one (dataset, model): ``correct`` (n,) int 0/1, ``scores`` name -> (n,)
    float with NaN where a score is missing, ``keys`` (n,) row keys."""

    dataset: str
    model: str
    keys: tuple[str, ...]
    correct: np.ndarray
    scores: dict[str, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.correct.size)

    @property
    def n_per_class(self) -> int:
        """Judged answers of the rarer class (correct or incorrect)."""
        return min(int(self.correct.sum()), int((self.correct == 0).sum()))

    def score(self, name: str) -> np.ndarray:
        """(n,) values of score ``name``; all NaN when no row has it."""
        return self.scores.get(name, np.full(self.n, np.nan))


def _as_correct(v, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, numbers.Real) and v in (0, 1)):
        return int(v)
    raise DataError(f"{where}: 'correct' is {v!r}; it must be 0, 1 or null (unjudged)")


def _as_score(v, name: str, where: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise DataError(f"{where}: score {name!r} is {v!r}; write a number or null")
    if math.isinf(v):
        raise DataError(
            f"{where}: score {name!r} is infinite; fix the scoring run or set it to null"
        )
    return float(v)


def group_rows(rows: Iterable[Mapping]) -> dict[tuple[str, str], QAGroup]:
    """Validate rows and group the judged ones by ``(dataset, model)`` (first-seen order), each
    group's rows in the order of their keys.

    Rows with ``correct`` null are dropped. Raises DataError on a missing field, a non-dict
    ``scores``, a bad value, or a key repeated within one (dataset, model).
    """
    acc: dict[tuple[str, str], dict] = {}
    seen: set[tuple[str, str, str]] = set()
    n_rows = 0
    for i, row in enumerate(rows):
        n_rows += 1
        where = f"row {i}"
        if not isinstance(row, Mapping):
            raise DataError(f"{where} is a {type(row).__name__}, not a JSON object")
        missing = [f for f in REQUIRED_FIELDS if f not in row]
        if missing:
            raise DataError(
                f"{where} (key={row.get('key')!r}) lacks field(s) {missing}; QA rows need "
                f"{list(REQUIRED_FIELDS)} - re-run the QA pipeline or add them"
            )
        where = f"row {i} (key={row['key']!r})"
        scores = row["scores"]
        if not isinstance(scores, Mapping):
            raise DataError(f"{where}: 'scores' must be an object of name -> number")
        correct = _as_correct(row["correct"], where)
        if correct is None:
            continue
        ds, model, key = str(row["dataset"]), str(row["model"]), str(row["key"])
        if (ds, model, key) in seen:
            raise DataError(
                f"{where}: key repeated for model {model!r} on {ds!r}; keep one row per key"
            )
        seen.add((ds, model, key))
        g = acc.setdefault((ds, model), {"keys": [], "correct": [], "scores": {}})
        j = len(g["keys"])
        g["keys"].append(key)
        g["correct"].append(correct)
        for name, v in scores.items():
            col = g["scores"].setdefault(str(name), [math.nan] * j)
            col.append(_as_score(v, str(name), where))
        for col in g["scores"].values():
            if len(col) < j + 1:
                col.append(math.nan)
    if not acc:
        raise DataError(
            f"no judged rows among {n_rows}: every row needs 'correct' 0 or 1; "
            "run the judge first"
        )
    out = {}
    for k, g in acc.items():
        # rows sorted by key: the seeded resampling draws the same questions whatever order
        # the file lists them in (a nested --limit run rewrites it with its questions first)
        order = sorted(range(len(g["keys"])), key=g["keys"].__getitem__)
        out[k] = QAGroup(
            dataset=k[0],
            model=k[1],
            keys=tuple(g["keys"][i] for i in order),
            correct=np.asarray(g["correct"], dtype=int)[order],
            scores=with_epistemic_log({s: np.asarray(v, dtype=float)[order]
                                       for s, v in g["scores"].items()}),
        )
    return out


def with_epistemic_log(scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``scores`` with ``epistemic_log`` = epistemic / mean_prob² filled in where it is missing
    and both are known (∇θ log p̄ = ∇θ p̄ / p̄; rows written before it was recorded)."""
    if "epistemic" not in scores or "mean_prob" not in scores:
        return scores
    epi, p = scores["epistemic"], scores["mean_prob"]
    with np.errstate(divide="ignore", invalid="ignore"):
        derived = np.where(p > 0, epi / p**2, np.nan)
    have = scores.get("epistemic_log", np.full(epi.shape, np.nan))
    return {**scores, "epistemic_log": np.where(np.isfinite(have), have, derived)}


def check_classes(groups: Mapping[tuple[str, str], QAGroup], min_per_class: int = 2) -> None:
    """Raise DataError unless every dataset, and every (dataset, model), has at least
    ``min_per_class`` correct and incorrect answers (AUROC needs both classes)."""
    by_ds: dict[str, list[int]] = {}
    for g in groups.values():
        tot = by_ds.setdefault(g.dataset, [0, 0])
        tot[0] += int((g.correct == 0).sum())
        tot[1] += int((g.correct == 1).sum())
    for ds, (n0, n1) in by_ds.items():
        if n0 == 0 or n1 == 0:
            only = "correct" if n0 == 0 else "incorrect"
            raise DataError(
                f"dataset {ds!r} has only {only} answers ({n0 + n1} judged rows): correctness "
                "cannot be predicted from one class; check the judge, or add questions"
            )
    for g in groups.values():
        n0, n1 = int((g.correct == 0).sum()), int((g.correct == 1).sum())
        if min(n0, n1) < min_per_class:
            raise DataError(
                f"model {g.model!r} on {g.dataset!r} has {n1} correct and {n0} incorrect "
                f"answers; need at least {min_per_class} of each - add questions or leave "
                "that model out"
            )


def drop_partial_scores(rows: Iterable[Mapping]) -> tuple[list[Mapping], list[str]]:
    """(rows without the scores that only some rows of their (dataset, model) carry, one line
    per score dropped). A score key absent from some rows of a group is a method whose run is
    still in progress (``isouq qa run`` adds a method to rows in order); evaluating it on the
    rows done so far would compare methods on different questions. A score present as null is
    a missing value and stays (the method is evaluated on the rows that have it)."""
    rows = list(rows)
    out: list[Mapping] = list(rows)
    why = []
    for (ds, model), (idx, has) in _score_counts(rows).items():
        partial = sorted(k for k, n in has.items() if n < len(idx))
        if not partial:
            continue
        for i in idx:
            out[i] = {**rows[i], "scores": {k: v for k, v in rows[i]["scores"].items()
                                            if k not in partial}}
        by_count: dict[int, list[str]] = {}
        for k in partial:
            by_count.setdefault(has[k], []).append(k)
        why += [f"{_scores_phrase(ks)} of model {model!r} on {ds!r} left out: on {n} of "
                f"{len(idx)} rows (run in progress; resume `isouq qa run` to complete it)"
                for n, ks in by_count.items()]
    return out, why


def _score_counts(
    rows: list[Mapping],
) -> dict[tuple[str, str], tuple[list[int], dict[str, int]]]:
    """(dataset, model) -> (indices of its rows, score key -> number of those rows with it)."""
    out: dict[tuple[str, str], tuple[list[int], dict[str, int]]] = {}
    for i, r in enumerate(rows):
        idx, has = out.setdefault((str(r.get("dataset")), str(r.get("model"))), ([], {}))
        idx.append(i)
        sc = r.get("scores")
        for k in sc if isinstance(sc, Mapping) else ():
            has[k] = has.get(k, 0) + 1
    return out


def rows_scored_by_all(rows: Iterable[Mapping]) -> tuple[list[Mapping], dict[tuple[str, str], int]]:
    """The rows of the (dataset, model) groups with a run in progress (a score key on only some
    of their rows) that carry every score key of their group, and (dataset, model) -> the
    group's row count. Complete groups are not returned: the main tables cover them.

    Evaluating every method on these rows compares them on the same questions, the subset a
    method still running has reached (``drop_partial_scores`` leaves that method out instead).
    """
    rows = list(rows)
    kept: list[Mapping] = []
    totals: dict[tuple[str, str], int] = {}
    for key, (idx, has) in _score_counts(rows).items():
        if all(n == len(idx) for n in has.values()):
            continue
        every = set(has)
        kept += [rows[i] for i in idx if isinstance(sc := rows[i].get("scores"), Mapping)
                 and every <= sc.keys()]
        totals[key] = len(idx)
    return kept, totals


def _scores_phrase(keys: list[str]) -> str:
    """"score 'a'" or "scores 'a' and 'b'" (one note for scores left out for one reason)."""
    names = [repr(k) for k in keys]
    if len(names) == 1:
        return f"score {names[0]}"
    return f"scores {', '.join(names[:-1])} and {names[-1]}"


def usable_rows(
    rows: Iterable[Mapping], min_per_class: int = 2
) -> tuple[list[Mapping], list[str]]:
    """(rows of the (dataset, model) groups with at least ``min_per_class`` correct and
    incorrect judged answers, without scores that only part of a group has
    (``drop_partial_scores``); one line per thing left out saying why). For a report over runs
    still in progress, where a model may not have both classes or every method yet."""
    rows, why = drop_partial_scores(rows)
    groups = group_rows(rows)
    short = {k: (int(g.correct.sum()), int((g.correct == 0).sum())) for k, g in groups.items()
             if g.n_per_class < min_per_class}
    kept = [r for r in rows if (str(r["dataset"]), str(r["model"])) not in short]
    why += [f"model {m!r} on {ds!r} left out: {n1} correct and {n0} incorrect judged answers "
            f"(need {min_per_class} of each)" for (ds, m), (n1, n0) in short.items()]
    return kept, why + partial_model_notes(kept)


def partial_model_notes(rows: Iterable[Mapping]) -> list[str]:
    """One line per (dataset, score) that only some of the dataset's models have: such a
    method gets per-model results but no mean over models (``method_by_dataset``)."""
    have: dict[str, dict[str, set[str]]] = {}
    for r in rows:
        ds, model = str(r["dataset"]), str(r["model"])
        per = have.setdefault(ds, {})
        per.setdefault(model, set())
        sc = r.get("scores")
        per[model].update(sc if isinstance(sc, Mapping) else ())
    why = []
    for ds, per in have.items():
        by_models: dict[tuple[str, ...], list[str]] = {}
        for k in sorted(set.union(*per.values())):
            with_k = tuple(sorted(m for m, ks in per.items() if k in ks))
            if len(with_k) < len(per):
                by_models.setdefault(with_k, []).append(k)
        why += [f"{_scores_phrase(ks)} on {ds!r} only for model(s) {list(ms)} of {len(per)}: "
                "per-model results only, no mean over models" for ms, ks in by_models.items()]
    return why


def feature_matrix(
    group: QAGroup, names: Collection[str], log_features: Collection[str] = LOG_FEATURES
) -> np.ndarray:
    """(n, len(names)) features of ``group``; NaN where a score is missing.

    Columns named in ``log_features`` become ``log(x)``, or ``log(x + m)`` with ``m`` the
    smallest positive value of that column when it holds zeros. Negative values raise.
    """
    cols = []
    for name in names:
        x = group.score(name).copy()
        if name in log_features:
            x = log_transform(x, f"score {name!r} of model {group.model!r} on {group.dataset!r}")
        cols.append(x)
    return np.stack(cols, axis=1)


def log_transform(x: np.ndarray, what: str = "values") -> np.ndarray:
    """Elementwise log of a non-negative (n,) array, NaN kept; zeros shifted (see above)."""
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x)
    if (x[ok] < 0).any():
        raise DataError(
            f"{what} has negative values, so it cannot be log-transformed; check the scores "
            "or pass log_epistemic=False"
        )
    with np.errstate(invalid="ignore"):
        return np.log(x + log_shift(x))


def log_shift(x: np.ndarray) -> float:
    """The shift :func:`log_transform` adds before the log: 0, or the smallest positive finite
    value of (n,) ``x`` when it holds zeros (1 when all are zero). Keep it to transform new
    values like the fitted ones (``isouq.calibration``)."""
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x)
    if not (ok & (x == 0)).any():
        return 0.0
    pos = x[ok & (x > 0)]
    return float(pos.min()) if pos.size else 1.0  # all zero: constant either way


def group_rng(seed: int, *names: str) -> np.random.Generator:
    """A generator that depends only on ``seed`` and the given names (order-independent runs)."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode("utf-8")) for n in names)])


def datasets(groups: Mapping[tuple[str, str], QAGroup]) -> list[str]:
    """Datasets in first-seen order."""
    return list(dict.fromkeys(ds for ds, _ in groups))


def models_of(groups: Mapping[tuple[str, str], QAGroup], dataset: str) -> list[str]:
    """Models that have rows on ``dataset``, in first-seen order."""
    return [m for ds, m in groups if ds == dataset]


def to_float(x) -> float | None:
    """A JSON-friendly float: None for NaN/inf/None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
