"""``isouq calibrate``: labelled rows in; a verdict, a calibration and its evaluation out.

``run_calibration(ROWS, OUT)`` reads the rows (files or folders of ``isouq qa run`` /
``isouq score`` JSONL), their labels (0/1 or a quality in [0, 1]: the judge's, the lexical
ones, any field the user names, or hand labels from the ``gold/`` folder beside the rows) and
the model's provenance (the rows' ``model``, the QA ``run.json`` or the score ``.meta.json``
beside each file: the weight files' SHA-256). It cross-fits every predictor of
``calibration_choice`` on the rows (MSP's map, MSP, p̄, the hidden-state probe, the
forward-only head and the isouq head; repeated over fold seeds), judges each against MSP's map
(``evaluation.verdict``), saves what the floor allows (``calibration_choice.decide``) as a
:class:`isouq.calibration.Calibrator` fitted on every row, and writes into ``OUT``:

* ``calibration.json``: the fitted map (and threshold, with ``max_risk``) and the verdict;
* ``crossfit.jsonl``: one row per answer: key, model, dataset, the saved choice's nested
  ``p_correct`` (its procedure fitted without the answer's fold; the first fold seed), correct;
* ``verdict.png`` (each predictor's Δ PRR against MSP's map, and the learning curve),
  ``reliability.png`` and ``risk_coverage.png``;
* ``results.json`` / ``tables.md`` (``runio.write_results``): the verdict, the decision with
  the saved procedure's nested PRR and AUROC, the learning curve, ECE, Brier, log-loss, AUROC
  and AURAC of each predictor beside a constant base rate, the selection table, the risk
  control and the reliability bins.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .answer_row import scores_of
from .calibration import (
    MAP_KINDS,
    CalibrationError,
    Calibrator,
    check_complete,
    check_labels,
    label_words,
    labels_of,
    one_model,
    weight_hashes,
)
from .calibration_choice import REPEATS
from .evaluation import verdict as V
from .evaluation.features import HIDDEN, check_features, hidden_states, values
from .evaluation.fractional import is_soft
from .evaluation.probability import probability_metrics, reliability_bins
from .evaluation.rejection import rejection_curve
from .evaluation.verdict import N_BOOTSTRAP, class_counts
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
    label_field: str | None = None,
    max_risk: float | None = None,
    delta: float = 0.1,
    model: str | None = None,
    gold: Sequence[str | os.PathLike] = (),
    seed: int = 0,
    features: Sequence[str] | None = None,
    repeats: int = REPEATS,
    n_bootstrap: int = N_BOOTSTRAP,
    curve: bool = True,
    progress: bool = False,
) -> Path:
    """Judge, choose, fit and write a calibration (see the module docstring).

    Args:
        paths: rows files or folders.
        out: output folder.
        labels: ``hand``, ``judge`` or ``lexical``.
        label_field: read the labels (0/1, or a quality in [0, 1]) from this field of the
            rows instead of ``correct``.
        max_risk, delta: α and δ of the withholding threshold (none when ``max_risk`` is None).
        model: the model to calibrate (needed when the rows hold several or name none).
        gold: hand-label files or folders (default: ``gold/`` beside the rows).
        seed: folds, split and bootstrap.
        features: what the isouq head may read (``evaluation.features.FEATURES``, e.g.
            ``["mean_prob", "seq_logprob", "epistemic", "aleatoric", "blocks"]``); None:
            every score the rows carry, and their block profile and hidden states when every
            row has them (``calibration_choice.default_features``).
        repeats: fold seeds of the repeated cross-fitting.
        n_bootstrap: resamples of the paired bootstrap.
        curve: also the learning curve (the nested AUROC at a quarter, half and all of the
            training answers).
        progress: show a progress bar.

    Returns:
        The path of ``out/results.json``.
    """
    from . import calibration_choice as C

    started = time.time()
    if repeats < 1 or n_bootstrap < 1000:
        raise CalibrationError(f"repeats = {repeats}, n_bootstrap = {n_bootstrap}: give at "
                               "least 1 fold seed and 1,000 resamples")
    found = read_inputs(paths, model=model, gold=gold)
    name = found["model"]
    rows, y = labels_of(found["rows"], labels, found["gold_rows"], field=label_field)
    features = check_features(features) if features is not None else \
        C.default_features(rows)
    has_msp = all(scores_of(r).get("seq_logprob") is not None for r in rows)
    preds = C.predictors(features, has_seq_logprob=has_msp)
    columns = dict.fromkeys(c for p in preds.values() if p.fitted
                            for s in C.feature_sets_of(p, rows).values() for c in s)
    cols = values(rows, [*columns, *(["seq_logprob"] if has_msp else [])])
    check_complete(cols, rows)
    states = hidden_states(rows) if HIDDEN in features else None
    check_labels(y, f"model {name!r}", per_class=2, min_rows=4)
    ref = C.reference(preds)
    short = C.shortfall(y)
    todo = {} if short else preds
    steps = (len(range(repeats)) + (3 if curve else 0)) * C.FOLDS if todo else 0
    bar = _bar(steps, progress, f"calibrate {name}")
    tick = bar.update if bar is not None else None
    oof, table, curve_rows = {}, [], []
    if todo:
        oof = C.cross_fitted(rows, cols, y, todo, seeds=range(repeats), states=states,
                             progress=tick)
        table = C.comparisons(oof, y, against=ref, n_bootstrap=n_bootstrap, seed=seed)
        if curve:
            curve_rows = C.learning_curve(
                rows, cols, y, {k: v for k, v in preds.items() if k in (ref, C.FORWARD, C.ISOUQ)},
                seed=seed, states=states, progress=tick)
    if bar is not None:
        bar.close()
    decision = C.decide(table, preds, y)
    saved = preds[decision.saved]
    nested = (oof[decision.saved] if decision.saved in oof else
              C.cross_fitted(rows, cols, y, {ref: preds[ref]}, seeds=(seed,))[ref])
    said = _verdict_doc(table, decision, nested, y, repeats, n_bootstrap)
    cal = Calibrator.fit(found["rows"], labels=labels, gold_rows=found["gold_rows"], model=name,
                         model_files=found["files"], sources=found["sources"],
                         max_risk=max_risk, delta=delta, seed=seed,
                         features=saved.features, kinds=MAP_KINDS if saved.head else ("platt",),
                         label_field=label_field, verdict=said)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cal.save(out / "calibration.json")
    first = {k: v[0] for k, v in oof.items()} or {decision.saved: nested[0]}
    chosen = first.get(decision.saved, nested[0])
    _write_crossfit(out / "crossfit.jsonl", rows, name, chosen, y)
    shown = {k: v for k, v in first.items() if np.isfinite(v).all() and k != C.MSP}
    metrics = [{"predictor": k, **probability_metrics(v, y)} for k, v in shown.items()]
    base = np.full(len(y), float(np.mean(y)))
    metrics.append({"predictor": "base rate (constant)", **probability_metrics(base, y)})
    rc = cal.doc.get("risk_control")
    title = _title(cal)
    figures = [reliability_figure({"saved": chosen, **shown}, y, out / "reliability.png",
                                  saved=decision.saved, title=title),
               risk_coverage_figure(shown, y, out / "risk_coverage.png", risk=rc, title=title,
                                    saved=decision.saved)]
    if table:
        figures.append(verdict_figure(table, curve_rows, out / "verdict.png", against=ref,
                                      title=title))
    tables = {
        **({"verdict": table} if table else {}),
        "decision": [{**decision.to_dict(), **said["nested"]}],
        **({"learning_curve": curve_rows} if curve_rows else {}),
        "metrics": metrics,
        "selection": cal.doc["selection"],
        "reliability": reliability_bins(chosen, y),
    }
    if rc is not None:
        tables["risk_control"] = [{k: v for k, v in rc.items() if k != "grid"}
                                  | (cal.doc.get("split") or {})]
    return write_results(
        out, "calibration", seed=seed, started=started,
        settings={"rows": [str(p) for p in paths], "labels": labels, "label_field": label_field,
                  "model": name, "max_risk": max_risk,
                  "delta": delta if max_risk is not None else None,
                  "gold": found["gold_files"] if labels == "hand" else [],
                  "features": list(features), "repeats": repeats, "folds": C.FOLDS,
                  "n_bootstrap": n_bootstrap},
        tables=tables, figures=[f.name for f in figures],
        extra={"model": name, "labels": labels,
               "answers": answers_said(y),
               "datasets": ", ".join(cal.doc.get("datasets") or []),
               "selected": f"{cal.map.kind} on {cal.map.name}",
               "saved": decision.saved, "reason": decision.reason,
               "needs_backward": cal.needs_backward,
               "gradient_seconds": gradient_seconds(rows),
               "calibration": "calibration.json", "crossfit": "crossfit.jsonl",
               "guarantee": _guarantee(rc)})


def gradient_seconds(rows: Sequence[Mapping]) -> float | None:
    """The median seconds per answer that ``isouq score`` spent on the rows with the backward
    pass (each row's ``seconds.gradient``: its share of its batch), or None when no row says.

    Args:
        rows: answer rows, as ``isouq score`` writes them.

    Returns:
        seconds per answer, forward and backward together; None without timings.
    """
    t = [r["seconds"]["gradient"] for r in rows
         if isinstance(r.get("seconds"), Mapping) and isinstance(r["seconds"].get("gradient"),
                                                                  (int, float))]
    return float(np.median(t)) if t else None


def answers_said(y: np.ndarray) -> str:
    """How many answers and how many correct, in words."""
    right, wrong = class_counts(y)
    soft = " (fractional labels: correct at ≥ 0.5)" if is_soft(y) else ""
    return f"{len(y)} answers, {right} correct{soft}"


def _verdict_doc(table: Sequence[Mapping], decision, nested: np.ndarray, y: np.ndarray,
                 repeats: int, n_bootstrap: int) -> dict:
    """What the calibration file keeps of the verdict: the comparisons, the choice and the
    saved procedure's own nested numbers (its values on answers it did not see)."""
    ok = np.isfinite(nested).all(axis=1)
    prr = [V.prr(r, y) for r in nested[ok]]
    auc = [V.auroc_at(r, y) for r in nested[ok]]
    return {"rule": "PRR of 1 − P(correct); paired bootstrap over answers and fold seeds; Holm "
                    "over the comparisons; the saved map is a head only when its procedure is "
                    "ahead of MSP's map",
            "repeats": repeats, "n_bootstrap": n_bootstrap, "comparisons": list(table),
            **decision.to_dict(),
            "nested": {"PRR": float(np.mean(prr)) if prr else None,
                       "AUROC": float(np.mean(auc)) if auc else None}}


def _bar(total: int, show: bool, what: str):
    if not show or not total:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="fold", leave=False)


