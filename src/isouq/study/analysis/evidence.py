"""Tables of the QA evidence settings with exact or lexical labels (issue 25): TruthfulQA MC1
(``qa mc``) and TriviaQA short answers (``qa short``).

Per (dataset, model):
- ``counts``: questions, correct answers, accuracy;
- ``metrics``: per method (a logistic regression on its score(s), as in the QA study,
  :func:`auroc.method_runs`), AUROC, PRR and AURAC as the mean over out-of-bag bootstrap runs
  with a 95% interval (2.5 and 97.5 percentiles of the runs);
- ``raw_auroc``: each score used as it is, oriented as a confidence (p̄, max_prob, P(True) as
  they are; epistemic, epistemic_log, aleatoric and the entropies negated): 0.5 = chance,
  above = the score ranks correct answers as more trustworthy, below = the reverse; 95%
  percentile bootstrap interval over questions and the direction the interval supports;
- ``paired``: each of our methods vs each baseline, ΔAUROC over the same bootstrap runs (paired),
  its 95% interval and two-sided bootstrap p, Benjamini–Hochberg adjusted over the table.

Pooled over the models of a dataset (two or more), each model weighing the same:
- ``raw_pooled``: the mean over models of each score's raw AUROC, with a percentile interval
  from resampling every model's questions independently;
- ``paired_pooled``: the mean over models of each (ours, baseline) ΔAUROC; bootstrap run r of the
  pooled Δ is the mean of run r of every model (independent draws), giving its interval and
  two-sided p, Benjamini–Hochberg adjusted over the pooled table. Pooling the models is what
  gives a small difference the power one model's 400–800 questions lack.

A baseline computed on the first questions only (semantic entropy, whose entailment judge
costs far more than the rest: ``SUBSET_BASELINES``) gets the same tables on those questions,
every method refitted there (:func:`subset_rows`), so it is compared on the same rows.

p̄ (mean token probability) is a baseline here: ‖∇θ p̄‖² = p̄² ‖∇θ log p̄‖² carries p̄.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...evaluation.auroc import METRICS, auroc, method_runs
from ...evaluation.rows import QAGroup, check_classes, group_rng, group_rows, to_float
from ...evaluation.significance import bh_adjust

OURS: dict[str, tuple[str, ...]] = {
    "Epi.": ("epistemic",),
    "Epi. log": ("epistemic_log",),
    "Alea.": ("aleatoric",),
    "Epi. & Alea.": ("epistemic", "aleatoric"),
    "Epi. & p̄": ("epistemic", "mean_prob"),
}
#: the critique (Li et al. 2026, ``qa.semgrad``): compared with ours like the baselines
CRITIQUE: dict[str, tuple[str, ...]] = {
    "SemGrad": ("semgrad",),
    "lm_head grad": ("lm_head_grad",),
    "HybridGrad": ("hybridgrad",),
}
MC_BASELINES: dict[str, tuple[str, ...]] = {
    "p̄": ("mean_prob",),
    "Max prob.": ("max_prob",),
    "Option ent.": ("option_entropy",),
    "P(True)": ("p_true",),
    **CRITIQUE,
}
SHORT_BASELINES: dict[str, tuple[str, ...]] = {
    "p̄": ("mean_prob",),
    "Naive Ent.": ("naive_entropy",),
    "P(True)": ("p_true",),
    **CRITIQUE,
}
#: baselines run on a nested subset of the questions (``qa short --limit``): their own tables
#: (the report keys them ``subset_*``: one such baseline)
SUBSET_BASELINES: dict[str, tuple[str, ...]] = {"Sem. Ent.": ("semantic_entropy",)}
#: scores that are confidences (higher = more likely correct); the others are uncertainties
CONFIDENCES: tuple[str, ...] = ("mean_prob", "max_prob", "p_true")
RAW_SCORES: tuple[str, ...] = ("epistemic", "epistemic_log", "aleatoric", "mean_prob",
                               "max_prob", "option_entropy", "naive_entropy", "p_true",
                               "semgrad", "lm_head_grad", "hybridgrad")


def subset_rows(rows: Iterable[Mapping], score: str) -> list[Mapping]:
    """The rows that carry ``score`` (the questions a subset baseline was run on)."""
    return [r for r in rows if isinstance(sc := r.get("scores"), Mapping)
            and sc.get(score) is not None]


def _as_confidence(score: str, x: np.ndarray) -> np.ndarray:
    """A score oriented as a confidence: confidences as they are, uncertainties negated."""
    return x if score in CONFIDENCES else -x


def _direction(lo: float, hi: float) -> str:
    """What a confidence's AUROC interval supports."""
    return "higher = correct" if lo > 0.5 else "higher = wrong" if hi < 0.5 else "none"


