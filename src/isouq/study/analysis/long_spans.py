"""Tables of ``isouq qa long``: do span scores find the wrong sentences of a long answer?

Input: one row per labelled sentence (:func:`sentence_rows` builds them from the answer rows of
``qa.long``): ``setting``, ``model``, ``answer`` (the key of the answer it belongs to),
``wrong`` (0/1, alias match), ``span`` (its span scores: ``epistemic``, ``epistemic_log``,
``aleatoric``, ``mean_prob``, ``min_prob``) and ``whole`` (the whole answer's, the same for
every sentence of an answer).

Every score is read as an uncertainty, oriented before any label is seen: the gradient and
aleatoric scores as they are, probabilities as 1 − p (:data:`SCORES`). AUROC (Mann–Whitney,
``auroc.auroc``) for the wrong sentences: 0.5 = chance, above = the score is higher on wrong
sentences, below = it points the wrong way. Intervals: 95% percentile bootstrap over
**answers** (the sentences of one answer are resampled together: they share a prompt, a context
and the whole-answer scores, so resampling sentences alone would give intervals too narrow).
Paired: each span score against each baseline, ΔAUROC over the same resamples, two-sided
bootstrap p, Benjamini–Hochberg adjusted over the table. Within answers (those with wrong and
correct sentences): how often the sentence a score ranks highest is a wrong one, against the
share of wrong sentences in those answers (what a random pick gets). Pooled over the models of a
setting (two or more), each model weighing the same: the mean AUROC over the models, resample r
of the mean being the mean of every model's resample r (independent draws), and the mean paired
ΔAUROC likewise, BH-adjusted over the pooled table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...evaluation.auroc import auroc
from ...evaluation.rows import group_rng, to_float
from ...evaluation.significance import bh_adjust


@dataclass(frozen=True)
class Score:
    """One score of a sentence: its table ``name``, ``family`` (span score, span baseline,
    whole answer), where it is read (``source``: ``span`` or ``whole``, and ``key``) and
    ``flip``: read as 1 − value (a probability), else as it is."""

    name: str
    family: str
    source: str
    key: str
    flip: bool = False

    def value(self, row: Mapping) -> float:
        v = (row.get(self.source) or {}).get(self.key)
        if v is None:
            return float("nan")
        return 1.0 - float(v) if self.flip else float(v)


SPAN_SCORE = "span score"
SPAN_BASELINE = "span baseline"
WHOLE = "whole answer"
SCORES: tuple[Score, ...] = (
    Score("span epistemic", SPAN_SCORE, "span", "epistemic"),
    Score("span epistemic_log", SPAN_SCORE, "span", "epistemic_log"),
    Score("span aleatoric", SPAN_SCORE, "span", "aleatoric"),
    Score("span 1 − p̄", SPAN_BASELINE, "span", "mean_prob", flip=True),
    Score("span 1 − min p", SPAN_BASELINE, "span", "min_prob", flip=True),
    Score("whole epistemic", WHOLE, "whole", "epistemic"),
    Score("whole epistemic_log", WHOLE, "whole", "epistemic_log"),
    Score("whole aleatoric", WHOLE, "whole", "aleatoric"),
    Score("whole 1 − p̄", WHOLE, "whole", "mean_prob", flip=True),
    Score("whole 1 − min p", WHOLE, "whole", "min_prob", flip=True),
)
"""normalized_epistemic (epistemic / ‖θ*‖², one constant per model) ranks as epistemic: the
same AUROC, not repeated."""


LABELS = ("alias_match", "no_echo")


def sentence_rows(answer_rows: Iterable[Mapping], label: str = "alias_match") -> list[dict]:
    """One row per labelled sentence of ``qa.long`` answer rows (``setting``, ``model``,
    ``answer``, ``index``, ``wrong``, ``span``, ``whole``). ``label``: ``alias_match`` (the
    sentence's ``correct``) or ``no_echo`` (a sentence correct only through an alias the
    question itself contains, ``echo``, counted wrong)."""
    if label not in LABELS:
        raise ValueError(f"label={label!r}: use one of {LABELS}")
    out = []
    for a in answer_rows:
        for s in a.get("sentences") or []:
            if s.get("correct") is None or not s.get("scores"):
                continue
            ok = int(s["correct"]) and not (label == "no_echo" and s.get("echo"))
            out.append({"setting": a["setting"], "model": a["model"], "answer": a["key"],
                        "index": s["index"], "wrong": 1 - int(ok),
                        "span": s["scores"], "whole": a.get("whole") or {}})
    return out


def _groups(rows: Sequence[Mapping]) -> dict[tuple[str, str], list[Mapping]]:
    out: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        out.setdefault((str(r["setting"]), str(r["model"])), []).append(r)
    return out


def _direction(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "–"
    return "higher = wrong" if lo > 0.5 else "higher = correct" if hi < 0.5 else "none"


def _p_two_sided(d: np.ndarray) -> float:
    return min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (d.size + 1))


def cluster_resamples(clusters: Sequence, n_bootstrap: int, rng: np.random.Generator
                      ) -> list[np.ndarray]:
    """``n_bootstrap`` resamples of row indices, drawing whole clusters with replacement.

    clusters: (n,) the cluster (answer) of each row. Returns index arrays (a cluster drawn
    twice gives its rows twice)."""
    keys = list(dict.fromkeys(clusters))
    members = {k: [] for k in keys}
    for i, c in enumerate(clusters):
        members[c].append(i)
    idx = [np.asarray(members[k]) for k in keys]
    out = []
    for _ in range(n_bootstrap):
        pick = rng.integers(0, len(keys), len(keys))
        out.append(np.concatenate([idx[j] for j in pick]))
    return out


def _boot_aurocs(y: np.ndarray, x: np.ndarray, draws: Sequence[np.ndarray]) -> np.ndarray:
    out = np.full(len(draws), np.nan)
    for b, i in enumerate(draws):
        yi, xi = y[i], x[i]
        ok = np.isfinite(xi)
        if 0 < yi[ok].sum() < ok.sum():
            out[b] = auroc(yi[ok], xi[ok])
    return out


def _ci(v: np.ndarray) -> tuple[float | None, float | None]:
    v = v[np.isfinite(v)]
    if not v.size:
        return None, None
    lo, hi = np.percentile(v, [2.5, 97.5])
    return to_float(lo), to_float(hi)


def long_tables(rows: Sequence[Mapping], *, n_bootstrap: int = 1000, seed: int = 0,
                alpha: float = 0.05, scores: Sequence[Score] = SCORES) -> dict[str, list[dict]]:
    """Sentence rows -> {"counts", "auroc", "paired", "within", "pooled", "paired_pooled"}
    (module doc), per (setting, model) and pooled over the models of a setting.

    Args:
        rows: :func:`sentence_rows` output.
        n_bootstrap: resamples of the answers for the intervals and the paired tests.
        seed: seed of the resampling (one stream per (setting, model)).
        alpha: BH false-discovery rate of ``paired``.
        scores: the scores to evaluate (default :data:`SCORES`).

    Returns:
        ``counts``: {setting, model, answers, sentences, wrong, correct}; ``auroc``: {setting,
        model, score, family, n, auroc, ci_low, ci_high, direction}; ``paired``: {setting,
        model, score, baseline, delta_auroc, ci_low, ci_high, p, p_bh, significant};
        ``within``: {setting, model, score, answers, top_is_wrong, chance}; ``pooled`` and
        ``paired_pooled``: the same per setting over its models (two or more), each model
        weighing the same (:func:`_pooled`). A (setting, model) whose sentences are all wrong
        or all correct gets counts only.
    """
    counts, table, paired, within = [], [], [], []
    kept: dict[str, dict[str, tuple[float, np.ndarray]]] = {}  # setting -> "model|score" -> …
    for (setting, model), rs in _groups(rows).items():
        y = np.array([int(r["wrong"]) for r in rs])
        answers = [r["answer"] for r in rs]
        counts.append({"setting": setting, "model": model, "answers": len(set(answers)),
                       "sentences": len(rs), "wrong": int(y.sum()),
                       "correct": int(len(rs) - y.sum())})
        if not 0 < y.sum() < y.size:
            continue
        draws = cluster_resamples(answers, n_bootstrap, group_rng(seed, "long", setting, model))
        cols = {s.name: np.array([s.value(r) for r in rs]) for s in scores}
        boots, point = {}, {}
        for s in scores:
            x = cols[s.name]
            ok = np.isfinite(x)
            if not ok.any():
                continue
            a = point[s.name] = auroc(y[ok], x[ok])
            boots[s.name] = _boot_aurocs(y, x, draws)
            kept.setdefault(setting, {})[f"{model}|{s.name}"] = (a, boots[s.name])
            lo, hi = _ci(boots[s.name])
            table.append({"setting": setting, "model": model, "score": s.name,
                          "family": s.family, "n": int(ok.sum()), "auroc": to_float(a),
                          "ci_low": lo, "ci_high": hi, "direction": _direction(lo, hi)})
        for s in (s for s in scores if s.family == SPAN_SCORE and s.name in boots):
            for b in (b for b in scores if b.family != SPAN_SCORE and b.name in boots):
                d = boots[s.name] - boots[b.name]
                d = d[np.isfinite(d)]
                if not d.size:
                    continue
                lo, hi = np.percentile(d, [2.5, 97.5])
                paired.append({"setting": setting, "model": model, "score": s.name,
                               "baseline": b.name,
                               "delta_auroc": to_float(point[s.name] - point[b.name]),
                               "ci_low": to_float(lo), "ci_high": to_float(hi),
                               "p": _p_two_sided(d)})
        within += _within(setting, model, rs, y, cols, scores)
    pooled, paired_pooled = _pooled(kept, scores)
    for t in (paired, paired_pooled):
        reject, p_adj = bh_adjust([r["p"] for r in t], alpha)
        for r, rej, pa in zip(t, reject, p_adj, strict=True):
            r["p_bh"], r["significant"] = to_float(pa), bool(rej)
    return {"counts": counts, "auroc": table, "paired": paired, "within": within,
            "pooled": pooled, "paired_pooled": paired_pooled}


def _pooled(kept: Mapping[str, Mapping[str, tuple[float, np.ndarray]]],
            scores: Sequence[Score]) -> tuple[list[dict], list[dict]]:
    """Per setting with two or more models, each model weighing the same: the mean over the
    models of each score's AUROC (resample r of the mean = the mean of every model's resample
    r, drawn independently), and each span score's mean ΔAUROC against each baseline."""
    pooled, paired = [], []
    for setting, by in kept.items():
        models = list(dict.fromkeys(k.split("|", 1)[0] for k in by))
        if len(models) < 2:
            continue
        mean: dict[str, tuple[float, np.ndarray]] = {}
        for s in scores:
            vals = [by.get(f"{m}|{s.name}") for m in models]
            if any(v is None for v in vals):
                continue
            mean[s.name] = (float(np.mean([a for a, _ in vals])),
                            np.mean([b for _, b in vals], axis=0))
            lo, hi = _ci(mean[s.name][1])
            pooled.append({"setting": setting, "models": len(models), "score": s.name,
                           "family": s.family, "auroc": to_float(mean[s.name][0]),
                           "ci_low": lo, "ci_high": hi, "direction": _direction(lo, hi)})
        for s in (s for s in scores if s.family == SPAN_SCORE and s.name in mean):
            for b in (b for b in scores if b.family != SPAN_SCORE and b.name in mean):
                d = mean[s.name][1] - mean[b.name][1]
                d = d[np.isfinite(d)]
                if not d.size:
                    continue
                lo, hi = np.percentile(d, [2.5, 97.5])
                paired.append({"setting": setting, "models": len(models), "score": s.name,
                               "baseline": b.name,
                               "delta_auroc": to_float(mean[s.name][0] - mean[b.name][0]),
                               "ci_low": to_float(lo), "ci_high": to_float(hi),
                               "p": _p_two_sided(d)})
    return pooled, paired