def _title(cal: Calibrator) -> str:
    lab = cal.doc["labels"]
    on = ", ".join(cal.doc.get("datasets") or [])
    return f"{cal.model}{f' on {on}' if on else ''}, {cal.labels_said} (n = {lab['n']})"


def pad_to(text: str, width: int) -> str:
    """``text`` left-aligned to ``width`` columns (combining marks, as in p̄, take none)."""
    import unicodedata

    shown = sum(not unicodedata.combining(c) for c in text)
    return text + " " * max(0, width - shown)


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
                    y: np.ndarray) -> None:
    lines = [dumps({"key": r.get("key"), "model": model, "dataset": r.get("dataset"),
                    "p_correct": float(p[i]), "correct": y[i].item()}, ensure_ascii=False)
             for i, r in enumerate(rows)]
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


def signed(x: float | None) -> str:
    """``x`` with its sign and 3 decimals (a true minus), or ``n/a``."""
    return "n/a" if x is None or not np.isfinite(x) else f"{x:+.3f}".replace("-", "−")


def signed_ci(r: Mapping, metric: str = "") -> str:
    """A comparison row's Δ and its interval, ``+0.012 [−0.020, +0.042]``: PRR's, or with
    ``metric="_auroc"`` AUROC's (``delta_auroc``, ``ci_low_auroc``, ``ci_high_auroc``)."""
    return (f"{signed(r['delta' + metric])} [{signed(r['ci_low' + metric])}, "
            f"{signed(r['ci_high' + metric])}]")


