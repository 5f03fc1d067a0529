"""The LM-Polygraph benchmark section of ``isouq report``: where isouq's estimators rank among
LM-Polygraph's white-box estimators, computed by LM-Polygraph's own code on the same answers,
and whether a learned P(correct) beats the maximum sequence probability.

Input: the kept files ``results/polygraph/polygraph__<dataset>__<model>.json`` written by
``scripts/polygraph/collect.py`` (``kind: isouq-polygraph``): per question the greedy answer,
its quality under LM-Polygraph's generation metrics (accuracy, ROUGE-L) and every estimator's
uncertainty, plus LM-Polygraph's own UE metrics and each estimator's cost per answer.

Beside each file, ``heads/<dataset>__<model>.json`` (``scripts/polygraph/heads.py``) adds, per
quality metric, isouq's learned heads cross-fitted on the answers (counted as isouq's
estimators) and LM-Polygraph's own train-split estimators cross-fitted on the same folds
(MahalanobisDistanceSeq, RelativeMahalanobisDistanceSeq, RDESeq, PPLMDSeq: counted as
LM-Polygraph's), the heads transferred from the model's other dataset, and a control (MSP's own
map cross-fitted as the heads are: what cross-fitting itself costs) and a supervised anchor (a
probe on the answer's hidden state, ``learned_heads.PROBE``: ranked beside the estimators,
marked †, counted as neither side's); the table "learned P(correct) against MSP" compares each head, the
control and the anchor with MaximumSequenceProbability on the same answers. Where a verdict
with repeated fold seeds is kept beside the files (``verdict/verdict.json`` of
``scripts/polygraph/prereg_verdict.py``), the section shows it and that table gives no verdict
of its own (one fold seed).

The section recomputes PRR with LM-Polygraph's formula
(``evaluation.rejection.prediction_rejection_area``, equal to its
``PredictionRejectionArea`` on the kept values) to put bootstrap intervals on it (questions
resampled, every estimator on the same resample), ranks isouq's best estimator among
LM-Polygraph's, and says in plain words what the ranks show.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...errors import DataError
from ...evaluation.rejection import prediction_rejection_area as prr
from .document import Block, Section, unique_slug
from .tables import format_value, make_table

KIND = "isouq-polygraph"
PREFIX = "polygraph__"
METRIC_NAMES = {"Accuracy": "accuracy", "Rouge_rougeL": "ROUGE-L"}
#: fewer answers of a class than this (or one quality value only): no verdict on the ranks
MIN_CORRECT = 30


# --------------------------------------------------------------------------- files
def is_polygraph_file(path: Path) -> bool:
    """Whether ``path`` is named like a kept LM-Polygraph benchmark file."""
    return path.name.startswith(PREFIX) and path.name.endswith(".json")


def polygraph_files(path: Path) -> list[Path]:
    """The benchmark files at or under ``path`` (a file or a folder)."""
    if path.is_file():
        return [path] if is_polygraph_file(path) else []
    if path.is_dir():
        return sorted(p for p in path.rglob(f"{PREFIX}*.json") if p.is_file())
    return []


def load_polygraph(path: Path) -> dict:
    """Read one kept benchmark file; DataError naming what is wrong."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: cannot read the LM-Polygraph results ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise DataError(f"{path} is not an LM-Polygraph benchmark file (kind {KIND!r}); "
                        "write it with scripts/polygraph/collect.py")
    for key in ("dataset", "model", "questions", "estimators", "quality_metrics"):
        if key not in doc:
            raise DataError(f"{path}: no {key!r}; rebuild it with scripts/polygraph/collect.py")
    return doc


# --------------------------------------------------------------------------- statistics
def _matrix(doc: Mapping, estimators: Sequence[str]) -> np.ndarray:
    extra = doc.get("_extra_ue", {})
    cols = [np.asarray(extra[e], dtype=float) if e in extra else
            np.array([np.nan if q["ue"].get(e) is None else q["ue"][e]
                      for q in doc["questions"]], dtype=float) for e in estimators]
    return np.stack(cols, axis=1)