def _ci(v: np.ndarray) -> tuple[float | None, float | None, float | None]:
    v = v[np.isfinite(v)]
    if not v.size:
        return None, None, None
    lo, hi = np.percentile(v, [2.5, 97.5])
    return to_float(v.mean()), to_float(lo), to_float(hi)


def raw_auroc_ci(correct: np.ndarray, confidence: np.ndarray, *, n_bootstrap: int = 1000,
                 rng: np.random.Generator | None = None) -> dict:
    """AUROC of a confidence for correctness with a percentile bootstrap interval.

    Args:
        correct: (n,) 0/1.
        confidence: (n,) higher = more likely correct; NaN rows are dropped.
        n_bootstrap: resamples of the questions (with replacement).
        rng: random generator (default: seed 0).

    Returns:
        {"n", "auroc", "ci_low", "ci_high", "direction"}: direction "higher = correct" when the
        interval lies above 0.5, "higher = wrong" below, "none" when it holds 0.5.
    """
    rng = rng or np.random.default_rng(0)
    ok = np.isfinite(confidence)
    y, s = np.asarray(correct)[ok].astype(int), np.asarray(confidence, dtype=float)[ok]
    a = auroc(y, s)
    boots = []
    for _ in range(n_bootstrap):
        i = rng.integers(0, y.size, y.size)
        if 0 < y[i].sum() < y.size:
            boots.append(auroc(y[i], s[i]))
    lo, hi = (np.percentile(boots, [2.5, 97.5]) if boots else (np.nan, np.nan))
    return {"n": int(y.size), "auroc": to_float(a), "ci_low": to_float(lo),
            "ci_high": to_float(hi), "direction": _direction(lo, hi)}


def raw_auroc_rows(g: QAGroup, *, n_bootstrap: int = 1000, seed: int = 0,
                   scores: Sequence[str] = RAW_SCORES) -> list[dict]:
    """One row per score of ``scores`` the group has: its raw AUROC as a confidence
    (:func:`raw_auroc_ci`), with how it was oriented.

    Args:
        g: the judged rows of one (dataset, model).
        n_bootstrap: resamples of the questions for the interval.
        seed: seed of the resampling (one stream per group).
        scores: the score names (default ``RAW_SCORES``).

    Returns:
        Dict rows {"dataset", "model", "score", "oriented", "n", "auroc", "ci_low", "ci_high",
        "direction", "score_direction"}: ``direction`` of the oriented confidence,
        ``score_direction`` of the score as it is (e.g. "higher = wrong" for an epistemic score
        whose larger values go with wrong answers; "none" when the interval holds 0.5).
    """
    rng = group_rng(seed, "raw", g.dataset, g.model)
    out = []
    for score in scores:
        x = g.score(score)
        if not np.isfinite(x).any():
            continue
        conf = _as_confidence(score, x)
        row = {"dataset": g.dataset, "model": g.model, "score": score,
               "oriented": "as is" if score in CONFIDENCES else "negated",
               **raw_auroc_ci(g.correct, conf, n_bootstrap=n_bootstrap, rng=rng)}
        flip = {"higher = correct": "higher = wrong", "higher = wrong": "higher = correct"}
        row["score_direction"] = (row["direction"] if score in CONFIDENCES
                                  else flip.get(row["direction"], row["direction"]))
        out.append(row)
    return out