def _within(setting, model, rs, y, cols, scores) -> list[dict]:
    """Per span score: over the answers with wrong and correct sentences, the share whose
    highest-scored sentence is wrong (ties: the share of wrong among the tied), and chance."""
    by: dict = {}
    for i, r in enumerate(rs):
        by.setdefault(r["answer"], []).append(i)
    mixed = [np.asarray(ix) for ix in by.values() if 0 < y[ix].sum() < len(ix)]
    if not mixed:
        return []
    chance = float(np.mean([y[ix].mean() for ix in mixed]))
    out = []
    for s in scores:
        if s.source != "span":
            continue
        hits = []
        for ix in mixed:
            x = cols[s.name][ix]
            if not np.isfinite(x).all():
                continue
            top = np.flatnonzero(x == x.max())
            hits.append(float(y[ix][top].mean()))
        if hits:
            out.append({"setting": setting, "model": model, "score": s.name,
                        "answers": len(hits), "top_is_wrong": to_float(np.mean(hits)),
                        "chance": to_float(chance)})
    return out


def verdict(tables: Mapping[str, list[dict]]) -> list[str]:
    """Plain-language findings, one line per (setting, model), from :func:`long_tables`."""
    lines = []
    for c in tables["counts"]:
        st, m = c["setting"], c["model"]
        rs = [r for r in tables["auroc"] if r["setting"] == st and r["model"] == m
              and r["auroc"] is not None]
        head = (f"{m}, {st} answers: {c['sentences']} labelled sentences in {c['answers']} "
                f"answers, {c['wrong']} wrong")
        if not rs:
            lines.append(head + "; one class only, no AUROC.")
            continue
        by = {r["score"]: r for r in rs}

        def said(name: str, by: Mapping = by) -> str:
            r = by.get(name)
            if r is None:
                return f"{name} –"
            return (f"{name} {r['auroc']:.3f} [{_f(r['ci_low'])}, {_f(r['ci_high'])}]")

        best = max(rs, key=lambda r: r["auroc"])
        ours = [r for r in rs if r["family"] == SPAN_SCORE]
        top = max(ours, key=lambda r: r["auroc"]) if ours else None
        pr = [p for p in tables["paired"] if p["setting"] == st and p["model"] == m]
        up = sorted({f"{p['score']} > {p['baseline']}" for p in pr
                     if p["significant"] and p["delta_auroc"] > 0})
        down = sorted({f"{p['score']} < {p['baseline']}" for p in pr
                       if p["significant"] and p["delta_auroc"] < 0})
        wrong_way = [r["score"] for r in rs if r["direction"] == "higher = correct"]
        line = (f"{head}; AUROC for the wrong sentences: best {said(best['score'])}"
                + (f"; best span score {said(top['score'])}" if top else "")
                + f"; span baselines {said('span 1 − p̄')}, {said('span 1 − min p')}"
                + f"; whole answer {said('whole 1 − p̄')}")
        line += ("; significantly above a baseline (BH): " + ", ".join(up) if up
                 else "; no span score significantly above any baseline")
        if down:
            line += "; significantly below: " + ", ".join(down)
        if wrong_way:
            line += "; pointing the wrong way (interval below 0.5): " + ", ".join(wrong_way)
        lines.append(line + ".")
    lines += _summary(tables)
    for st in dict.fromkeys(r["setting"] for r in tables.get("pooled", [])):
        rs = {r["score"]: r for r in tables["pooled"] if r["setting"] == st
              and r["auroc"] is not None}
        if not rs:
            continue
        n = next(iter(rs.values()))["models"]
        best = max(rs.values(), key=lambda r: r["auroc"])
        pr = [p for p in tables.get("paired_pooled", []) if p["setting"] == st]
        up = sorted(f"{p['score']} > {p['baseline']}" for p in pr
                    if p["significant"] and p["delta_auroc"] > 0)
        down = sorted(f"{p['score']} < {p['baseline']}" for p in pr
                      if p["significant"] and p["delta_auroc"] < 0)
        shown = ", ".join(f"{k} {r['auroc']:.3f} [{_f(r['ci_low'])}, {_f(r['ci_high'])}]"
                          for k, r in rs.items() if k in POOLED_SHOWN)
        lines.append(f"Pooled over the {n} models, {st} answers: best {best['score']} "
                     f"{best['auroc']:.3f}; {shown}; "
                     + ("significantly above a baseline (BH): " + ", ".join(up) if up
                        else "no span score significantly above any baseline")
                     + ("; significantly below: " + ", ".join(down) if down else "") + ".")
    return lines