MSP = "MaximumSequenceProbability"
#: the learned head the other cross-fitted heads and the supervised anchor are also held
#: against, on the same answers: isouq's head on its one backward (its scores, MSP's quantity
#: and the block profile)
REFERENCE_HEAD = "isouq block head"
#: the marks of isouq's estimators and of one that is neither isouq's nor LM-Polygraph's (a
#: supervised anchor) in the tables
OURS_MARK, ANCHOR_MARK = "★ ", "† "


def heads_path(path: Path, doc: Mapping) -> Path:
    """Where the learned heads of a kept benchmark file are (``scripts/polygraph/heads.py``)."""
    return Path(path).parent / "heads" / f"{doc['dataset']}__{doc['model']}.json"


def load_matching(path: Path, doc: Mapping, rerun: str) -> dict | None:
    """A file of values per answer kept beside the benchmark file ``doc`` (its ``keys`` in
    ``doc``'s question order): None when there is none; DataError naming the script to
    ``rerun`` when it holds other answers."""
    path = Path(path)
    if not path.exists():
        return None
    got = json.loads(path.read_text(encoding="utf-8"))
    if got.get("keys") != [q["key"] for q in doc["questions"]]:
        raise DataError(f"{path} holds other answers than the kept results of "
                        f"{doc['model']} × {doc['dataset']}; run {rerun} again")
    return got


def load_heads(path: Path, doc: Mapping) -> dict | None:
    """The heads file of ``doc`` (None when there is none); DataError when it is of other
    answers."""
    return load_matching(heads_path(path, doc), doc, "scripts/polygraph/heads.py")


def with_extra(doc: Mapping, heads: Mapping | None, metric: str) -> dict:
    """``doc`` for one quality metric with the heads file's columns among its estimators:
    LM-Polygraph's train-split estimators (theirs), isouq's cross-fitted heads (ours) and the
    supervised anchors (``anchor_estimators``: neither side's), on the answers whose features
    could be rebuilt (the others, a few per setting whose kept text does not tokenize back to
    its kept length, have no learned value and are left out for every estimator)."""
    if heads is None:
        return dict(doc)
    extra = {e: [np.nan if v is None else v for v in vals]
             for e, vals in heads.get("density", {}).items()}
    mine = heads["metrics"].get(metric, {}).get("cross_fitted", {})
    anchors = heads["metrics"].get(metric, {}).get("anchors", {})
    extra |= {h: [np.nan if v is None else v for v in vals]
              for h, vals in {**mine, **anchors}.items()}
    # the answers whose features were rebuilt (any column has a value): every estimator is
    # ranked on those, so a learned one is not judged on answers it could not see
    have = np.isfinite(np.asarray(list(extra.values()), dtype=float)).any(axis=0) \
        if extra else np.ones(len(doc["questions"]), dtype=bool)
    if not have.any():
        have[:] = True
    return {**doc, "questions": [q for q, h in zip(doc["questions"], have, strict=True) if h],
            "estimators": [*doc["estimators"], *extra],
            "isouq_estimators": [*doc.get("isouq_estimators", ()), *mine],
            "anchor_estimators": list(anchors),
            "_extra_ue": {e: np.asarray(v, dtype=float)[have] for e, v in extra.items()}}


def _quality(doc: Mapping, metric: str) -> np.ndarray:
    return np.array([q["quality"].get(metric, np.nan) for q in doc["questions"]], dtype=float)


def _ranks(values: np.ndarray) -> np.ndarray:
    """1 = highest PRR (ties share the better rank), along the last axis."""
    return (values[..., None, :] > values[..., :, None]).sum(-1) + 1