def _p_two_sided(d: np.ndarray) -> float:
    """Two-sided bootstrap p of "the mean of d is 0" from its draws d."""
    return min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (d.size + 1))


def raw_pooled_rows(groups: Mapping[tuple[str, str], QAGroup], *, n_bootstrap: int = 1000,
                    seed: int = 0, scores: Sequence[str] = RAW_SCORES) -> list[dict]:
    """Per dataset with two or more models: the mean over models of each score's raw AUROC
    (oriented as in :func:`raw_auroc_rows`) and its percentile interval.

    Args:
        groups: the judged rows by (dataset, model).
        n_bootstrap: resamples; each resamples every model's questions on its own.
        seed: seed of the resampling.
        scores: the score names (default ``RAW_SCORES``).

    Returns:
        Dict rows {"dataset", "models", "score", "auroc", "ci_low", "ci_high", "direction"}
        for the scores every model of the dataset has.
    """
    out = []
    for ds in dict.fromkeys(d for d, _ in groups):
        gs = [g for (d, _), g in groups.items() if d == ds]
        if len(gs) < 2:
            continue
        for score in scores:
            cols = [g.score(score) for g in gs]
            if not all(np.isfinite(c).any() for c in cols):
                continue
            point, boots = [], []
            for g, x in zip(gs, cols, strict=True):
                conf = _as_confidence(score, x)
                ok = np.isfinite(conf)
                y, c = g.correct[ok].astype(int), conf[ok]
                point.append(auroc(y, c))
                rng = group_rng(seed, "raw_pooled", ds, g.model)
                draws = []
                for _ in range(n_bootstrap):
                    i = rng.integers(0, y.size, y.size)
                    draws.append(auroc(y[i], c[i]) if 0 < y[i].sum() < y.size else np.nan)
                boots.append(draws)
            pooled = np.array(boots).mean(axis=0)  # a run with a one-class resample: NaN
            pooled = pooled[np.isfinite(pooled)]
            if not pooled.size:
                continue
            lo, hi = np.percentile(pooled, [2.5, 97.5])
            out.append({"dataset": ds, "models": len(gs), "score": score,
                        "oriented": "as is" if score in CONFIDENCES else "negated",
                        "auroc": to_float(np.mean(point)), "ci_low": to_float(lo),
                        "ci_high": to_float(hi), "direction": _direction(lo, hi)})
    return out


def paired_pooled_rows(runs: Mapping[tuple[str, str, str], Mapping[str, np.ndarray]],
                       ours: Iterable[str], baselines: Iterable[str], *,
                       alpha: float = 0.05) -> list[dict]:
    """Per dataset with two or more models: each (ours, baseline) ΔAUROC averaged over the
    models, run by run (module doc), with its interval, p and BH-adjusted p.

    Args:
        runs: :func:`auroc.method_runs` output.
        ours, baselines: method names.
        alpha: BH false-discovery rate over the returned rows.

    Returns:
        Dict rows {"dataset", "models", "method", "baseline", "runs", "delta_auroc",
        "ci_low", "ci_high", "p", "p_bh", "significant", "direction"}.
    """
    datasets: dict[str, list[str]] = {}
    for ds, model, _ in runs:
        if model not in datasets.setdefault(ds, []):
            datasets[ds].append(model)
    out = []
    for ds, models in datasets.items():
        if len(models) < 2:
            continue
        for a in ours:
            for b in baselines:
                deltas = [runs[(ds, m, a)]["auroc"] - runs[(ds, m, b)]["auroc"] for m in models
                          if (ds, m, a) in runs and (ds, m, b) in runs]
                if len(deltas) < 2:
                    continue
                n = min(d.size for d in deltas)
                d = np.mean([x[:n] for x in deltas], axis=0)
                d = d[np.isfinite(d)]
                if not d.size:
                    continue
                lo, hi = np.percentile(d, [2.5, 97.5])
                out.append({"dataset": ds, "models": len(deltas), "method": a, "baseline": b,
                            "runs": int(d.size), "delta_auroc": to_float(d.mean()),
                            "ci_low": to_float(lo), "ci_high": to_float(hi),
                            "p": _p_two_sided(d)})
    _mark_bh(out, alpha)
    return out


