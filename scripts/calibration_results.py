"""The kept calibration results: every kept QA model on both datasets, judge and hand labels.

    .venv/bin/python scripts/calibration_results.py [--qa results/qa] [--out results/calibration]

Writes, from the rows of ``results/qa`` (no model is loaded):

* ``OUT/<model>__<dataset>__<labels>/``: what ``isouq calibrate ROWS --labels L --max-risk 0.7
  --delta 0.1`` writes (the verdict against the reference map, what the floor saved,
  calibration.json, crossfit.jsonl, results.json, tables.md, PNGs);
  where the rows hold too few correct answers to set a map and a threshold on separate halves,
  the calibration is made without a threshold (noted in the summary);
* ``OUT/summary/``: results.json + tables.md + figure: one row per calibration (what was
  saved and why, its nested metrics beside the base rate and the best one-score map, the
  isouq head's verdict against the reference), the certified coverage at several
  error rates α, and the transfer table (calibrated on one dataset, evaluated on the other).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from isouq.calibrate_run import evaluate, read_inputs, run_calibration
from isouq.calibration import CalibrationError, Calibrator
from isouq.evaluation.probability import probability_metrics
from isouq.evaluation.rows import to_float
from isouq.runio import write_results

MODELS = ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")
DATASETS = ("truthfulqa", "triviaqa")
LABELS = ("judge", "hand")
ALPHA, DELTA = 0.7, 0.1  # the answers are mostly wrong (8-30% correct): α = 0.7 can be met
ALPHAS = (0.5, 0.6, 0.7, 0.8)
#: the one-score maps of isouq calibrate (calibration_choice): the reference and p̄'s
SINGLES = ("MSP's map", "p̄")


def short(e: Exception) -> str:
    """The reason of a CalibrationError in a few words, for a table cell."""
    text = str(e)
    if "the map is fitted on" in text:
        return "too few correct answers to fit a map on half of the rows (need 5)"
    return text.split(" - ")[0].split("; ")[0][:100]


def rows_file(qa: Path, dataset: str, model: str) -> Path:
    return qa / f"qa_{dataset}__{model}.jsonl"


def one(qa: Path, out: Path, model: str, dataset: str, labels: str) -> dict:
    """Run one calibration; return its summary row."""
    d = out / f"{model}__{dataset}__{labels}"
    note = ""
    try:
        path = run_calibration([rows_file(qa, dataset, model)], d, labels=labels,
                               max_risk=ALPHA, delta=DELTA)
    except CalibrationError as e:
        note = f"no threshold: {short(e)}"
        path = run_calibration([rows_file(qa, dataset, model)], d, labels=labels)
    doc = json.loads(path.read_text())
    m = {r["predictor"]: r for r in doc["tables"]["metrics"]}
    cal, base = m[doc["saved"]], m["base rate (constant)"]
    singles = [r for k, r in m.items() if k in SINGLES]
    best = min(singles, key=lambda r: r["log_loss"])
    rc = (doc["tables"].get("risk_control") or [None])[0]
    head = next((r for r in doc["tables"].get("verdict", ())
                 if r["predictor"] == "isouq head" and r["against"] in SINGLES), None)
    missing = doc["tables"]["decision"][0].get("short_of_floor") or {}
    return {
        "model": model, "dataset": dataset, "labels": labels, "n": cal["n"],
        "correct": round(cal["accuracy"] * cal["n"]), "saved": doc["saved"],
        "map": doc["selected"],
        "isouq head vs reference": (
            "no head: needs " + ", ".join(f"{k} more {c}" for c, k in missing.items())
            if missing else "n/a" if head is None
            else f"{head['verdict']} (Δ PRR {head['delta']:+.3f})"),
        "ECE": cal["ece"], "Brier": cal["brier"], "log-loss": cal["log_loss"],
        "AUROC": cal["auroc"], "AURAC": cal["aurac"],
        "base Brier": base["brier"], "base log-loss": base["log_loss"],
        "best single": best["predictor"],
        "its log-loss": best["log_loss"], "its AUROC": best["auroc"],
        f"threshold (α={ALPHA})": None if rc is None else rc["threshold"],
        "coverage": None if rc is None else rc["coverage"],
        "note": note or ("" if rc is None or rc["threshold"] is not None
                         else f"no threshold certified at α={ALPHA}: all withheld"),
    }


def withholding(qa: Path, model: str, dataset: str, labels: str) -> list[dict]:
    """Learn then Test at several α (δ = 0.1) on the same half split."""
    found = read_inputs([rows_file(qa, dataset, model)])
    out = []
    for alpha in ALPHAS:
        try:
            cal = Calibrator.fit(found["rows"], labels=labels, gold_rows=found["gold_rows"],
                                 max_risk=alpha, delta=DELTA)
        except CalibrationError as e:
            out.append({"model": model, "dataset": dataset, "labels": labels, "alpha": alpha,
                        "note": short(e)})
            continue
        rc = cal.doc["risk_control"]
        out.append({"model": model, "dataset": dataset, "labels": labels, "alpha": alpha,
                    "delta": DELTA, "held-out rows": rc["n"], "threshold": rc["threshold"],
                    "coverage": rc["coverage"], "kept": rc["kept"],
                    "error rate kept": rc["error_rate"], "upper bound": rc["risk_upper"],
                    "note": ""})
    return out


def transfer(qa: Path, out: Path, model: str, labels: str) -> list[dict]:
    """Calibrated on one dataset (all its rows), evaluated on the other, beside the other's
    own cross-fitted calibration and the source's base rate as a constant."""
    table = []
    for src, dst in ((DATASETS[0], DATASETS[1]), (DATASETS[1], DATASETS[0])):
        a = read_inputs([rows_file(qa, src, model)])
        b = read_inputs([rows_file(qa, dst, model)])
        try:
            cal = Calibrator.fit(a["rows"], labels=labels, gold_rows=a["gold_rows"])
        except CalibrationError as e:
            table.append({"model": model, "labels": labels, "from": src, "to": dst,
                          "note": short(e)})
            continue
        got = evaluate(cal, b["rows"], labels, b["gold_rows"])
        own = json.loads((out / f"{model}__{dst}__{labels}" / "results.json").read_text())
        own_m = next(r for r in own["tables"]["metrics"] if r["predictor"] == own["saved"])
        src_rate = cal.doc["labels"]["correct"] / cal.doc["labels"]["n"]
        y = np.array([r["correct"] for r in
                      (json.loads(line) for line in
                       (out / f"{model}__{dst}__{labels}" / "crossfit.jsonl").open())], dtype=int)
        base = probability_metrics(np.full(y.size, src_rate), y)
        table.append({
            "model": model, "labels": labels, "from": src, "to": dst, "n": got["n"],
            "map": f"{cal.map.kind} on {cal.map.name}",
            "accuracy to": got["accuracy"], "mean P(correct)": got["mean_p"],
            "ECE": got["ece"], "Brier": got["brier"], "log-loss": got["log_loss"],
            "AUROC": got["auroc"],
            "in-domain ECE": own_m["ece"], "in-domain Brier": own_m["brier"],
            "in-domain log-loss": own_m["log_loss"], "in-domain AUROC": own_m["auroc"],
            "source base rate Brier": base["brier"], "source base rate log-loss":
                to_float(base["log_loss"]), "note": ""})
    return table