def setting_stats(doc: Mapping, metric: str, *, n_bootstrap: int = 300, seed: int = 0) -> dict:
    """PRR of every estimator on one (model, dataset, quality metric), point and bootstrap."""
    ests = list(doc["estimators"])
    ue, q = _matrix(doc, ests), _quality(doc, metric)
    point = np.array([prr(ue[:, j], q) for j in range(len(ests))])
    rng = np.random.default_rng(seed)
    n = len(q)
    boot = np.empty((n_bootstrap, len(ests)))
    for b in range(n_bootstrap):
        idx = rng.integers(0, n, n)
        boot[b] = [prr(ue[idx, j], q[idx]) for j in range(len(ests))]
    finite = q[~np.isnan(q)]
    binary = bool(np.isin(finite, (0.0, 1.0)).all())
    correct = int(finite.sum()) if binary else None
    right = int((finite >= 0.5).sum())  # a fractional quality counts as correct at ≥ 0.5
    degenerate = len(np.unique(finite)) < 2 or min(right, len(finite) - right) < MIN_CORRECT
    return {"estimators": ests, "point": point, "boot": boot, "n": n, "binary": binary,
            "correct": correct, "mean_quality": float(finite.mean()) if len(finite) else None,
            "degenerate": degenerate}


def _ci(x: np.ndarray) -> tuple[float, float]:
    lo, hi = np.nanpercentile(x, [2.5, 97.5])
    return float(lo), float(hi)


def _pm(v: float, lo: float, hi: float) -> str:
    return f"{format_value(v)} [{format_value(lo)}, {format_value(hi)}]"


def rank_row(doc: Mapping, metric: str, st: Mapping) -> dict:
    """isouq's best estimator against LM-Polygraph's: rank, PRR and difference, with intervals."""
    ests, point, boot = st["estimators"], st["point"], st["boot"]
    ours = [j for j, e in enumerate(ests) if e in set(doc.get("isouq_estimators", ()))]
    anchors = set(doc.get("anchor_estimators", ()))
    theirs = [j for j, e in enumerate(ests) if j not in ours and e not in anchors]
    row = {"model": doc["model"], "dataset": doc["dataset"],
           "quality": METRIC_NAMES.get(metric, metric), "n": st["n"],
           "answers": (f"{st['correct']} correct" if st["binary"]
                       else f"mean {format_value(st['mean_quality'])}")}
    if not ours or not theirs:
        return {**row, "verdict": "no isouq or no LM-Polygraph estimator in this file"}
    best_ours = max(ours, key=lambda j: point[j])
    best_theirs = max(theirs, key=lambda j: point[j])
    cols = [best_ours, *theirs]
    rank = int(_ranks(point[cols])[0])
    rank_b = _ranks(boot[:, cols])[:, 0]
    diff = boot[:, best_ours] - boot[:, best_theirs]
    lo_d, hi_d = _ci(diff)
    row.update({
        "isouq best": ests[best_ours],
        "its PRR [95% CI]": _pm(point[best_ours], *_ci(boot[:, best_ours])),
        "rank (of estimators)": f"{rank} of {len(cols)}",
        "rank 95% CI": f"{int(np.percentile(rank_b, 2.5))}–{int(np.percentile(rank_b, 97.5))}",
        "best LM-Polygraph": ests[best_theirs],
        "its PRR": _pm(point[best_theirs], *_ci(boot[:, best_theirs])),
        "difference [95% CI]": _pm(point[best_ours] - point[best_theirs], lo_d, hi_d),
    })
    if st["degenerate"]:
        what = (f"{st['correct']} correct answer(s) of {st['n']}" if st["binary"]
                else f"fewer than {MIN_CORRECT} answers of a class (quality ≥ 0.5)")
        row["verdict"] = f"not rankable: {what}"
    elif rank == 1:
        row["verdict"] = ("first; ahead of the best LM-Polygraph estimator beyond noise"
                          if lo_d > 0 else "first, within noise of the best LM-Polygraph one")
    elif hi_d < 0:
        row["verdict"] = "below the best LM-Polygraph estimator (interval excludes 0)"
    else:
        row["verdict"] = "within noise of the best LM-Polygraph estimator"
    row["_rank"], row["_of"], row["_lo"], row["_hi"] = rank, len(cols), lo_d, hi_d
    return row


