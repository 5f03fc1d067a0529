"""``isouq calibrate``: labelled rows in, a calibration and its cross-fitted evaluation out.

``run_calibration(ROWS, OUT)`` reads the rows (files or folders of ``isouq qa run`` /
``isouq score`` JSONL), their labels (the judge's, the lexical ones, or hand labels from the
``gold/`` folder beside the rows) and the model's provenance (the QA ``run.json`` or the score
``.meta.json`` beside each file: the weight files' SHA-256), fits a
:class:`isouq.calibration.Calibrator` and writes into ``OUT``:

* ``calibration.json``: the fitted map (and threshold, with ``max_risk``);
* ``crossfit.jsonl``: one row per answer: key, model, dataset, out-of-fold ``p_correct`` of the
  whole procedure (nested: the map is selected and fitted without the row's fold), correct;
* ``reliability.png`` and ``risk_coverage.png`` of the cross-fitted P(correct);
* ``results.json`` / ``tables.md`` (``runio.write_results``): ECE, Brier, log-loss, AUROC and
  AURAC of the cross-fitted P(correct) beside a constant base-rate predictor and each single
  score, the selection table, the risk control and the reliability bins.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .calibration import (
    CalibrationError,
    Calibrator,
    check_complete,
    check_labels,
    cross_fit,
    labels_of,
    one_model,
    score_columns,
    weight_hashes,
)
from .evaluation.features import HIDDEN, check_features, feature_sets, hidden_states, values
from .evaluation.probability import probability_metrics, reliability_bins
from .evaluation.rejection import rejection_curve
from .runio import dumps, write_results

GOLD_SUFFIX = ".gold.jsonl"


def _provenance(f: Path) -> dict:
    """The model dict recorded beside a rows file: ``<stem>.run.json`` (QA runs) or
    ``<file>.meta.json`` (``isouq score``); {} when neither exists."""
    stem = f.name.removesuffix(".gz").removesuffix(".jsonl")
    for side in (f.with_name(stem + ".run.json"), Path(str(f) + ".meta.json")):
        if side.is_file():
            try:
                doc = json.loads(side.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise CalibrationError(f"cannot read {side} ({e}); restore or delete it") from e
            m = doc.get("model")
            return {"path": str(side), **(m if isinstance(m, dict) else {"name": m})}
    return {}


def read_inputs(paths: Sequence[str | os.PathLike], *, model: str | None = None,
                gold: Sequence[str | os.PathLike] = ()) -> dict:
    """Rows, hand labels and provenance from ``paths`` (files, or folders whose ``*.jsonl``
    files are read; not recursive). Hand labels: the ``gold`` files/folders given, else every
    ``gold/*.gold.jsonl`` beside the rows files.

    Returns:
        {"rows": the model's rows, "model": its name, "files": {path: SHA-256} of its model
        files, "sources": [{"path", "sha256", "rows"}], "gold_rows": [...], "gold_files": [...]}.
    """
    from .evaluation.labels import is_gold_row
    from .models.files import sha256_file
    from .study.report.inputs import is_qa_file, read_rows

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and is_qa_file(f)
                            and not f.name.endswith(GOLD_SUFFIX))
        elif p.is_file():
            files.append(p)
        else:
            raise CalibrationError(f"{p} does not exist; pass files or folders of labelled "
                                   "rows (e.g. results/qa/qa_truthfulqa__smollm2.jsonl)")
    if not files:
        raise CalibrationError(f"no .jsonl rows in {', '.join(map(str, paths))}; run "
                               "`isouq qa run` or pass the rows files")
    per_file: list[tuple[Path, list[dict], dict]] = []
    gold_files = [Path(g) for g in gold]
    for f in files:
        rows = read_rows(f)
        if rows and all(is_gold_row(r) for r in rows):
            gold_files.append(f)
            continue
        prov = _provenance(f)
        if prov.get("name"):
            rows = [r if r.get("model") is not None else {**r, "model": prov["name"]}
                    for r in rows]
        per_file.append((f, rows, prov))
    if not gold:
        for d in dict.fromkeys(f.parent / "gold" for f, _, _ in per_file):
            if d.is_dir():
                gold_files += sorted(d.glob("*" + GOLD_SUFFIX))
    all_rows = [r for _, rows, _ in per_file for r in rows]
    if not all_rows:
        raise CalibrationError(f"{', '.join(map(str, files))}: no rows")
    name = one_model(all_rows, model)
    rows, sources, hashes = [], [], {}
    for f, rs, prov in per_file:
        mine = [r for r in rs if r.get("model") in (None, name)]
        if not mine:
            continue
        rows += mine
        w = weight_hashes(prov.get("files"))
        if w:
            hashes[str(f)] = w
        sources.append({"path": str(f), "sha256": sha256_file(f), "rows": len(mine),
                        **({"provenance": prov["path"]} if prov else {})})
    if len({json.dumps(w, sort_keys=True) for w in hashes.values()}) > 1:
        raise CalibrationError(
            f"the rows of model {name!r} come from different weights ("
            + "; ".join(f"{k}: {', '.join(v[:12] for v in w.values())}" for k, w in hashes.items())
            + "): calibrate each on its own")
    gold_rows = [r for g in gold_files for r in _gold_rows(g)]
    return {"rows": rows, "model": name,
            "files": next(iter(hashes.values()), {}), "sources": sources,
            "gold_rows": gold_rows, "gold_files": [str(g) for g in gold_files]}


def _gold_rows(path: Path) -> list[dict]:
    from .evaluation.labels import is_gold_row
    from .runio import read_jsonl

    if path.is_dir():
        return [r for f in sorted(path.glob("*" + GOLD_SUFFIX)) for r in _gold_rows(f)]
    rows = read_jsonl(path, missing_ok=False)
    if not all(is_gold_row(r) for r in rows):
        raise CalibrationError(f"{path} is not a file of hand labels (rows need key, dataset, "
                               "model, gold_correct; see `isouq qa label`)")
    return rows


def run_calibration(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    labels: str = "judge",
    max_risk: float | None = None,
    delta: float = 0.1,
    model: str | None = None,
    gold: Sequence[str | os.PathLike] = (),
    seed: int = 0,
    features: Sequence[str] | None = None,
) -> Path:
    """Fit, cross-fit, evaluate and write a calibration (see the module docstring).

    Args:
        paths: rows files or folders.
        out: output folder.
        labels: ``hand``, ``judge`` or ``lexical``.
        max_risk, delta: α and δ of the withholding threshold (none when ``max_risk`` is None).
        model: the model to calibrate (needed when the rows hold several or name none).
        gold: hand-label files or folders (default: ``gold/`` beside the rows).
        seed: folds and split.
        features: what the map may read (``evaluation.features.FEATURES``, e.g.
            ``["mean_prob", "seq_logprob", "epistemic", "aleatoric", "blocks"]``); None: the
            scores' default feature sets.

    Returns:
        The path of ``out/results.json``.
    """
    started = time.time()
    if features is not None:
        features = check_features(features)
    found = read_inputs(paths, model=model, gold=gold)
    name = found["model"]
    rows, y = labels_of(found["rows"], labels, found["gold_rows"])
    states = None
    if features is None:  # the rows' columns, checked before anything is fitted
        sets, cols = None, score_columns(rows)
    else:
        sets = feature_sets(features, rows)
        cols = values(rows, dict.fromkeys(c for f in sets.values() for c in f))
        if HIDDEN in features:
            states = hidden_states(rows)
    check_complete(cols, rows)
    check_labels(y, f"model {name!r}")
    cal = Calibrator.fit(found["rows"], labels=labels, gold_rows=found["gold_rows"], model=name,
                         model_files=found["files"], sources=found["sources"],
                         max_risk=max_risk, delta=delta, seed=seed, features=features)
    preds, fold, chosen = cross_fit(cols, y, seed=seed, sets=sets, states=states)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cal.save(out / "calibration.json")
    _write_crossfit(out / "crossfit.jsonl", rows, name, preds["calibrated"], y, fold)
    metrics = [{"predictor": _label(k, cal), **probability_metrics(p, y)}
               for k, p in preds.items()]
    rc = cal.doc.get("risk_control")
    figures = [reliability_figure(preds, y, out / "reliability.png", title=_title(cal)),
               risk_coverage_figure(preds, y, out / "risk_coverage.png", risk=rc,
                                    title=_title(cal))]
    lab = cal.doc["labels"]
    tables = {
        "metrics": metrics,
        "selection": cal.doc["selection"],
        "folds": [{"fold": i, "selected": c} for i, c in enumerate(chosen)],
        "reliability": reliability_bins(preds["calibrated"], y),
    }
    if rc is not None:
        tables["risk_control"] = [{k: v for k, v in rc.items() if k != "grid"}
                                  | (cal.doc.get("split") or {})]
    return write_results(
        out, "calibration", seed=seed, started=started,
        settings={"rows": [str(p) for p in paths], "labels": labels, "model": name,
                  "max_risk": max_risk, "delta": delta if max_risk is not None else None,
                  "gold": found["gold_files"] if labels == "hand" else [],
                  "features": None if features is None else list(features)},
        tables=tables, figures=[f.name for f in figures],
        extra={"model": name, "labels": labels,
               "answers": f"{lab['n']} answers, {lab['correct']} correct",
               "datasets": ", ".join(cal.doc.get("datasets") or []),
               "selected": f"{cal.map.kind} on {cal.map.name}",
               "calibration": "calibration.json", "crossfit": "crossfit.jsonl",
               "guarantee": _guarantee(rc)})


def _label(key: str, cal: Calibrator) -> str:
    if key == "calibrated":
        return "calibrated (selected per fold)"
    if key == "base rate":
        return "base rate (constant)"
    return f"{key} alone (Platt)"


def _title(cal: Calibrator) -> str:
    lab = cal.doc["labels"]
    return (f"{cal.model} on {', '.join(cal.doc.get('datasets') or ['?'])}, {lab['source']} "
            f"labels (n = {lab['n']})")


def _guarantee(rc: Mapping | None) -> str:
    if rc is None:
        return "no threshold (run with --max-risk A --delta D)"
    if rc["threshold"] is None:
        return (f"no threshold certifies an error rate ≤ {rc['alpha']:g} among kept answers "
                f"with probability ≥ {1 - rc['delta']:g} on these rows: withhold all")
    return (f"keep P(correct) ≥ {rc['threshold']:.3f}: error rate among kept ≤ {rc['alpha']:g} "
            f"with probability ≥ {1 - rc['delta']:g} (Learn then Test); coverage on the "
            f"{rc['n']} held-out rows {rc['coverage']:.2f}")


def _write_crossfit(path: Path, rows: Sequence[Mapping], model: str, p: np.ndarray,
                    y: np.ndarray, fold: np.ndarray) -> None:
    lines = [dumps({"key": r.get("key"), "model": model, "dataset": r.get("dataset"),
                    "p_correct": float(p[i]), "correct": bool(y[i]), "fold": int(fold[i])},
                   ensure_ascii=False) for i, r in enumerate(rows)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def evaluate(cal: Calibrator, rows: Sequence[Mapping], labels: str = "judge",
             gold_rows: Sequence[Mapping] | None = None) -> dict:
    """Metrics (:func:`probability_metrics`) of ``cal``'s P(correct) on other labelled rows of
    its model (e.g. another dataset: transfer), and the kept share and error rate among kept
    answers under its threshold when it has one."""
    rows = [r for r in rows if r.get("model") in (None, cal.model)]
    rows, y = labels_of(rows, labels, gold_rows)
    p = cal.predict(rows)
    if not np.isfinite(p).all():
        check_complete(values(rows, cal.map.features), rows)
    out = probability_metrics(p, y)
    w = cal.withheld(p)
    if w is not None:
        kept = ~w
        out["coverage"] = float(kept.mean())
        out["error_rate_kept"] = float(1 - y[kept].mean()) if kept.any() else None
    return out


def annotate_file(path: str | os.PathLike, cal: Calibrator) -> str:
    """Add ``p_correct`` (and ``withheld``) to every scored row of a JSONL file of
    ``isouq score`` (rewritten atomically; error rows are left as they are); return one line
    saying what was done."""
    from .runio import read_jsonl

    path = Path(path)
    rows = read_jsonl(path, missing_ok=False)
    scored = [r for r in rows if "error" not in r]
    cal.annotate(scored)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)
    line = f"p_correct added to {len(scored)} rows of {path} ({cal.describe()})"
    if cal.threshold is not None:
        n = sum(bool(r.get("withheld")) for r in scored)
        line += f"; {n} of {len(scored)} withheld"
    return line


def summary(results: str | os.PathLike) -> str:
    """A few lines about a calibration run: where its files are, the map selected, the
    cross-fitted metrics beside the base rate, and the guarantee."""
    results = Path(results)
    doc = json.loads(results.read_text(encoding="utf-8"))
    m = {r["predictor"]: r for r in doc["tables"]["metrics"]}
    cal, base = m["calibrated (selected per fold)"], m["base rate (constant)"]

    def fmt(r):
        auroc = "n/a" if r["auroc"] is None else f"{r['auroc']:.3f}"
        return (f"ECE {r['ece']:.3f}, Brier {r['brier']:.3f}, log-loss {r['log_loss']:.3f}, "
                f"AUROC {auroc}")

    return "\n".join([
        f"calibration of {doc['model']} ({doc['labels']} labels, {doc['answers']}) -> "
        f"{results.parent / 'calibration.json'}; map: {doc['selected']}",
        f"cross-fitted: {fmt(cal)}",
        f"base rate:    {fmt(base)}",
        f"withholding:  {doc['guarantee']}",
        f"tables and figures: {results} ({', '.join(doc['figures'])})",
    ])


# ---------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reliability_figure(preds: Mapping[str, np.ndarray], y: np.ndarray, path: Path, *,
                       title: str = "", n_bins: int = 10) -> Path:
    """Reliability diagram of the cross-fitted P(correct) (and of p̄ alone): share correct vs
    mean P(correct) per bin, marker area ∝ answers in the bin; a histogram below."""
    plt = _plt()
    fig, (ax, hx) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], color="black", lw=0.8, label="perfect calibration")
    for key, color, ls in (("calibrated", "#2a7ab9", "-"), ("p̄", "#d9622b", "--")):
        if key not in preds:
            continue
        bins = reliability_bins(preds[key], y, n_bins)
        x = [b["mean_p"] for b in bins]
        a = [b["accuracy"] for b in bins]
        s = [10 + 200 * b["n"] / len(y) for b in bins]
        lab = "calibrated (cross-fitted)" if key == "calibrated" else "p̄ alone (Platt)"
        ax.plot(x, a, color=color, ls=ls, lw=1)
        ax.scatter(x, a, s=s, color=color, label=lab, zorder=3)
    ax.axhline(float(np.mean(y)), color="grey", ls=":", lw=1, label="base rate")
    ax.set_ylabel("share correct")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    hx.hist(preds["calibrated"], bins=np.linspace(0, 1, n_bins + 1), color="#2a7ab9")
    hx.set_xlabel("P(correct)")
    hx.set_ylabel("answers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def risk_coverage_figure(preds: Mapping[str, np.ndarray], y: np.ndarray, path: Path, *,
                         risk: Mapping | None = None, title: str = "") -> Path:
    """Error rate among kept answers vs share kept, keeping the highest P(correct) first, for
    the cross-fitted calibration and each single score; with a risk control, α and the
    coverage Learn then Test reached on its held-out rows."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    n = len(y)
    cov = np.arange(1, n + 1) / n
    for key, p in preds.items():
        if key == "base rate":
            continue
        risk_curve = 1.0 - rejection_curve(1.0 - p, y)
        lw, ls = (2.0, "-") if key == "calibrated" else (1.0, "--")
        ax.plot(cov, risk_curve, lw=lw, ls=ls,
                label="calibrated (cross-fitted)" if key == "calibrated" else f"{key} alone")
    ax.axhline(1.0 - float(np.mean(y)), color="grey", ls=":", lw=1, label="keep all")
    if risk is not None:
        ax.axhline(risk["alpha"], color="black", lw=0.8,
                   label=f"α = {risk['alpha']:g} (δ = {risk['delta']:g})")
        if risk["threshold"] is not None:
            ax.scatter([risk["coverage"]], [risk["error_rate"] or 0.0], marker="*", s=120,
                       color="black", zorder=4, label="Learn then Test (held-out rows)")
    ax.set_xlabel("share of answers kept (highest P(correct) first)")
    ax.set_ylabel("error rate among kept")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["annotate_file", "evaluate", "summary", "read_inputs", "reliability_figure",
           "risk_coverage_figure", "run_calibration"]