def _summary(tables: Mapping[str, list[dict]]) -> list[str]:
    """One plain line per span score over every (setting, model): in how many its interval
    lies above 0.5 (flags wrong sentences) or below (points the wrong way), and in how many it
    is significantly above or below each span baseline (BH)."""
    groups = {(r["setting"], r["model"]) for r in tables["auroc"]}
    if not groups:
        return []
    out = []
    for name in dict.fromkeys(r["score"] for r in tables["auroc"] if r["family"] == SPAN_SCORE):
        rs = [r for r in tables["auroc"] if r["score"] == name]
        up = sum(r["direction"] == "higher = wrong" for r in rs)
        down = sum(r["direction"] == "higher = correct" for r in rs)
        parts = []
        for base in ("span 1 − p̄", "span 1 − min p", "whole 1 − p̄"):
            pr = [p for p in tables["paired"] if p["score"] == name and p["baseline"] == base]
            if pr:
                a = sum(p["significant"] and p["delta_auroc"] > 0 for p in pr)
                b = sum(p["significant"] and p["delta_auroc"] < 0 for p in pr)
                parts.append(f"significantly above {base} in {a}, below it in {b}")
        out.append(f"In sum, {name} over the {len(rs)} (setting, model) groups: higher on the "
                   f"wrong sentences (interval above 0.5) in {up}, pointing the wrong way "
                   f"(interval below 0.5) in {down}, no direction in {len(rs) - up - down}; "
                   + "; ".join(parts) + ".")
    return out