def estimator_rows(doc: Mapping, metric: str, st: Mapping) -> list[dict]:
    """Every estimator: PRR with its bootstrap interval, rank, LM-Polygraph's own UE metrics and
    the cost per answer, best PRR first."""
    ests, point, boot = st["estimators"], st["point"], st["boot"]
    ranks = _ranks(point)
    lm = doc.get("lm_polygraph_metrics", {})
    cost = doc.get("cost", {}).get("estimators", {})
    rows = []
    for j in np.argsort(-point, kind="stable"):
        e = ests[j]
        m = lm.get(e, {}).get(metric, {})
        rows.append({
            "model": doc["model"], "dataset": doc["dataset"],
            "quality": METRIC_NAMES.get(metric, metric), "rank": int(ranks[j]),
            "estimator": (OURS_MARK if e in doc.get("isouq_estimators", ()) else
                          ANCHOR_MARK if e in doc.get("anchor_estimators", ()) else "") + e,
            "PRR [95% CI]": _pm(point[j], *_ci(boot[:, j])),
            "PRR (LM-Polygraph)": m.get("prr"), "normalized PRR": m.get("prr_normalized"),
            "PRR@50%": m.get("prr_0.5"), "ECE": m.get("ece"),
            "s / answer": cost.get(e, {}).get("s_per_answer"),
            "median batch s / answer": cost.get(e, {}).get("median_batch_s_per_answer"),
        })
    return rows


def _seconds(total, median) -> str:
    if total is None:
        return format_value(None)
    return format_value(total) + ("" if median is None else f" ({format_value(median)})")


def cost_rows(docs: Sequence[Mapping]) -> list[dict]:
    """Seconds per answer beyond LM-Polygraph's shared greedy generation, per estimator:
    total / answers, and in brackets the median over batches."""
    rows = []
    for d in docs:
        c = d.get("cost", {})
        row = {"model": d["model"], "dataset": d["dataset"],
               "greedy generation (shared)": _seconds(c.get("generation_s_per_answer"),
                                                      c.get("generation_median_batch_s_per_answer"))}
        for e in d["estimators"]:
            ce = c.get("estimators", {}).get(e, {})
            row[e] = _seconds(ce.get("s_per_answer"), ce.get("median_batch_s_per_answer"))
        rows.append(row)
    return rows


def verdict(ranks: Sequence[Mapping]) -> str:
    """The plain-words summary of the rank rows, whatever they say."""
    ok = [r for r in ranks if "_rank" in r and not r["verdict"].startswith("not rankable")]
    skipped = [r for r in ranks if r not in ok]
    if not ok:
        return ("Verdict: no setting could rank the estimators (too few correct answers or no "
                "finished run), so these results say nothing yet about where isouq stands.")
    first = [r for r in ok if r["_rank"] == 1]
    below = [r for r in ok if r["_hi"] < 0]
    tie = [r for r in ok if r not in below]
    worst = max(ok, key=lambda r: r["_rank"] / r["_of"])
    ahead = [r for r in ok if r["_lo"] > 0]
    parts = [f"Verdict: over {len(ok)} rankable setting(s) (model × dataset × quality metric), "
             f"isouq's best estimator has the highest PRR in {len(first)}; against the best "
             f"LM-Polygraph estimator its PRR is ahead beyond bootstrap noise (95% interval of "
             f"the difference above 0) in {len(ahead)}, within noise in "
             f"{len(tie) - len(ahead)} and below (interval under 0) in {len(below)}."]
    if below:
        parts.append(f"Its weakest place: {worst['rank (of estimators)']} "
                     f"({worst['model']}, {worst['dataset']}, {worst['quality']}).")
    if skipped:
        parts.append(f"{len(skipped)} setting(s) could not be ranked (too few correct answers "
                     "for PRR to order anything).")
    small = min(r["n"] for r in ok)
    if small < 200:
        parts.append(f"The smallest setting has {small} questions: intervals that wide separate "
                     "only large differences, so 'within noise' here is weak evidence of a tie.")
    parts.append("Choosing isouq's best of its four scores after the fact flatters it; the "
                 "full tables give each score's own rank.")
    return " ".join(parts)


