"""The pre-registered verdict on fresh questions (``configs/preregistration/v1.yaml``: TriviaQA
and TruthfulQA, ``v4.yaml`` the 1.5B model's two sets of v1 without pad tokens, with v1's two
others in its family; ``v2.yaml`` and ``v3.yaml``: the exact-label tasks, v3 with v2's SmolLM2
sets in its family).

    .venv-polygraph/bin/python scripts/polygraph/prereg_verdict.py [--prereg FILE] [--fit] \
        [--sets D__M ...]

The answer sets, their primary quality and the kept files' folder are read from the
pre-registration (v1: ``results/polygraph_prereg``; v2: its ``fresh_sets.results``).

Two steps, each resumable by answer set (dataset × model):

1. ``--fit`` (needs the hidden states that ``features.py --results results/polygraph_prereg
   --rows-only`` caches): for every answer set of the pre-registration whose kept benchmark
   file is complete and carries the pre-registration's SHA-256, the three pre-registered
   predictors are cross-fitted by ``isouq.calibration_choice.cross_fitted``, the code of
   ``isouq calibrate`` (5 outer stratified folds, fold seeds 0-4, inner selection by log-loss):
   MSP's map (Platt on the sequence log-probability), the forward-only head (mean_prob,
   seq_logprob, hidden) and the isouq head (mean_prob, seq_logprob, epistemic, epistemic_log,
   aleatoric, blocks, hidden). Labels: the primary quality (TriviaQA accuracy; TruthfulQA
   ROUGE-L as a fractional label). Each answer's out-of-fold P(correct), per seed, goes to the
   kept ``RESULTS/verdict/<dataset>__<model>.oof.json`` with the labels, so that step 2 needs
   no model, cache or fit.
2. Always: from the kept ``.oof.json`` files alone, the two pre-registered comparisons per
   answer set (``evaluation.verdict.compare``: PRR, paired bootstrap of 2,000 resamples over
   answers and fold seeds, seed 0; AUROC beside), Holm's correction over the rankable answer
   sets of each comparison (``evaluation.verdict.judge``), the verdicts. Written:
   ``RESULTS/verdict/verdict.json``, ``verdict.md`` (the table) and ``verdict.png``. The
   verdict file records the pre-registration's SHA-256 and the commit of this code.

``--design`` applies the same two steps, the pre-registration's predictors, rule and statistics,
to the design set's answer sets (``results/polygraph``, the first 500 questions: every kept
file, no hash) into ``results/polygraph/verdict/``: the design-set verdict with 5 fold seeds in
its intervals. Its states come from ``features.py`` (without ``--results``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PREREG = Path("configs/preregistration/v1.yaml")
RESULTS = Path("results/polygraph_prereg")
#: the design set's kept files (the first 500 questions), which ``--design`` judges by the same
#: rule; their cached states carry no folder tag (scripts/polygraph/features.py)
DESIGN = Path("results/polygraph")
CACHE = Path(".cache/polygraph_features")
#: the answer sets and primary metrics of a pre-registration (``answer_sets``): set by
#: :func:`read_prereg`
SETS: tuple[tuple[str, str], ...] = ()
PRIMARY: dict[str, str] = {}
#: answer sets of the family fitted under an earlier pre-registration (``inherits``): (dataset,
#: model) -> (that pre-registration's results folder, its file); set by :func:`read_prereg`
INHERITED: dict[tuple[str, str], tuple[Path, Path]] = {}
#: the predictors of the pre-registrations (v1 and v2: predictors), named as calibration_choice
#: names them
FORWARD_FEATURES = ("mean_prob", "seq_logprob", "hidden")
ISOUQ_FEATURES = ("mean_prob", "seq_logprob", "epistemic", "epistemic_log", "aleatoric",
                  "blocks", "hidden")
SEEDS = (0, 1, 2, 3, 4)
FOLDS = 5
N_BOOTSTRAP = 2000


def read_prereg(path: Path) -> Path:
    """Set :data:`SETS`, :data:`PRIMARY` and :data:`INHERITED` from a pre-registration; return
    its results folder (SystemExit when its predictors are not those this script fits).

    A pre-registration that ``inherits`` answer sets of an earlier one (v3: SmolLM2's v2 task
    sets) judges them in its family from the earlier one's kept out-of-fold files; it fits only
    its own."""
    import yaml

    global SETS, PRIMARY, INHERITED
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    sets = doc["answer_sets"]
    SETS = tuple((s["dataset"], s["model"]) for s in sets["sets"])
    INHERITED = {}
    if doc.get("inherits"):
        first = Path(doc["inherits"]["preregistration"])
        earlier = yaml.safe_load(first.read_text(encoding="utf-8"))
        kept = Path(earlier["fresh_sets"].get("results", RESULTS))
        INHERITED = {(s["dataset"], s["model"]): (kept, first) for s in doc["inherits"]["sets"]}
    PRIMARY = {ds: q["metric"] if isinstance(q, dict) else q
               for ds, q in sets["primary_quality"].items()}
    heads = doc["predictors"]
    for name, feats in (("isouq_head", ISOUQ_FEATURES), ("forward_only_head", FORWARD_FEATURES)):
        if isinstance(heads[name], dict) and tuple(heads[name]["features"]) != feats:
            raise SystemExit(f"{path}: {name} reads {heads[name]['features']}, this script fits "
                             f"{list(feats)}")
    return Path(doc["fresh_sets"].get("results", RESULTS))


def sha256(path: Path) -> str:
    from isouq.models.files import sha256_file

    return sha256_file(path)


def predictors():
    from isouq.calibration_choice import FORWARD, ISOUQ, MSP_MAP, Predictor

    return {MSP_MAP: Predictor(MSP_MAP, ("seq_logprob",)),
            FORWARD: Predictor(FORWARD, FORWARD_FEATURES, head=True),
            ISOUQ: Predictor(ISOUQ, ISOUQ_FEATURES, head=True)}


def comparisons() -> list[tuple[str, str]]:
    """The pre-registered comparisons (v1: comparisons), the primary one first."""
    from isouq.calibration_choice import FORWARD, ISOUQ, MSP_MAP

    return [(ISOUQ, MSP_MAP), (ISOUQ, FORWARD)]


def design_sets(results: Path = DESIGN) -> tuple[tuple[str, str], ...]:
    """The design set's answer sets: every kept file of ``results`` whose dataset the
    pre-registration read last (:func:`read_prereg`) has a primary quality for."""
    found = (p.stem.split("__")[1:] for p in sorted(results.glob("polygraph__*__*.json")))
    return tuple((ds, model) for ds, model, *rest in found if ds in PRIMARY and not rest)


def kept_file(results: Path, dataset: str, model: str, prereg: Path | None) -> dict | None:
    """The kept benchmark file of an answer set, checked: None while it is partial; SystemExit
    when it was made under another pre-registration (``prereg`` None: a design-set file, made
    under none)."""
    path = results / f"polygraph__{dataset}__{model}.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    got = (doc.get("preregistration") or {}).get("sha256")
    if prereg is None:
        if got is not None:
            raise SystemExit(f"{path} was made under a pre-registration; it is not design set")
    elif got != sha256(prereg):
        raise SystemExit(f"{path} carries pre-registration {got}, not {prereg} "
                         f"({sha256(prereg)}): it is not evidence for this verdict")
    return doc if doc.get("complete") else None


def answer_rows(doc: dict, results: Path) -> tuple[list[dict], np.ndarray, dict]:
    """The answers with scores, block profile and hidden states, their primary quality, and
    their states: (rows, (n,) quality, state name -> (n, d))."""
    from isouq.runio import read_jsonl

    name = f"{doc['dataset']}__{doc['model']}"
    metric = PRIMARY[doc["dataset"]]
    quality = {q["key"]: q["quality"].get(metric) for q in doc["questions"]}
    feats = {r["key"]: r for r in read_jsonl(results / "features" / f"{name}.jsonl")
             if "error" not in r}
    tag = "" if results == DESIGN else f"{results.name}__"
    layers = {r["key"]: r for r in read_jsonl(CACHE / f"{tag}{name}.layers.jsonl")}
    keys = [q["key"] for q in doc["questions"]
            if q["key"] in feats and q["key"] in layers and quality[q["key"]] is not None]
    if not keys:
        raise SystemExit(f"{name}: no answer has its features and cached states; run "
                         f"features.py --results {results} first")
    first = layers[keys[0]]
    states = {f"hidden_states[{lay}]": np.asarray([layers[k]["states"][i] for k in keys])
              for i, lay in enumerate(first["layers"])}
    rows = [feats[k] for k in keys]
    q = np.clip(np.asarray([quality[k] for k in keys], dtype=float), 0.0, 1.0)
    return rows, q, states


def fit(doc: dict, results: Path, out: Path) -> None:
    """Step 1 for one answer set: the out-of-fold P(correct) of each predictor, kept."""
    from isouq.calibration import CalibrationError
    from isouq.calibration_choice import cross_fitted, feature_sets_of
    from isouq.evaluation.features import values

    rows, q, states = answer_rows(doc, results)
    preds = predictors()
    cols_needed = dict.fromkeys(c for p in preds.values()
                                for s in feature_sets_of(p, rows).values() for c in s)
    cols = values(rows, list(cols_needed))
    t0 = time.perf_counter()
    try:
        oof = cross_fitted(rows, cols, q, preds, seeds=SEEDS, folds=FOLDS, states=states)
        unfitted = None
    except CalibrationError as e:   # too few of a class to cross-fit: reported, not judged
        oof, unfitted = {}, str(e)
    out.write_text(json.dumps({
        "dataset": doc["dataset"], "model": doc["model"], "metric": PRIMARY[doc["dataset"]],
        "keys": [r["key"] for r in rows], "quality": [round(float(x), 6) for x in q],
        "left_out": len(doc["questions"]) - len(rows), "seeds": list(SEEDS), "folds": FOLDS,
        "features": {"forward-only head": list(FORWARD_FEATURES),
                     "isouq head": list(ISOUQ_FEATURES)},
        "seconds": round(time.perf_counter() - t0, 1), "not_fitted": unfitted,
        "oof": {k: [[round(float(x), 6) for x in row] for row in v] for k, v in oof.items()},
    }) + "\n", encoding="utf-8")
    print(f"{out}: {len(rows)} answers, {time.perf_counter() - t0:.0f} s", flush=True)


def judge_kept(folder: Path, prereg: Path) -> dict:
    """Step 2: the verdict from the kept out-of-fold files alone."""
    from isouq.evaluation import verdict as V

    rows = []
    for dataset, model in (*INHERITED, *SETS):
        path = folder / f"{dataset}__{model}.oof.json"
        if (dataset, model) in INHERITED:  # fitted under the earlier one: its hash is checked
            kept, first = INHERITED[dataset, model]
            path = kept / "verdict" / path.name
            if kept_file(kept, dataset, model, first) is None:
                continue
        if not path.exists():
            continue
        got = json.loads(path.read_text(encoding="utf-8"))
        oof = {k: np.asarray(v, dtype=float) for k, v in got["oof"].items()}
        q = np.asarray(got["quality"], dtype=float)
        right, wrong = V.class_counts(q)
        compared = (V.compare(oof, q, comparisons(), n_bootstrap=N_BOOTSTRAP, seed=0) if oof
                    else [{"predictor": a, "against": b, "PRR": None, "delta": None,
                           "rankable": False, "note": got["not_fitted"]}
                          for a, b in comparisons()])
        for r in compared:
            rows.append({"dataset": dataset, "model": model, "metric": got["metric"],
                         "correct": right, "wrong": wrong, **r})
    families = []
    for a, b in comparisons():
        fam = [r for r in rows if (r["predictor"], r["against"]) == (a, b)]
        families += V.judge(fam)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"preregistration": {"path": str(prereg), "sha256": sha256(prereg)},
            "inherited": {f"{d}__{m}": {"path": str(f), "sha256": sha256(f)}
                          for (d, m), (_, f) in INHERITED.items()},
            "commit": commit, "answer_sets_expected": len(SETS) + len(INHERITED),
            "answer_sets_judged": len({(r["dataset"], r["model"]) for r in rows}),
            "n_bootstrap": N_BOOTSTRAP, "seeds": list(SEEDS), "alpha": V.ALPHA,
            "rows": families}


def table(doc: dict) -> str:
    """The verdict as a Markdown table, one row per answer set
    (``isouq.study.report.polygraph.verdict_table``, as ``isouq report`` shows it)."""
    from isouq.runio import markdown_table
    from isouq.study.report.polygraph import verdict_table

    return markdown_table(verdict_table(doc))


def figure(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.2))
    colors = {"ahead": "#2a9d4b", "below": "#c0392b", "within noise": "#7f8c8d"}
    rows = [r for r in rows if r["delta"] is not None]   # an answer set too small to fit
    for i, r in enumerate(rows):
        ax.errorbar(r["delta"], i, xerr=[[r["delta"] - r["ci_low"]], [r["ci_high"] - r["delta"]]],
                    fmt="o", capsize=3, color=colors.get(r["verdict"], "#bbbbbb"))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['model']} × {r['dataset']}: vs {r['against']}"
                                     for r in rows], fontsize=8)
    ax.set_xlabel("Δ PRR (95% interval; colour: verdict after Holm)")
    ax.set_title(("Design set" if doc.get("design_set") else "Pre-registered fresh questions")
                 + ": isouq head", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prereg", default=str(PREREG))
    ap.add_argument("--results", default=None, help="default: the pre-registration's")
    ap.add_argument("--fit", action="store_true", help="step 1 for the sets not yet fitted")
    ap.add_argument("--sets", nargs="+", default=None, metavar="DATASET__MODEL",
                    help="fit only these answer sets")
    ap.add_argument("--design", action="store_true", help="the design set's answer sets "
                    f"({DESIGN}) by the pre-registration's rule, into {DESIGN}/verdict")
    a = ap.parse_args(argv)
    prereg = Path(a.prereg)
    results = DESIGN if a.design else read_prereg(prereg)
    results = Path(a.results) if a.results else results
    if a.design:   # the pre-registration's rule on the design set's answer sets
        global SETS, INHERITED
        read_prereg(prereg)
        SETS, INHERITED = design_sets(results), {}
    folder = results / "verdict"
    folder.mkdir(parents=True, exist_ok=True)
    if a.fit:
        for dataset, model in SETS:
            if a.sets and f"{dataset}__{model}" not in a.sets:
                continue
            out = folder / f"{dataset}__{model}.oof.json"
            doc = kept_file(results, dataset, model, None if a.design else prereg)
            if out.exists() or doc is None:
                print(f"{dataset}__{model}: {'done' if out.exists() else 'not complete yet'}")
                continue
            fit(doc, results, out)
    doc = judge_kept(folder, prereg) | ({"design_set": str(results)} if a.design else {})
    (folder / "verdict.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (folder / "verdict.md").write_text(table(doc), encoding="utf-8")
    if doc["rows"]:
        figure(doc, folder / "verdict.png")
    print(f"{folder}: {doc['answer_sets_judged']} of {doc['answer_sets_expected']} answer sets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