def figure(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    x = np.arange(len(rows))
    w = 0.27
    for i, (key, lab) in enumerate((("log-loss", "saved choice (nested)"),
                                    ("its log-loss", "best single score's map (Platt)"),
                                    ("base log-loss", "base rate"))):
        ax.bar(x + (i - 1) * w, [r[key] for r in rows], w, label=lab)
    ax.set_xticks(x, [f"{r['model']}\n{r['dataset']}, {r['labels']}" for r in rows], fontsize=7,
                  rotation=30, ha="right")
    ax.set_ylabel("cross-fitted log-loss (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qa", default="results/qa", type=Path)
    ap.add_argument("--out", default="results/calibration", type=Path)
    args = ap.parse_args()
    started = time.time()
    summary, withhold, trans = [], [], []
    for labels in LABELS:
        for model in MODELS:
            for dataset in DATASETS:
                summary.append(one(args.qa, args.out, model, dataset, labels))
                withhold += withholding(args.qa, model, dataset, labels)
                print(f"{model} {dataset} {labels}: {summary[-1]['map']}", flush=True)
            trans += transfer(args.qa, args.out, model, labels)
    out = args.out / "summary"
    out.mkdir(parents=True, exist_ok=True)
    fig = figure(summary, out / "log_loss.png")
    write_results(out, "calibration-summary", seed=0, started=started,
                  settings={"qa": str(args.qa), "alpha": ALPHA, "delta": DELTA,
                            "alphas": list(ALPHAS), "labels": list(LABELS)},
                  tables={"calibrations": summary, "withholding": withhold, "transfer": trans},
                  figures=[fig.name],
                  extra={"labels": "judge = the LLM judge's labels (row 'correct'); hand = "
                                   "results/qa/gold/ (one person's labels)",
                         "guarantee": "Learn then Test (Angelopoulos et al. 2021): error rate "
                                      "among kept ≤ α with probability ≥ 1 − δ over the "
                                      "held-out half"})
    print(f"summary in {out}")


if __name__ == "__main__":
    main()