def polygraph_tables(docs: Sequence[Mapping], *, n_bootstrap: int = 300, seed: int = 0,
                     heads: Sequence[Mapping | None] | None = None) -> dict[str, list[dict]]:
    """The section's tables as plain rows: ``ranks`` (isouq's best per setting), ``estimators``
    (every estimator per setting), ``cost`` (seconds per answer) and, with ``heads`` (one heads
    file or None per doc), ``heads`` (each learned head against MSP)."""
    ranks, per, vs_msp = [], [], []
    heads = list(heads) if heads is not None else [None] * len(docs)
    for d, h in zip(docs, heads, strict=True):
        for metric in d["quality_metrics"]:
            dm = with_extra(d, h, metric)
            st = setting_stats(dm, metric, n_bootstrap=n_bootstrap, seed=seed)
            ranks.append(rank_row(dm, metric, st))
            per += estimator_rows(dm, metric, st)
            if h is not None:
                vs_msp += head_rows(d, h, metric, n_bootstrap=n_bootstrap, seed=seed)
    return {"ranks": ranks, "estimators": per, "cost": cost_rows(docs),
            "heads": judge_heads(vs_msp)}


#: the quality metric a dataset's verdict is counted on (the other is reported beside it):
#: TriviaQA's exact-match accuracy, TruthfulQA's ROUGE-L (a fractional label)
PRIMARY = {"triviaqa": "Accuracy", "truthfulqa": "Rouge_rougeL"}


def counted(dataset: str, metric: str) -> bool:
    """Whether a setting's verdict counts: its dataset's primary quality (one verdict per
    answer set), or the only metric of a dataset without one."""
    return PRIMARY.get(dataset, metric) == metric


def head_rows(doc: Mapping, heads: Mapping, metric: str, *, n_bootstrap: int = 1000,
              seed: int = 0) -> list[dict]:
    """Each learned head (cross-fitted, and transferred from the other dataset) and the
    supervised anchors against MSP's own map (the control, ``learned_heads.CONTROL``: MSP made
    a probability on the heads' folds; LM-Polygraph's MSP where a heads file has none), on
    the same answers (those both have a value for): PRR and AUROC, each difference with its
    95% bootstrap interval and p-value (``evaluation.verdict.paired_difference``: answers
    resampled, one fold seed), and whether the row is ``counted`` (its dataset's primary
    quality) and ``rankable`` (≥ 30 answers of each class). Verdicts come from
    :func:`judge_heads`, over answer sets."""
    from ...evaluation import verdict as V
    from ..analysis.learned_heads import CONTROL

    q = _quality(doc, metric)
    m = heads["metrics"].get(metric, {})
    control = m.get("control", {}).get(CONTROL.name)
    ref_name = CONTROL.name if control is not None else MSP
    # as a P(correct): the heads file keeps uncertainties (1 − P(correct)); MSP's own value
    # already ranks as one
    msp = (1.0 - np.array([np.nan if v is None else v for v in control], dtype=float)
           if control is not None else -_matrix(doc, [MSP])[:, 0])
    cols = {**m.get("cross_fitted", {}), **m.get("transfer", {}), **m.get("anchors", {})}
    if ref_name != CONTROL.name:
        cols |= m.get("control", {})
    ref_head = m.get("cross_fitted", {}).get(REFERENCE_HEAD)
    ok = V.rankable(q[~np.isnan(q)])

    def p_correct(vals) -> np.ndarray:  # a head's value is its uncertainty 1 − P(correct)
        return 1.0 - np.array([np.nan if v is None else v for v in vals], dtype=float)

    def diff(a, b, name, against):
        where = {"model": doc["model"], "dataset": doc["dataset"],
                 "quality": METRIC_NAMES.get(metric, metric), "labels": m.get("labels"),
                 "head": name, "against": against, "counted": counted(doc["dataset"], metric)}
        both = ~(np.isnan(a) | np.isnan(b) | np.isnan(q))
        if both.sum() < 2:
            return {**where, "rankable": False,
                    "note": f"no answers with values of both ({against})"}
        (row,) = V.compare({name: a[both], against: b[both]}, q[both], [(name, against)],
                           n_bootstrap=n_bootstrap, seed=seed)
        return {**where, **{k: v for k, v in row.items() if k not in ("predictor", "rankable")},
                "rankable": ok}

    rows = []
    for name, vals in cols.items():
        u = p_correct(vals)
        if np.isnan(u).all():
            rows.append({"model": doc["model"], "dataset": doc["dataset"],
                         "quality": METRIC_NAMES.get(metric, metric), "head": name,
                         "against": ref_name, "counted": counted(doc["dataset"], metric),
                         "rankable": False, "note": "no head could be fitted"})
            continue
        rows.append(diff(u, msp, name, ref_name))
        judged_too = name in m.get("anchors", {}) or name in m.get("cross_fitted", {})
        if judged_too and name != REFERENCE_HEAD and ref_head is not None:
            rows.append(diff(u, p_correct(ref_head), name, REFERENCE_HEAD))
    return rows