def num(x: float | None) -> str:
    """``x`` with 3 decimals, or ``n/a``."""
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def verdict_lines(doc: Mapping) -> list[str]:
    """The verdict of a calibration run (its ``results.json``) as a short table: each predictor's
    nested PRR and AUROC, its difference to MSP's map with the interval, Holm's p and the
    verdict; then the isouq head against the forward-only head."""
    t = doc["tables"]
    rows = t.get("verdict") or []
    if not rows:
        return []
    ref = rows[0]["against"]
    first = rows[0]
    lines = [f"verdict (PRR of 1 − P(correct), each predictor cross-fitted on "
             f"{doc['settings']['repeats']} fold seeds; paired bootstrap, "
             f"{doc['settings']['n_bootstrap']} resamples; Holm over {first['family']} "
             f"comparisons):",
             f"  {'predictor':<20} {'PRR':>6} {'AUROC':>6}  {'Δ PRR vs ' + ref + ' [95% CI]':<34}"
             f" {'Holm p':>7}  verdict"]
    vs_ref = [r for r in rows if r["against"] == ref]
    base = next((m for m in t["metrics"] if m["predictor"] == ref), None)
    if vs_ref:
        lines.append(f"  {pad_to(ref, 20)} {num(vs_ref[0]['PRR'] - vs_ref[0]['delta']):>6} "
                     f"{num(base['auroc'] if base else None):>6}  (reference)")
    for r in vs_ref:
        ci = signed_ci(r)
        lines.append(f"  {pad_to(r['predictor'], 20)} {num(r['PRR']):>6} {num(r['AUROC']):>6}  "
                     f"{ci:<34} {num(r['p_holm']):>7}  {r['verdict'] or 'not rankable'}")
    for r in rows:
        if r["against"] != ref:
            lines.append(f"  {r['predictor']} vs {r['against']}: Δ PRR {signed_ci(r)}, Holm p "
                         f"{num(r['p_holm'])}: {r['verdict'] or 'not rankable'}")
    return lines