def _mark_bh(rows: list[dict], alpha: float) -> None:
    """Add p_bh, significant and direction (↑/↓ when significant) to paired rows in place."""
    reject, p_adj = bh_adjust([r["p"] for r in rows], alpha)
    for r, rej, pa in zip(rows, reject, p_adj, strict=True):
        r["p_bh"] = to_float(pa)
        r["significant"] = bool(rej)
        r["direction"] = ("↑" if r["delta_auroc"] > 0 else "↓") if rej else ""


def evidence_tables(
    rows: Iterable[Mapping],
    baselines: Mapping[str, Sequence[str]],
    *,
    ours: Mapping[str, Sequence[str]] = OURS,
    n_bootstrap: int = 300,
    n_raw_bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    raw_scores: Sequence[str] = RAW_SCORES,
) -> dict[str, list[dict]]:
    """QA rows of one setting -> {"counts", "metrics", "raw_auroc", "paired", "raw_pooled",
    "paired_pooled"} (module doc; the pooled tables are empty with one model).

    Args:
        rows: rows with ``key``, ``model``, ``dataset``, ``correct`` (0/1) and ``scores``.
        baselines: method name -> score name(s) of the setting's baselines.
        ours: method name -> score name(s) of the gradient methods.
        n_bootstrap: out-of-bag runs per (dataset, model) for the fitted metrics.
        n_raw_bootstrap: resamples for the raw AUROC intervals.
        seed: seed of every draw.
        alpha: BH false-discovery rate of ``paired``.
        raw_scores: the scores of the raw AUROC tables.

    Returns:
        Table name -> list of dict rows. Raises DataError (``rows.check_classes``) when a group
        lacks two correct or two incorrect answers.
    """
    groups = group_rows(rows)
    check_classes(groups)
    methods = {**ours, **baselines}
    runs = method_runs(groups, n_bootstrap=n_bootstrap, seed=seed, methods=methods)
    counts, metrics, raw, paired = [], [], [], []
    for (ds, model), g in groups.items():
        counts.append({"dataset": ds, "model": model, "n": g.n, "correct": int(g.correct.sum()),
                       "accuracy": to_float(g.correct.mean())})
        for name in methods:
            r = runs.get((ds, model, name))
            if r is None:
                continue
            row: dict = {"dataset": ds, "model": model, "method": name, "n": int(r["n"])}
            for m in METRICS:
                row[m], row[f"{m}_low"], row[f"{m}_high"] = _ci(r[m])
            metrics.append(row)
        raw += raw_auroc_rows(g, n_bootstrap=n_raw_bootstrap, seed=seed, scores=raw_scores)
        for a in ours:
            for b in baselines:
                ra, rb = runs.get((ds, model, a)), runs.get((ds, model, b))
                if ra is None or rb is None:
                    continue
                d = ra["auroc"] - rb["auroc"]
                d = d[np.isfinite(d)]
                if not d.size:
                    continue
                lo, hi = np.percentile(d, [2.5, 97.5])
                paired.append({"dataset": ds, "model": model, "method": a, "baseline": b,
                               "runs": int(d.size), "delta_auroc": to_float(d.mean()),
                               "ci_low": to_float(lo), "ci_high": to_float(hi),
                               "p": _p_two_sided(d)})
    _mark_bh(paired, alpha)
    return {"counts": counts, "metrics": metrics, "raw_auroc": raw, "paired": paired,
            "raw_pooled": raw_pooled_rows(groups, n_bootstrap=n_raw_bootstrap, seed=seed,
                                          scores=raw_scores),
            "paired_pooled": paired_pooled_rows(runs, ours, baselines, alpha=alpha)}


