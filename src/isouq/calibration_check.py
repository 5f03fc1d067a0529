"""``isouq calibrate ROWS --check CALIBRATION``: a saved calibration judged on labelled answers it
did not see.

After ``isouq calibrate`` on part of their labelled answers, a user scores the others (``isouq
score``, with ``--blocks``/``--hidden`` where the map reads them) and asks: does the saved map
rank these new answers at least as well as the probability the model already gives? The check
computes the map's P(correct) of each answer from the rows' scores (as ``isouq score
--calibration`` does) and compares it, on the same answers, with MSP (the sequence probability
Π pₜ: an increasing map of it ranks alike, though MSP's map may have learnt a reversed
direction) and with p̄. The comparisons are ``evaluation.verdict``'s: Δ PRR of 1 − P(correct) and
Δ AUROC, a paired bootstrap over the answers, Holm over the comparisons, a verdict only with at
least ``MIN_PER_CLASS`` answers of each class. Nothing is fitted, so there is no fold seed to repeat.

Answers the calibration was fitted on (its ``fitted_answers``, by ``answer_row.answer_id``) are
left out and counted. With a withholding threshold, the check also reports the share kept and
the error rate among the kept answers, beside the guarantee's α.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .answer_row import answer_id, scores_of
from .calibrate_run import answers_said, num, pad_to, read_inputs, risk_coverage_figure, signed_ci
from .calibration import CalibrationError, Calibrator, check_labels, labels_of
from .calibration_choice import MSP, PBAR
from .evaluation import verdict as V
from .evaluation.probability import probability_metrics
from .runio import write_results

#: the name of the saved map's P(correct) in the check's tables
SAVED = "saved map"


def held_out(cal: Calibrator, rows: Sequence[Mapping],
             y: np.ndarray) -> tuple[list[Mapping], np.ndarray, int]:
    """The rows the calibration was not fitted on, their labels, and how many were left out.

    Args:
        cal: the calibration (its ``fitted_answers``; a file without them leaves nothing out).
        rows: labelled answer rows; y: (n,) their labels.

    Returns:
        (rows, (m,) labels, n − m). CalibrationError when every answer was fitted on.
    """
    seen = set(cal.doc.get("fitted_answers") or ())
    keep = [i for i, r in enumerate(rows) if answer_id(r) not in seen]
    if not keep:
        raise CalibrationError(
            f"all {len(rows)} labelled answers were used to fit the calibration; check it on "
            "answers it did not see (score the others with `isouq score` and pass those)")
    return [rows[i] for i in keep], np.asarray(y, dtype=float)[keep], len(rows) - len(keep)


def references(rows: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """What the model already says of each answer, as P(correct)-like rankings: MSP (exp of
    the sequence log-probability, when every row has it) and p̄ (when every row has it)."""
    out = {}
    for name, field, f in ((MSP, "seq_logprob", np.exp), (PBAR, "mean_prob", np.asarray)):
        v = [scores_of(r).get(field) for r in rows]
        if all(isinstance(x, (int, float)) for x in v):
            out[name] = f(np.asarray(v, dtype=float))
    if not out:
        raise CalibrationError("the rows carry neither seq_logprob nor mean_prob, so there is "
                               "nothing to compare the saved map with; score them with "
                               "`isouq score` (it writes both)")
    return out


def check_calibration(
    calibration: str | os.PathLike,
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    labels: str = "judge",
    label_field: str | None = None,
    model: str | None = None,
    gold: Sequence[str | os.PathLike] = (),
    seed: int = 0,
    n_bootstrap: int = V.N_BOOTSTRAP,
) -> Path:
    """Judge a saved calibration on labelled answers it did not see (see the module docstring).

    Args:
        calibration: a ``calibration.json`` of ``isouq calibrate``.
        paths: files or folders of labelled, scored rows of the calibration's model.
        out: output folder (``results.json``, ``tables.md``, ``risk_coverage.png``).
        labels: ``hand``, ``judge`` or ``lexical`` (:func:`calibration.labels_of`).
        label_field: the rows' label field; default: the one the calibration was made with.
        model: the model, when the rows hold several.
        gold: hand-label files or folders (``labels="hand"``).
        seed: the bootstrap's seed.
        n_bootstrap: paired bootstrap resamples (at least 1,000).

    Returns:
        The path of ``out/results.json``.
    """
    started = time.time()
    if n_bootstrap < 1000:
        raise CalibrationError(f"n_bootstrap = {n_bootstrap}: give at least 1,000 resamples")
    cal = Calibrator.load(calibration)
    found = read_inputs(paths, model=model, gold=gold)
    cal.check_model(found["model"], found["files"])
    field = label_field or cal.doc.get("label_field")
    rows, y = labels_of(found["rows"], labels, found["gold_rows"], field=field)
    rows, y, fitted_on = held_out(cal, rows, y)
    preds = {SAVED: cal.predict(rows), **references(rows)}
    ok = np.all([np.isfinite(p) for p in preds.values()], axis=0)
    unscored = int((~ok).sum())
    rows, y = [r for r, k in zip(rows, ok, strict=True) if k], y[ok]
    preds = {k: v[ok] for k, v in preds.items()}
    check_labels(y, "the held-out answers", per_class=1, min_rows=2)
    pairs = [(SAVED, ref) for ref in preds if ref != SAVED]
    table = V.judge(V.compare(preds, y, pairs, n_bootstrap=n_bootstrap, seed=seed))
    metrics = [{"predictor": SAVED, **probability_metrics(preds[SAVED], y)}]
    withholding = []
    w = cal.withheld(preds[SAVED])
    if w is not None:
        kept = ~w
        rc = cal.doc["risk_control"]
        withholding.append({"answers": int(y.size), "kept": int(kept.sum()),
                            "error_rate_kept": (float(1 - y[kept].mean()) if kept.any()
                                                else None),
                            "alpha": rc["alpha"], "delta": rc["delta"],
                            "threshold": cal.threshold})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{cal.model}: saved map on {y.size} held-out answers"
    fig = risk_coverage_figure(preds, y, out / "risk_coverage.png", title=title, saved=SAVED)
    verdict = cal.doc.get("verdict") or {}
    return write_results(
        out, "calibration check", seed=seed, started=started,
        settings={"calibration": str(calibration), "rows": [str(p) for p in paths],
                  "labels": labels, "label_field": field, "model": cal.model,
                  "n_bootstrap": n_bootstrap},
        tables={"verdict": table, "metrics": metrics,
                **({"withholding": withholding} if withholding else {})},
        figures=[fig.name],
        extra={"model": cal.model, "answers": answers_said(y), "fitted_on": fitted_on,
               "fitted_known": "fitted_answers" in cal.doc,
               "unscored": unscored, "saved": verdict.get("saved"),
               "selected": f"{cal.map.kind} on {cal.map.name}"})


def check_summary(results: str | os.PathLike) -> str:
    """A few lines about a check (its ``results.json``): the answers judged, the saved map
    against MSP and p̄ with intervals and verdicts, its calibration error there and, with a
    threshold, what it kept."""
    results = Path(results)
    doc = json.loads(results.read_text(encoding="utf-8"))
    t = doc["tables"]
    left = [f"{doc['fitted_on']} left out (the map was fitted on them)"] * bool(doc["fitted_on"])
    left += [f"{doc['unscored']} left out (a score is missing or NaN)"] * bool(doc["unscored"])
    saved = f"{doc['saved']}: " if doc.get("saved") else ""
    lines = [f"check of {doc['settings']['calibration']} ({saved}{doc['selected']}) on "
             f"answers it did not see: {doc['answers']}" + (f"; {', '.join(left)}" if left
                                                            else ""),
             f"  {'reference':<9} {'PRR':>6} {'saved':>6}  {'Δ PRR [95% CI]':<26} "
             f"{'Δ AUROC [95% CI]':<26} {'Holm p':>7}  verdict"]
    if not doc["fitted_known"]:
        lines.append("  (this calibration does not list the answers it was fitted on: it was made "
                     "by an older isouq; pass only answers it did not see)")
    for r in t["verdict"]:
        d_prr, d_auc = signed_ci(r), signed_ci(r, "_auroc")
        said = r["verdict"] or f"no verdict: fewer than {V.MIN_PER_CLASS} answers of a class"
        lines.append(f"  {pad_to(r['against'], 9)} {num(r['PRR'] - r['delta']):>6} "
                     f"{num(r['PRR']):>6}  {d_prr:<26} {d_auc:<26} {num(r['p_holm']):>7}  "
                     f"{said}")
    m = t["metrics"][0]
    lines.append(f"  the saved map's P(correct) there: AUROC {num(m['auroc'])}, ECE "
                 f"{num(m['ece'])}, Brier {num(m['brier'])}, mean {num(m['mean_p'])} against "
                 f"{num(m['accuracy'])} correct")
    for w in t.get("withholding") or []:
        lines.append(f"withholding: kept {w['kept']} of {w['answers']}, error rate among kept "
                     f"{num(w['error_rate_kept'])} (the guarantee: ≤ {w['alpha']:g} with "
                     f"probability ≥ {1 - w['delta']:g})")
    lines.append(f"tables and figures: {results} ({', '.join(doc['figures'])})")
    return "\n".join(lines)


__all__ = ["SAVED", "check_calibration", "check_summary", "held_out", "references"]