def summary(results: str | os.PathLike) -> str:
    """A few lines about a calibration run: the verdict table, what was saved and why (with
    its nested numbers), whether scoring for it needs the backward pass, the learning curve,
    the guarantee and where the files are."""
    results = Path(results)
    doc = json.loads(results.read_text(encoding="utf-8"))
    t = doc["tables"]
    d = t["decision"][0]
    source = label_words(doc["labels"], (doc.get("settings") or {}).get("label_field"))
    lines = [f"calibration of {doc['model']} ({source}, {doc['answers']}) -> "
             f"{results.parent / 'calibration.json'}", *verdict_lines(doc)]
    lines.append(f"saved: {d['saved']} ({doc['selected']}): {d['reason']}")
    lines.append(f"  its nested PRR {num(d['PRR'])}, AUROC {num(d['AUROC'])} (the procedure "
                 "judged on answers it did not see)")
    took = doc.get("gradient_seconds")
    lines.append("  needs the backward pass: " + (
        "yes (isouq score computes the gradient scores)" if doc["needs_backward"] else
        "no: isouq score --calibration scores it with a forward pass only" + (
            f", skipping the backward that these rows were scored with (forward and backward: "
            f"a median {took:.3g} s per answer)" if took else "")))
    curve = t.get("learning_curve") or []
    if curve:
        by_n: dict[int, list[str]] = {}
        for r in curve:
            by_n.setdefault(r["labelled"], []).append(f"{r['predictor']} {num(r['AUROC'])}")
        lines.append("learning curve (nested AUROC by labelled answers per fit): " + "; ".join(
            f"{n}: " + ", ".join(v) for n, v in by_n.items()))
    lines += [f"withholding:  {doc['guarantee']}",
              f"tables and figures: {results} ({', '.join(doc['figures'])})",
              f"on labelled answers it did not see: isouq calibrate NEW.jsonl --check "
              f"{results.parent / 'calibration.json'} --out CHECK"]
    return "\n".join(lines)