def verdict(tables: Mapping[str, list[dict]], ours: Sequence[str] = tuple(OURS)) -> list[str]:
    """Plain-language findings, one line per (dataset, model), from :func:`evidence_tables`:
    the correct answers, the best method by AUROC, whether any gradient method beats the best
    baseline significantly (BH) and the raw direction of epistemic and epistemic_log."""
    lines = []
    for c in tables["counts"]:
        ds, model = c["dataset"], c["model"]
        mets = [m for m in tables["metrics"] if m["dataset"] == ds and m["model"] == model
                and m["auroc"] is not None]
        if not mets:
            continue
        best = max(mets, key=lambda m: m["auroc"])
        base = [m for m in mets if m["method"] not in ours]
        best_base = max(base, key=lambda m: m["auroc"]) if base else None
        pair = [p for p in tables["paired"] if p["dataset"] == ds and p["model"] == model
                and best_base is not None and p["baseline"] == best_base["method"]]
        wins = [p["method"] for p in pair if p["significant"] and p["delta_auroc"] > 0]
        losses = [p["method"] for p in pair if p["significant"] and p["delta_auroc"] < 0]
        raw = {r["score"]: r for r in tables["raw_auroc"]
               if r["dataset"] == ds and r["model"] == model}
        def said(r: Mapping) -> str:
            d = r.get("score_direction", r["direction"])
            return "no direction" if d == "none" else f"{r['score']}: {d}"

        dirs = "; ".join(
            f"raw AUROC of −{s} {raw[s]['auroc']:.3f} [{raw[s]['ci_low']:.3f}, "
            f"{raw[s]['ci_high']:.3f}] ({said(raw[s])})"
            for s in ("epistemic", "epistemic_log") if s in raw and raw[s]["auroc"] is not None)
        line = (f"{model} on {ds}: {c['correct']} of {c['n']} correct; best AUROC {best['method']}"
                f" {best['auroc']:.3f} [{best['auroc_low']:.3f}, {best['auroc_high']:.3f}]")
        if best_base is not None:
            line += (f"; best baseline {best_base['method']} {best_base['auroc']:.3f}; "
                     + (f"significantly above it: {', '.join(wins)}" if wins
                        else "no gradient method significantly above it")
                     + (f"; significantly below it: {', '.join(losses)}" if losses else ""))
        lines.append(line + (f"; {dirs}" if dirs else "") + ".")
    for ds in dict.fromkeys(r["dataset"] for r in tables.get("paired_pooled", [])):
        pp = [r for r in tables["paired_pooled"] if r["dataset"] == ds]
        up, down = (
            [f"{r['method']} {op} {r['baseline']} (Δ {r['delta_auroc']:+.3f}, p_BH "
             f"{r['p_bh']:.3g})" for r in pp if r["significant"] and sign * r["delta_auroc"] > 0]
            for sign, op in ((1, ">"), (-1, "<")))
        raw = {r["score"]: r for r in tables.get("raw_pooled", []) if r["dataset"] == ds}
        dirs = "; ".join(f"pooled raw AUROC of −{s} {raw[s]['auroc']:.3f} [{raw[s]['ci_low']:.3f}, "
                         f"{raw[s]['ci_high']:.3f}]" for s in ("epistemic", "epistemic_log")
                         if s in raw)
        lines.append(f"Pooled over the {pp[0]['models']} models on {ds}: "
                     + (f"significantly above: {', '.join(up)}" if up
                        else "no gradient method significantly above any baseline")
                     + (f"; significantly below: {', '.join(down)}" if down else "")
                     + (f"; {dirs}" if dirs else "") + ".")
    return lines