def judge_heads(rows: Sequence[Mapping]) -> list[dict]:
    """The verdicts of :func:`head_rows`' rows: for each (head, reference), Holm's correction
    over the answer sets it is counted and rankable on (``evaluation.verdict.judge``); the
    other rows get no verdict (``verdict`` None: not counted, or not rankable)."""
    from ...evaluation import verdict as V

    out = [dict(r) for r in rows]
    families: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(out):
        families.setdefault((r["head"], r["against"]), []).append(i)
    for idx in families.values():
        fam = [{**out[i], "rankable": bool(out[i].get("counted") and out[i].get("rankable")
                                           and "delta" in out[i])} for i in idx]
        for i, j in zip(idx, V.judge(fam), strict=True):
            out[i].update(p_holm=j["p_holm"], verdict=j["verdict"], family=j["family"])
    return out


def head_table(rows: Sequence[Mapping], *, judged: bool = True) -> list[dict]:
    """The heads rows as the report shows them (numbers with their intervals); with ``judged``
    False (a verdict with repeated fold seeds is kept beside them) without Holm's p and the
    verdict: what is left is descriptive."""
    def pm(r, key):
        return _pm(r[key], r[f"ci_low{key[5:]}"], r[f"ci_high{key[5:]}"]) if key in r else ""

    def why(r):
        return r.get("note") or ("reported, not counted" if not r.get("counted") else
                                 "not rankable (< 30 of a class)")

    out = []
    for r in rows:
        row = {"model": r["model"], "dataset": r["dataset"], "quality": r["quality"],
               "head": r["head"], "against": r["against"], "PRR": format_value(r.get("PRR")),
               "Δ PRR [95% CI]": pm(r, "delta"), "AUROC": format_value(r.get("AUROC")),
               "Δ AUROC [95% CI]": pm(r, "delta_auroc")}
        if judged:
            row |= {"Holm p": format_value(r.get("p_holm")), "verdict": r.get("verdict") or why(r)}
        elif not (r.get("counted") and r.get("rankable") and "delta" in r):
            row["note"] = why(r)
        out.append(row)
    return out