# ---------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reliability_figure(preds: Mapping[str, np.ndarray], y: np.ndarray, path: Path, *,
                       saved: str = "", title: str = "", n_bins: int = 10) -> Path:
    """Reliability diagram of the saved choice's nested P(correct) (``preds["saved"]``) and of
    MSP's map: share correct vs mean P(correct) per bin, marker area ∝ answers in the bin; a
    histogram below."""
    from .calibration_choice import MSP_MAP

    plt = _plt()
    fig, (ax, hx) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], color="black", lw=0.8, label="perfect calibration")
    for key, color, ls in (("saved", "#2a7ab9", "-"), (MSP_MAP, "#d9622b", "--")):
        if key not in preds or (key == MSP_MAP and saved == MSP_MAP):
            continue
        bins = reliability_bins(preds[key], y, n_bins)
        x = [b["mean_p"] for b in bins]
        a = [b["accuracy"] for b in bins]
        s = [10 + 200 * b["n"] / len(y) for b in bins]
        lab = f"saved: {saved} (nested)" if key == "saved" else f"{key} (cross-fitted)"
        ax.plot(x, a, color=color, ls=ls, lw=1)
        ax.scatter(x, a, s=s, color=color, label=lab, zorder=3)
    ax.axhline(float(np.mean(y)), color="grey", ls=":", lw=1, label="base rate")
    ax.set_ylabel("share correct")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    hx.hist(preds["saved"], bins=np.linspace(0, 1, n_bins + 1), color="#2a7ab9")
    hx.set_xlabel("P(correct)")
    hx.set_ylabel("answers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def verdict_figure(table: Sequence[Mapping], curve: Sequence[Mapping], path: Path, *,
                   against: str, title: str = "") -> Path:
    """Left: each predictor's Δ PRR against ``against`` with its 95% interval, coloured by
    verdict; right (with a learning curve): the nested AUROC by labelled answers per fit."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2 if curve else 1, figsize=(9.5 if curve else 5.5, 3.6))
    ax = axes[0] if curve else axes
    rows = [r for r in table if r["against"] == against]
    colors = {V.AHEAD: "#2a9d4b", V.BELOW: "#c0392b", V.WITHIN: "#7f8c8d", None: "#bbbbbb"}
    for i, r in enumerate(rows):
        ax.errorbar(r["delta"], i, xerr=[[r["delta"] - r["ci_low"]], [r["ci_high"] - r["delta"]]],
                    fmt="o", color=colors.get(r["verdict"], "#bbbbbb"), capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['predictor']} ({r['verdict'] or 'n/a'})"
                                     for r in rows], fontsize=8)
    ax.set_xlabel(f"Δ PRR vs {against} (95% interval; verdict after Holm)")
    ax.set_title(title, fontsize=9)
    if curve:
        cx = axes[1]
        for name in dict.fromkeys(r["predictor"] for r in curve):
            pts = [(r["labelled"], r["AUROC"]) for r in curve
                   if r["predictor"] == name and r["AUROC"] is not None]
            if pts:
                cx.plot(*zip(*pts, strict=True), marker="o", label=name)
        cx.set_xlabel("labelled answers per fit")
        cx.set_ylabel("nested AUROC")
        cx.set_title("does labelling more help?", fontsize=9)
        cx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def risk_coverage_figure(preds: Mapping[str, np.ndarray], y: np.ndarray, path: Path, *,
                         risk: Mapping | None = None, title: str = "", saved: str = "") -> Path:
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
        lw, ls = (2.0, "-") if key == saved else (1.0, "--")
        ax.plot(cov, risk_curve, lw=lw, ls=ls,
                label=f"{key} (saved)" if key == saved else key)
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


__all__ = ["annotate_file", "answers_said", "evaluate", "num", "pad_to", "read_inputs",
           "reliability_figure", "risk_coverage_figure", "run_calibration", "signed", "summary",
           "verdict_figure", "verdict_lines"]
