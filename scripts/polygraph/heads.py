"""The learned P(correct) heads on the LM-Polygraph benchmark's answers, cross-fitted, and
their transfer between datasets; kept beside the benchmark's results for ``isouq report``.

    .venv/bin/python scripts/polygraph/heads.py [--models smollm2 ...] [--seed 0]

For each model × dataset with kept results (``results/polygraph/polygraph__*.json``) and
features (``results/polygraph/features/``, ``scripts/polygraph/features.py``), and each of
LM-Polygraph's quality metrics there, every head of ``isouq.study.analysis.learned_heads.HEADS``
gives each answer an uncertainty 1 − P(correct):

- cross-fitted: on the folds of the features' ``.density.json`` (those of LM-Polygraph's
  train-split estimators), the head of fold k fitted on the other folds;
- transferred: fitted on every answer of the model's other dataset.

Written: ``results/polygraph/heads/<dataset>__<model>.json`` with, in the kept question order,
each head's uncertainty per metric, the maps chosen, the control (``learned_heads.CONTROL``:
MSP's own map cross-fitted, what cross-fitting costs), the cross-fitted values of LM-Polygraph's
own train-split estimators (MD, RMD, RDE, PPL-MD) copied from the ``.density.json``, and per
metric the supervised anchor (``learned_heads.PROBE``, a probe on the answer's hidden state)
copied from the ``.probe.json``; and beside the heads, the stacked head
(``learned_heads.STACKED``: isouq's scores, MSP's quantity and the probe's logit, what
``isouq calibrate --features ... hidden`` fits), cross-fitted on the probe's per-fold logits
there, and transferred with the other dataset's probe (the features'
``.probe-from-<other>.json``: the stack fitted on the other dataset's answers and their probe
logits out of fold, applied here with that probe's logits). An answer without features
(its tokens could not be rebuilt) gets null. Runs in the main venv.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path("results/polygraph")
#: the benchmark's datasets: a head is transferred from each other one (when its files are kept)
DATASETS = ("triviaqa", "truthfulqa")


def rows_in_order(kept: dict, features: Path) -> list[dict]:
    """The features rows in the kept question order ({} for a question without features)."""
    from isouq.runio import read_jsonl

    by_key = {r["key"]: r for r in read_jsonl(features) if "error" not in r}
    return [by_key.get(q["key"], {}) for q in kept["questions"]]


def folds_of(kept: dict, density: dict | None, k: int, seed: int) -> np.ndarray:
    """The folds of the train-split estimators (or, without them, the same seeded rule)."""
    keys = [q["key"] for q in kept["questions"]]
    if density is not None:
        return np.array([density["folds"][key] for key in keys])
    import importlib.util

    spec = importlib.util.spec_from_file_location("density", Path(__file__).with_name(
        "density.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.assign_folds(len(keys), k, seed)


def _list(x: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in x]


def stacked(rows: list[dict], y: np.ndarray, folds: np.ndarray, probe: dict, metric: str,
            seed: int) -> tuple[np.ndarray, list[str]]:
    """(n,) the stacked head's cross-fitted uncertainty (``learned_heads.STACKED``, NaN for an
    answer without features or hidden states) and its choice per fold, from the probe file's
    per-fold logits; refused when the probe was cross-fitted on other folds."""
    from isouq.errors import DataError
    from isouq.study.analysis.learned_heads import STACKED, stacked_cross_fitted

    if probe.get("folds") != [int(f) for f in folds]:
        raise DataError("the probe file was cross-fitted on other folds than the heads'; run "
                        "scripts/polygraph/features.py again")
    logits = np.array([[np.nan if v is None else v for v in row]
                       for row in probe["metrics"][metric]["fold_logits"]], dtype=float)
    ok = np.array([bool(r) for r in rows]) & ~np.isnan(logits).all(axis=0)
    u = np.full(len(rows), np.nan)
    mine = [rows[i] for i in np.flatnonzero(ok)]
    u[ok], chosen = stacked_cross_fitted(STACKED, mine, y[ok], folds[ok], logits[:, ok],
                                         seed=seed)
    return u, chosen


def stacked_moved(rows: list[dict], o_rows: list[dict], oy: np.ndarray, moved: dict,
                  metric: str, seed: int) -> tuple[np.ndarray, str]:
    """(n,) uncertainty of the stacked head fitted on every answer of the model's other
    dataset (``o_rows``, labels ``oy``) and its probe's logits there out of fold, applied to
    ``rows`` with the logits of that probe refitted on all of them (the features'
    ``.probe-from-<other>.json``, ``learned_heads.probe_transferred``); NaN for an answer
    without features."""
    from isouq.study.analysis.learned_heads import STACKED, stacked_transferred

    def arr(v):
        return np.array([np.nan if x is None else x for x in v], dtype=float)

    got = moved["metrics"][metric]
    lt, lo = arr(got["train_logits"]), arr(got["logits"])
    o_have = np.array([bool(r) for r in o_rows])
    have = np.array([bool(r) for r in rows])
    u = np.full(len(rows), np.nan)
    u[have], how = stacked_transferred(STACKED, [r for r in o_rows if r], oy[o_have],
                                       lt[o_have], [r for r in rows if r], lo[have], seed=seed)
    return u, how


def labels_of(kept: dict, metric: str) -> np.ndarray:
    """(n,) the labels of a kept run's answers for ``metric`` (``learned_heads.labels_for``)."""
    from isouq.study.analysis.learned_heads import labels_for

    q = np.array([r["quality"].get(metric, np.nan) for r in kept["questions"]], dtype=float)
    return labels_for(q, metric)