POOLED_SHOWN = ("span epistemic", "span epistemic_log", "span aleatoric", "span 1 − p̄",
                "span 1 − min p", "whole 1 − p̄")


def _f(v) -> str:
    return "–" if v is None else f"{v:.3f}"


__all__ = ["LABELS", "SCORES", "SPAN_BASELINE", "SPAN_SCORE", "WHOLE", "Score", "cluster_resamples",
           "long_tables", "sentence_rows", "verdict"]


#: the span features a learned span head may read (``isouq calibrate``'s procedure on them)
SPAN_HEAD_FEATURES: tuple[str, ...] = ("mean_prob", "aleatoric", "epistemic", "epistemic_log",
                                       "min_prob")


def span_head_rows(rows: Sequence[Mapping], *, default: str, n_bootstrap: int = 1000,
                   seed: int = 0, folds: int = 5) -> list[dict]:
    """Does a learned span head find the wrong sentences better than the default span score?

    Per (setting, model): a head fitted as ``isouq calibrate`` fits one (``calibration.
    select_map`` over each span feature of :data:`SPAN_HEAD_FEATURES` alone and all together,
    logistic / isotonic / small network, chosen by cross-validated log-loss) on the sentences of
    ``folds − 1`` folds of answers and scoring the sentences of the last (folds by answer: no
    sentence is scored by a head fitted on its answer); its AUROC for the wrong sentences, that of
    the span score ``default``, and their difference, each with a 95% interval from the same
    resamples of answers.

    Args:
        rows: :func:`sentence_rows` output.
        default: the span score the head is measured against (``isouq.defaults.SPAN_SCORE``).
        n_bootstrap, seed: the answers' resamples.
        folds: answer folds of the cross-fitting.

    Returns:
        {setting, model, sentences, wrong, head, head_ci_low, head_ci_high, default,
        default_auroc, default_ci_low, default_ci_high, delta, delta_ci_low, delta_ci_high,
        verdict, maps} per (setting, model) with both classes in every training part.
    """
    from sklearn.model_selection import GroupKFold

    from ...calibration import MIN_PER_CLASS, select_map

    sets = {**{f: (f,) for f in SPAN_HEAD_FEATURES}, "all": SPAN_HEAD_FEATURES}
    out = []
    for (setting, model), rs in _groups(rows).items():
        y = np.array([int(r["wrong"]) for r in rs])
        answers = [r["answer"] for r in rs]
        cols = {f: np.array([float(r["span"].get(f, np.nan)) for r in rs]) for f in
                SPAN_HEAD_FEATURES}
        u = np.full(len(rs), np.nan)
        maps = []
        codes = np.unique(answers, return_inverse=True)[1]
        for tr, te in GroupKFold(n_splits=folds).split(np.zeros(len(rs)), y, codes):
            right = 1 - y[tr]
            if min(int(right.sum()), int(tr.size - right.sum())) < MIN_PER_CLASS:
                continue
            m, _ = select_map({k: v[tr] for k, v in cols.items()}, right, seed=seed, sets=sets)
            u[te] = 1.0 - m.predict({k: v[te] for k, v in cols.items()})
            maps.append(f"{m.kind} on {m.name}")
        if not np.isfinite(u).all() or not 0 < y.sum() < y.size:
            continue
        draws = cluster_resamples(answers, n_bootstrap, group_rng(seed, "span-head", setting,
                                                                  model))
        x = cols[default]
        bh, bd = _boot_aurocs(y, u, draws), _boot_aurocs(y, x, draws)
        (hl, hh), (dl, dh), (ll, lh) = _ci(bh), _ci(bd), _ci(bh - bd)
        a_h, a_d = auroc(y, u), auroc(y, x)
        out.append({"setting": setting, "model": model, "sentences": len(rs),
                    "wrong": int(y.sum()), "head": to_float(a_h), "head_ci_low": hl,
                    "head_ci_high": hh, "default": default, "default_auroc": to_float(a_d),
                    "default_ci_low": dl, "default_ci_high": dh, "delta": to_float(a_h - a_d),
                    "delta_ci_low": ll, "delta_ci_high": lh,
                    "verdict": ("the head is better beyond noise" if ll is not None and ll > 0
                                else "the head is worse beyond noise" if lh is not None and lh < 0
                                else "within noise"),
                    "maps": maps})
    return out