def load_verdict(folder: Path) -> dict | None:
    """The verdict kept in ``folder/verdict/verdict.json`` (``scripts/polygraph/
    prereg_verdict.py``: repeated fold seeds, Holm), or None when there is none."""
    path = Path(folder) / "verdict" / "verdict.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def verdict_table(doc: Mapping) -> list[dict]:
    """A kept verdict (:func:`load_verdict`) as table rows, one per answer set: the isouq
    head's PRR, then for each comparison Δ PRR with its 95% interval, Holm's p and the verdict
    (and Δ AUROC beside the first comparison); "n/a" where a set had too few of a class to fit.
    """
    def num(x, signed=False):
        return "n/a" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}").replace("-", "−")

    def ci(r, suffix=""):
        if r.get("delta" + suffix) is None:   # not fitted: too few of a class
            return "n/a"
        d, lo, hi = (r[k + suffix] for k in ("delta", "ci_low", "ci_high"))
        return f"{num(d, True)} [{num(lo, True)}, {num(hi, True)}]"

    against = list(dict.fromkeys(r["against"] for r in doc["rows"]))
    by_set: dict[tuple, dict] = {}
    for r in doc["rows"]:
        by_set.setdefault((r["model"], r["dataset"]), {})[r["against"]] = r
    out = []
    for (model, dataset), got in by_set.items():
        first = next(iter(got.values()))
        row = {"answer set": f"{model} × {dataset}", "quality": first["metric"],
               "correct / wrong": f"{first['correct']} / {first['wrong']}",
               "isouq head PRR": num(first["PRR"])}
        for i, b in enumerate(against):
            r = got.get(b, {})
            row |= {f"vs {b}: Δ PRR [95% CI]": ci(r) if r else "–",
                    f"vs {b}: Holm p": num(r.get("p_holm")) if r else "–",
                    f"vs {b}: verdict": (r.get("verdict") or "not rankable") if r else "–"}
            if i == 0:
                row[f"vs {b}: Δ AUROC [95% CI]"] = ci(r, "_auroc") if r else "–"
        out.append(row)
    return out


def verdict_groups(rows: Sequence[Mapping], against: str | None = None
                   ) -> tuple[list[Mapping], list[Mapping], list[Mapping]]:
    """Judged heads rows split by verdict, (ahead, within noise, below), against ``against``
    (default: MSP's map); rows without a verdict are in none."""
    from ...evaluation import verdict as V
    from ..analysis.learned_heads import CONTROL

    against = against or CONTROL.name
    mine = [r for r in rows if r.get("against") == against]
    return tuple([r for r in mine if r.get("verdict") == v] for v in V.VERDICTS)


def verdict_counts(rows: Sequence[Mapping], against: str | None = None
                   ) -> tuple[int, int, int]:
    """(ahead, within noise, below): the sizes of :func:`verdict_groups`."""
    return tuple(len(g) for g in verdict_groups(rows, against))