def moved_probe(dataset: str, model: str, kept: dict, other: str, o_kept: dict) -> dict | None:
    """The features' probe of ``other`` applied to ``dataset`` (None when there is none);
    DataError when it is of other answers than the two kept runs."""
    from isouq.errors import DataError
    from isouq.study.report.polygraph import load_matching

    rerun = "scripts/polygraph/features.py"
    path = RESULTS / "features" / f"{dataset}__{model}.probe-from-{other}.json"
    got = load_matching(path, kept, rerun)
    if got is not None and got.get("train_keys") != [q["key"] for q in o_kept["questions"]]:
        raise DataError(f"{path} was trained on other answers of {other} than its kept "
                        f"results; run {rerun} again")
    return got


def heads_doc(model: str, datasets: list[str], dataset: str, seed: int, k: int) -> dict | None:
    """The heads file of one model × dataset (None when its results or features are missing)."""
    from isouq.study.analysis.learned_heads import (
        CONTROL,
        HEADS,
        LABEL_THRESHOLD,
        PROBE,
        STACKED,
        cross_fitted,
        transferred,
    )
    from isouq.study.report.polygraph import load_matching

    def load(ds):
        res = RESULTS / f"polygraph__{ds}__{model}.json"
        feats = RESULTS / "features" / f"{ds}__{model}.jsonl"
        if not res.exists() or not feats.exists():
            return None
        kept = json.loads(res.read_text(encoding="utf-8"))
        dens = feats.with_name(f"{ds}__{model}.density.json")
        d = json.loads(dens.read_text(encoding="utf-8")) if dens.exists() else None
        return kept, rows_in_order(kept, feats), d

    mine = load(dataset)
    if mine is None:
        return None
    kept, rows, dens = mine
    probe = load_matching(RESULTS / "features" / f"{dataset}__{model}.probe.json", kept,
                          "scripts/polygraph/features.py")
    have = np.array([bool(r) for r in rows])
    folds = folds_of(kept, dens, k, seed)
    others = {ds: load(ds) for ds in datasets if ds != dataset}
    moved_probes = {ds: moved_probe(dataset, model, kept, ds, other[0])
                    for ds, other in others.items() if other is not None}
    out = {"kind": "isouq-polygraph-heads", "dataset": dataset, "model": model,
           "label_threshold": LABEL_THRESHOLD, "seed": seed,
           "folds": {"k": int(len(np.unique(folds))), "from": "density" if dens else "seed"},
           "keys": [q["key"] for q in kept["questions"]],
           "rows_with_features": int(have.sum()), "metrics": {},
           "heads": {h.name: h.help for h in HEADS.values()},
           "density": ({e: [v.get(key) for key in (q["key"] for q in kept["questions"])]
                        for e, v in dens["estimators"].items()} if dens else {})}
    for metric in kept["quality_metrics"]:
        y = np.where(have, labels_of(kept, metric), np.nan)
        sub = [r for r in rows if r]
        got = {"cross_fitted": {}, "transfer": {}, "chosen": {}, "control": {}, "anchors": {}}
        if probe is not None and metric in probe["metrics"]:
            got["anchors"][PROBE] = probe["metrics"][metric]["uncertainty"]
            got["chosen"][PROBE] = probe["metrics"][metric]["chosen"]
            u, got["chosen"][STACKED.name] = stacked(rows, y, folds, probe, metric, seed)
            got["cross_fitted"][STACKED.name] = _list(u)
        u = np.full(len(rows), np.nan)
        u[have], _ = cross_fitted(CONTROL, sub, y[have], folds[have], seed=seed)
        got["control"][CONTROL.name] = _list(u)
        for h in HEADS.values():
            t0 = time.perf_counter()
            u = np.full(len(rows), np.nan)
            u[have], chosen = cross_fitted(h, sub, y[have], folds[have], seed=seed)
            got["cross_fitted"][h.name] = _list(u)
            got["chosen"][h.name] = chosen
            for ds, other in others.items():
                if other is None:
                    continue
                o_kept, o_rows, _ = other
                o_have = np.array([bool(r) for r in o_rows])
                t = np.full(len(rows), np.nan)
                t[have], how = transferred(h, [r for r in o_rows if r],
                                           labels_of(o_kept, metric)[o_have], sub, seed=seed)
                got["transfer"][f"{h.name} (trained on {ds})"] = _list(t)
                got["chosen"][f"{h.name} (trained on {ds})"] = how
            print(f"{dataset} × {model}, {metric}: {h.name} in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        for ds, other in others.items():
            moved = moved_probes.get(ds)
            if other is None or moved is None or metric not in moved["metrics"]:
                continue
            o_kept, o_rows, _ = other
            t, how = stacked_moved(rows, o_rows, labels_of(o_kept, metric), moved, metric,
                                   seed)
            got["transfer"][f"{STACKED.name} (trained on {ds})"] = _list(t)
            got["chosen"][f"{STACKED.name} (trained on {ds})"] = how
        out["metrics"][metric] = {"labels": (f"{int(np.nansum(y))} correct of "
                                             f"{int(np.sum(~np.isnan(y)))}" if metric == "Accuracy"
                                             else f"fractional ({metric}), mean "
                                                  f"{np.nanmean(y):.3f} over "
                                                  f"{int(np.sum(~np.isnan(y)))}"), **got}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS),
                    help="the heads files to write (each also holds the heads transferred "
                         "from every other dataset with kept results and features)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5, help="without a .density.json")
    ap.add_argument("--out", default=str(RESULTS / "heads"))
    a = ap.parse_args(argv)
    from isouq.runio import dumps

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for model in a.models:
        for ds in a.datasets:
            doc = heads_doc(model, list(DATASETS), ds, a.seed, a.folds)
            if doc is None:
                print(f"{ds} × {model}: no kept results or features, skipped")
                continue
            path = out / f"{ds}__{model}.json"
            path.write_text(dumps(doc) + "\n", encoding="utf-8")
            print(f"{path}: {doc['rows_with_features']} answers with features")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
