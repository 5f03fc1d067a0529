"""How good are the correctness labels? Hand (gold) labels against the judge's and the lexical
ones, and the study's AUROCs recomputed with each on the same rows.

A gold row (``results/qa/gold/*.gold.jsonl``, written by a person)::

    {"key": str, "dataset": str, "model": str, "gold_correct": bool, "note": str, ...}

It labels the QA row with the same (dataset, model, key). Tables (lists of dict rows):

* :func:`label_agreement`: per (dataset, model) and label source (``judge`` = the row's
  ``correct``, ``lexical`` = ``lexical_correct``): positives, true/false positives, accuracy and
  Cohen's κ against the gold labels;
* :func:`auroc_by_labels`: the study's per-model AUROC (logistic regression on each method's
  features, out-of-bag bootstrap) on the gold-labelled rows, once with gold and once with judge
  labels;
* :func:`raw_auroc_by_labels`: AUROC of each raw score used as the uncertainty (no fitting), so a
  reader sees the direction: below 0.5 the score ranks correct answers as MORE uncertain, which
  the regression of the main study silently flips.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..errors import DataError, InputError
from .auroc import auroc, method_runs, model_by_method
from .rows import group_rows, to_float, usable_rows

GOLD_FIELDS: tuple[str, ...] = ("key", "dataset", "model", "gold_correct")
#: label sources compared with the gold labels: name -> field of a QA row
SOURCES: dict[str, str] = {"judge": "correct", "lexical": "lexical_correct"}
#: raw scores and their sign as uncertainty (+1: higher = more uncertain)
RAW_UNCERTAINTY: dict[str, int] = {"epistemic": 1, "aleatoric": 1, "mean_prob": -1,
                                   "naive_entropy": 1, "semantic_entropy": 1, "p_true": -1}

Key = tuple[str, str, str]


def is_gold_row(row: Mapping) -> bool:
    """Whether ``row`` is a hand label (has every field of :data:`GOLD_FIELDS`)."""
    return all(f in row for f in GOLD_FIELDS)


def gold_index(gold_rows: Iterable[Mapping]) -> dict[Key, bool]:
    """(dataset, model, key) -> gold label. DataError on a row missing a field or two rows that
    label the same answer differently."""
    out: dict[Key, bool] = {}
    for i, g in enumerate(gold_rows):
        if not is_gold_row(g):
            raise DataError(f"gold row {i} lacks one of {list(GOLD_FIELDS)}: {dict(g)!r:.200}")
        k = (str(g["dataset"]), str(g["model"]), str(g["key"]))
        y = bool(g["gold_correct"])
        if out.get(k, y) != y:
            raise DataError(f"gold labels disagree for {k}: fix one of the two rows")
        out[k] = y
    return out


def _key(row: Mapping) -> Key:
    return (str(row["dataset"]), str(row["model"]), str(row["key"]))


def gold_matched(rows: Iterable[Mapping], gold_rows: Iterable[Mapping]) -> list[tuple[dict, bool]]:
    """(QA row, gold label) for every QA row that has a hand label, in row order."""
    gold = gold_index(gold_rows)
    return [(dict(r), gold[_key(r)]) for r in rows if _key(r) in gold]


def cohen_kappa(a: Sequence, b: Sequence) -> float:
    """Cohen's κ between two label lists (sklearn ``cohen_kappa_score``; NaN when undefined,
    e.g. both raters give one constant label). InputError on lists of unequal or zero length."""
    import warnings

    from sklearn.metrics import cohen_kappa_score

    if len(a) != len(b) or len(a) == 0:
        raise InputError(f"need two equally long, non-empty label lists; got {len(a)} and {len(b)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(cohen_kappa_score([int(x) for x in a], [int(x) for x in b]))


def label_agreement(rows: Iterable[Mapping], gold_rows: Iterable[Mapping]) -> list[dict]:
    """One row per (dataset, model, label source) with a hand-labelled QA row: n, gold correct,
    positives, true/false positives, accuracy and κ of the source against the gold labels."""
    matched = gold_matched(rows, gold_rows)
    groups: dict[tuple[str, str], list[tuple[dict, bool]]] = {}
    for r, y in matched:
        groups.setdefault((str(r["dataset"]), str(r["model"])), []).append((r, y))
    table = []
    for (ds, model), pairs in groups.items():
        for source, field in SOURCES.items():
            have = [(bool(r[field]), y) for r, y in pairs if r.get(field) is not None]
            if not have:
                continue
            pred, gold = [p for p, _ in have], [y for _, y in have]
            table.append({
                "dataset": ds, "model": model, "labels": source, "n": len(have),
                "gold correct": sum(gold), "positive": sum(pred),
                "true positive": sum(p and y for p, y in have),
                "false positive": sum(p and not y for p, y in have),
                "accuracy": sum(p == y for p, y in have) / len(have),
                "kappa": to_float(cohen_kappa(pred, gold))})
    return table


def with_gold_labels(rows: Iterable[Mapping], gold_rows: Iterable[Mapping]) -> list[dict]:
    """The hand-labelled QA rows with ``correct`` set to the gold label (label_source "gold")."""
    return [{**r, "correct": int(y), "label_source": "gold"}
            for r, y in gold_matched(rows, gold_rows)]


def _labelled(rows: Iterable[Mapping], gold_rows: Sequence[Mapping]) -> dict[str, list[dict]]:
    """The same hand-labelled rows under each labelling: {"gold": ..., "judge": ...}."""
    matched = gold_matched(rows, gold_rows)
    return {"gold": [{**r, "correct": int(y)} for r, y in matched],
            "judge": [r for r, _ in matched if r.get("correct") is not None]}


def auroc_by_labels(
    rows: Iterable[Mapping],
    gold_rows: Sequence[Mapping],
    *,
    n_bootstrap: int = 300,
    seed: int = 0,
    log_epistemic: bool = True,
) -> list[dict]:
    """Per (dataset, model) with hand labels, the study's per-model AUROC of every method with
    gold labels and with judge labels on the same rows (column ``labels``). A (dataset, model)
    whose labels have fewer than 2 of a class under one labelling is left out of that one."""
    table = []
    for labels, rs in _labelled(rows, gold_rows).items():
        rs = usable_rows(rs)[0] if rs else []
        if not rs:
            continue
        groups = group_rows(rs)
        runs = method_runs(groups, n_bootstrap=n_bootstrap, seed=seed,
                           log_epistemic=log_epistemic)
        for row in model_by_method(runs, groups, "auroc"):
            g = groups[(row["dataset"], row["model"])]
            table.append({"dataset": row["dataset"], "model": row["model"], "labels": labels,
                          "n": g.n, "correct": int(g.correct.sum()),
                          **{k: v for k, v in row.items() if k not in ("dataset", "model")}})
    return table


def raw_auroc_by_labels(rows: Iterable[Mapping], gold_rows: Sequence[Mapping]) -> list[dict]:
    """Per (dataset, model, labels): AUROC of each raw score as the uncertainty (correct answers
    should score lower; 0.5 is chance, below 0.5 the score points the wrong way)."""
    table = []
    for labels, rs in _labelled(rows, gold_rows).items():
        by: dict[tuple[str, str], list[dict]] = {}
        for r in rs:
            by.setdefault((str(r["dataset"]), str(r["model"])), []).append(r)
        for (ds, model), grp in by.items():
            y = np.array([int(r["correct"]) for r in grp])
            row: dict = {"dataset": ds, "model": model, "labels": labels, "n": len(grp),
                         "correct": int(y.sum())}
            for name, sign in RAW_UNCERTAINTY.items():
                s = np.array([(r.get("scores") or {}).get(name) for r in grp], dtype=float)
                ok = np.isfinite(s)
                # AUROC of "correct" on the certainty −sign·s, i.e. of the uncertainty ranking
                row[name] = to_float(auroc(y[ok], -sign * s[ok])) if ok.sum() > 1 else None
            table.append(row)
    return table


def label_tables(
    rows: Sequence[Mapping],
    gold_rows: Sequence[Mapping],
    *,
    n_bootstrap: int = 300,
    seed: int = 0,
    log_epistemic: bool = True,
) -> dict[str, list[dict]]:
    """The three label-quality tables by name (empty lists when no QA row has a hand label)."""
    return {
        "label_agreement": label_agreement(rows, gold_rows),
        "auroc_by_labels": auroc_by_labels(rows, gold_rows, n_bootstrap=n_bootstrap, seed=seed,
                                           log_epistemic=log_epistemic),
        "raw_auroc_by_labels": raw_auroc_by_labels(rows, gold_rows),
    }