# --------------------------------------------------------------------------- section
def polygraph_section(found: Sequence[tuple[Path, Mapping]], taken: set[str], *,
                      n_bootstrap: int = 300, seed: int = 0) -> tuple[Section, dict]:
    """The report section and its plain tables, from ``(path, doc)`` pairs."""
    docs = [d for _, d in found]
    heads = [load_heads(p, d) for p, d in found]
    tables = polygraph_tables(docs, n_bootstrap=n_bootstrap, seed=seed, heads=heads)
    sid = unique_slug("lm-polygraph-benchmark", taken)
    shown_ranks = [{k: v for k, v in r.items() if not k.startswith("_")}
                   for r in tables["ranks"]]
    partial = [d for d in docs if not d.get("complete")]
    v = next(iter(docs), {}).get("versions", {})
    meta = {
        "files": ", ".join(str(p) for p, _ in found),
        "settings": "; ".join(f"{d['model']} × {d['dataset']}: {d.get('n_questions')} questions"
                              + ("" if d.get("complete") else
                                 f" (PARTIAL, of {d.get('target_questions')})") for d in docs),
        "LM-Polygraph": str(v.get("lm-polygraph", "?")),
        "bootstrap": f"{n_bootstrap} resamples of the questions, seed {seed}",
    }
    machines = {d.get("cost", {}).get("machine") for d in docs} - {None}
    if machines:
        meta["timed on"] = "; ".join(sorted(machines))
    notes = [verdict(tables["ranks"])]
    folders = {Path(p).parent for p, _ in found}
    kept = load_verdict(folders.pop()) if len(folders) == 1 else None
    if kept is not None:
        notes.append(
            f"The verdict ({kept['preregistration']['path']}'s rule"
            + (", applied to these answers" if kept.get("design_set") else "")
            + f"): the isouq head against MSP's map and against the forward-only head, each "
            f"cross-fitted on {len(kept['seeds'])} fold seeds, by a paired bootstrap over "
            "answers and fold seeds, Holm's correction over the answer sets; "
            f"{kept['answer_sets_judged']} of {kept['answer_sets_expected']} answer sets judged. "
            "The learned P(correct) table beside it holds one fold seed: descriptive, no "
            "verdict.")
    if tables["heads"]:
        notes.append(
            "Learned P(correct) against MSP's own map (MSP made a probability on the heads' "
            "folds), on each dataset's primary quality (TriviaQA accuracy, TruthfulQA ROUGE-L; "
            "the other is reported, not counted), only with at least 30 answers of each class; "
            "PRR differences by a paired bootstrap over the answers (one fold seed)"
            + ("." if kept is not None else
               ", Holm's correction over the answer sets of each head.")
            + " Where these are design-set answers the heads were designed after results on "
            "them had been seen; the pre-registered verdicts on fresh questions are in "
            "results/polygraph_prereg*/verdict/.")
    if partial:
        notes.append("PARTIAL: " + ", ".join(f"{d['model']} × {d['dataset']} has "
                                             f"{d.get('n_questions')} of "
                                             f"{d.get('target_questions')} questions"
                                             for d in partial)
                     + "; scripts/polygraph_benchmark.sh continues the run where it stopped.")
    notes += [
        "PRR: LM-Polygraph's prediction-rejection area (higher is better), recomputed here with "
        "its formula to bootstrap it; 'PRR (LM-Polygraph)', normalized PRR, PRR@50% and ECE are "
        "LM-Polygraph's own numbers. ★ marks isouq's estimators, † a supervised anchor that is "
        "neither side's (a logistic probe on the answer's mean hidden state at a layer chosen "
        "per fold, cross-fitted on the heads' folds). The rank of isouq's best counts it among "
        "LM-Polygraph's estimators only.",
        "Cost: seconds per answer of the calculators each estimator needs beyond LM-Polygraph's "
        "shared greedy generation, plus its own, from the same run (log_time): total over "
        "answers, every process's first-batch warm-up included, and in brackets the median "
        "over batches; isouq's four scores share one calculator (one backward per batch).",
    ]
    left_out = next((d.get("left_out") for d in docs if d.get("left_out")), None)
    if left_out:
        notes.append("Left out: " + "; ".join(f"{k} ({v})" for k, v in left_out.items()) + ".")
    blocks = (
        Block(make_table("polygraph_ranks", shown_ranks,
                         title="isouq's rank among LM-Polygraph's estimators (PRR)")),
        Block(make_table("polygraph_estimators", tables["estimators"],
                         title="Every estimator: PRR with 95% bootstrap interval, "
                               "LM-Polygraph's metrics, cost")),
        Block(make_table("polygraph_cost", tables["cost"],
                         title="Cost per answer (seconds) beyond the shared greedy generation")),
        *((Block(make_table("polygraph_verdict", verdict_table(kept),
                            title="The verdict: isouq head against MSP's map and the "
                                  "forward-only head (repeated fold seeds, Holm)")),)
          if kept is not None and kept["rows"] else ()),
        *((Block(make_table("polygraph_heads", head_table(tables["heads"],
                                                          judged=kept is None),
                            title="Learned P(correct) against MSP (cross-fitted"
                                  + (", one fold seed" if kept is not None else "")
                                  + "; transferred from the other dataset)")),)
          if tables["heads"] else ()),
    )
    section = Section(id=sid, title="LM-Polygraph benchmark: isouq among white-box estimators",
                      source=meta["files"], meta=meta, notes=tuple(notes), blocks=blocks)
    if kept is not None:   # the heads rows' one-seed verdicts give way to the kept one
        tables["heads"] = [{k: v for k, v in r.items() if k not in ("p_holm", "verdict", "family")}
                           for r in tables["heads"]]
        tables["verdict"] = kept["rows"]
    return section, {**tables, "ranks": shown_ranks}
