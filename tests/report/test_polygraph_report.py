"""The LM-Polygraph benchmark section of isouq report: LM-Polygraph's PRR formula, the ranks
with bootstrap intervals, the plain-words verdict, and the kept results files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from isouq.errors import DataError
from isouq.study.report import build_report
from isouq.study.report.polygraph import (
    load_polygraph,
    polygraph_files,
    polygraph_tables,
    prr,
    verdict,
)

KEPT = Path(__file__).resolve().parents[2] / "results" / "polygraph"


def doc(n=120, seed=0, correct_rate=0.4, model="tiny", dataset="triviaqa") -> dict:
    """A benchmark file: one estimator that knows the answers, isouq's noisier copies, noise."""
    rng = np.random.default_rng(seed)
    acc = (rng.random(n) < correct_rate).astype(float)
    rouge = np.clip(acc * 0.7 + rng.random(n) * 0.3, 0, 1)
    ue = {"Oracle": -rouge + 0.05 * rng.standard_normal(n),
          "IsouqEpistemic": -rouge + 0.5 * rng.standard_normal(n),
          "IsouqAleatoric": rng.standard_normal(n),
          "Random": rng.standard_normal(n)}
    return {"kind": "isouq-polygraph", "dataset": dataset, "model": model, "n_questions": n,
            "target_questions": n, "complete": True, "estimators": list(ue),
            "isouq_estimators": ["IsouqEpistemic", "IsouqAleatoric"],
            "quality_metrics": ["Accuracy", "Rouge_rougeL"],
            "cost": {"generation_s_per_answer": 1.0, "machine": "test",
                     "estimators": {e: {"s_per_answer": 0.1} for e in ue}},
            "questions": [{"key": f"q{i}", "quality": {"Accuracy": acc[i],
                                                       "Rouge_rougeL": rouge[i]},
                           "ue": {e: float(v[i]) for e, v in ue.items()}} for i in range(n)]}


def test_prr_by_hand():
    # quality 1, 0, 1, 0 (normalized as is); the oracle rejects the two wrong answers first
    q = [1.0, 0.0, 1.0, 0.0]
    oracle = [0.0, 1.0, 0.0, 1.0]
    # kept 4,3,2,1 → mean quality 2/4, 2/3, 2/2, 1/1 → area = (0.5 + 2/3 + 1 + 1) / 4
    assert prr(oracle, q) == pytest.approx((0.5 + 2 / 3 + 1 + 1) / 4)
    assert prr([1.0, 0.0, 1.0, 0.0], q) == pytest.approx((0.5 + 1 / 3 + 0 + 0) / 4)
    assert prr(oracle, q, max_rejection=0.5) == pytest.approx((0.5 + 2 / 3) / 2)
    assert prr([np.nan, 1.0, 0.0, 1.0], q) == prr([-1e7, 1.0, 0.0, 1.0], q)  # NaN: clipped


def test_prr_is_lm_polygraphs():
    lm = pytest.importorskip("lm_polygraph.ue_metrics")
    rng = np.random.default_rng(1)
    for _ in range(20):
        ue, q = rng.standard_normal(50), rng.random(50)
        for r in (1.0, 0.5):
            assert prr(ue, q, r) == pytest.approx(lm.PredictionRejectionArea(r)(ue, q))


def _prr_over_tie_orders(ue, target, r: float = 1.0) -> tuple[float, float]:
    """The least and most PRR over the orders of tied uncertainties: with ties, LM-Polygraph's
    value depends on its sort (numpy's default sort orders equal keys differently on CPUs with
    and without AVX-512); without ties both ends are the one PRR."""
    u = np.nan_to_num(np.asarray(ue, dtype=float), nan=-1e7, neginf=-1e7, posinf=1e7)
    t = np.asarray(target, dtype=float)
    gaps = np.diff(np.unique(u))
    eps = (gaps.min() if len(gaps) else 1.0) / (4 * len(u) + 4)
    rank = np.argsort(np.argsort(np.nan_to_num(t, nan=0.0), kind="stable"), kind="stable")
    ends = [prr(u + s * eps * rank, t, r) for s in (1, -1)]
    return min(ends), max(ends)


@pytest.mark.skipif(not polygraph_files(KEPT), reason="no kept LM-Polygraph results")
def test_kept_results_prr_equals_lm_polygraphs_own():
    """On every kept file, the report's PRR equals the PRR LM-Polygraph computed itself (where
    uncertainties tie, it lies within the PRRs of the ties' orders)."""
    for f in polygraph_files(KEPT):
        d = load_polygraph(f)
        for e in d["estimators"]:
            ue = [q["ue"][e] if q["ue"][e] is not None else np.nan for q in d["questions"]]
            for m in d["quality_metrics"]:
                target = [q["quality"][m] for q in d["questions"]]
                own = d["lm_polygraph_metrics"][e][m]
                for r, key in ((1.0, "prr"), (0.5, "prr_0.5")):
                    lo, hi = _prr_over_tie_orders(ue, target, r)
                    assert lo - 1e-9 <= own[key] <= hi + 1e-9, (f.name, e, m, key)
                    assert lo - 1e-9 <= prr(ue, target, r) <= hi + 1e-9


def test_ranks_intervals_and_verdict():
    t = polygraph_tables([doc()], n_bootstrap=100, seed=0)
    rows = {r["quality"]: r for r in t["ranks"]}
    rouge = rows["ROUGE-L"]
    assert rouge["isouq best"] == "IsouqEpistemic" and rouge["best LM-Polygraph"] == "Oracle"
    assert rouge["rank (of estimators)"] == "2 of 3"
    assert rouge["verdict"].startswith("below the best")
    assert len(t["estimators"]) == 8 and t["estimators"][0]["estimator"] == "Oracle"
    assert t["estimators"][1]["estimator"] == "★ IsouqEpistemic"
    text = verdict(t["ranks"])
    assert text.startswith("Verdict: over 2 rankable setting(s)")
    assert "below (interval under 0) in 2" in text


def test_too_few_correct_answers_are_not_ranked():
    t = polygraph_tables([doc(correct_rate=0.0)], n_bootstrap=50)
    acc = next(r for r in t["ranks"] if r["quality"] == "accuracy")
    assert acc["verdict"] == "not rankable: 0 correct answer(s) of 120"
    rouge = next(r for r in t["ranks"] if r["quality"] == "ROUGE-L")  # none at ROUGE-L ≥ 0.5
    assert rouge["verdict"].startswith("not rankable: fewer than 30 answers of a class")
    assert "no setting could rank" in verdict(t["ranks"])


def test_isouq_report_renders_the_section(tmp_path):
    d = tmp_path / "polygraph"
    d.mkdir()
    part = doc(model="m2", dataset="truthfulqa")
    part.update(complete=False, target_questions=500)
    for x in (doc(), part):
        (d / f"polygraph__{x['dataset']}__{x['model']}.json").write_text(json.dumps(x))
    html = build_report([d], tmp_path / "report", n_bootstrap=50)
    md = (tmp_path / "report" / "tables.md").read_text()
    assert "LM-Polygraph benchmark" in md and "Verdict:" in md
    assert "PARTIAL: m2 × truthfulqa has 120 of 500 questions" in md
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    sec = next(s for s in rep["sections"] if s["kind"] == "polygraph")
    assert {r["model"] for r in sec["tables"]["ranks"]} == {"tiny", "m2"}
    assert html.exists()


def test_a_file_that_is_not_a_benchmark_is_refused(tmp_path):
    f = tmp_path / "polygraph__x__y.json"
    f.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(DataError, match="not an LM-Polygraph benchmark file"):
        load_polygraph(f)


def _with_msp(d: dict, seed: int = 1) -> dict:
    """``doc`` with a MaximumSequenceProbability that knows the answers a little."""
    rng = np.random.default_rng(seed)
    for q in d["questions"]:
        q["ue"]["MaximumSequenceProbability"] = -q["quality"]["Rouge_rougeL"] + rng.normal()
    d["estimators"].append("MaximumSequenceProbability")
    return d


CONTROL = "MSP's own map (control)"


def test_learned_heads_join_the_ranks_and_are_judged_against_msps_map(tmp_path):
    """A head that knows the answers is ahead of MSP's map on the dataset's primary quality
    (TriviaQA: accuracy); its ROUGE-L row is reported, not counted; a head that could not be
    fitted says so; every estimator is ranked on the answers with features."""
    from isouq.study.report.polygraph import load_heads, polygraph_section

    d = _with_msp(doc(n=200))
    rouge = np.array([q["quality"]["Rouge_rougeL"] for q in d["questions"]])
    path = tmp_path / "polygraph__triviaqa__tiny.json"
    path.write_text(json.dumps(d))
    head = list(-rouge + 0.1 * np.random.default_rng(2).standard_normal(200))
    (tmp_path / "heads").mkdir()
    # MSP's map: MSP itself as an uncertainty, less 10 answers (features not rebuilt)
    msp = [None if i < 10 else 1 / (1 + np.exp(q["ue"]["MaximumSequenceProbability"]))
           for i, q in enumerate(d["questions"])]
    head[:3] = [None] * 3  # three answers without features: no learned value
    heads = {"keys": [q["key"] for q in d["questions"]],
             "density": {"RDESeq": [None] * 3 + [0.0] * 197},
             "metrics": {m: {"labels": "x", "cross_fitted": {"isouq block head": head},
                             "transfer": {"isouq block head (trained on truthfulqa)":
                                          [None] * 200},
                             "control": {CONTROL: [None if v is None else 1 - v
                                                   for v in msp]}}
                         for m in ("Accuracy", "Rouge_rougeL")}}
    (tmp_path / "heads" / "triviaqa__tiny.json").write_text(json.dumps(heads))
    assert load_heads(path, d)["keys"] == heads["keys"]
    sec, tables = polygraph_section([(path, d)], set(), n_bootstrap=200)
    rows = {(r["quality"], r["head"], r["against"]): r for r in tables["heads"]}
    acc = rows[("accuracy", "isouq block head", CONTROL)]
    assert acc["counted"] and acc["verdict"] == "ahead" and acc["ci_low"] > 0
    assert acc["n"] == 190 and acc["family"] == 1  # the answers both have a value for
    rouge_row = rows[("ROUGE-L", "isouq block head", CONTROL)]
    assert not rouge_row["counted"] and rouge_row["verdict"] is None
    moved = rows[("accuracy", "isouq block head (trained on truthfulqa)", CONTROL)]
    assert moved["note"] == "no head could be fitted" and moved["verdict"] is None
    ranked = {r["estimator"] for r in tables["estimators"]}
    assert "★ isouq block head" in ranked and "RDESeq" in ranked  # ours, and theirs
    assert {r["n"] for r in tables["ranks"]} == {197}  # ranked on the answers with features
    assert not any("control" in e for e in ranked)  # a control is not an estimator
    assert any("Holm's correction over the answer sets" in n for n in sec.notes)
    (tmp_path / "heads" / "triviaqa__tiny.json").write_text(json.dumps({**heads, "keys": []}))
    with pytest.raises(DataError, match="other answers"):
        load_heads(path, d)


def test_a_kept_verdict_replaces_the_heads_one_seed_verdicts(tmp_path):
    """With ``verdict/verdict.json`` beside the kept files (prereg_verdict.py: repeated fold
    seeds, Holm), the section shows it, one row per answer set, and the heads table keeps its
    intervals but no verdict of its own."""
    from isouq.study.report.polygraph import polygraph_section, verdict_table

    d = _with_msp(doc(n=200))
    rouge = np.array([q["quality"]["Rouge_rougeL"] for q in d["questions"]])
    path = tmp_path / "polygraph__triviaqa__tiny.json"
    path.write_text(json.dumps(d))
    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "triviaqa__tiny.json").write_text(json.dumps({
        "keys": [q["key"] for q in d["questions"]], "density": {},
        "metrics": {m: {"labels": "x", "cross_fitted": {"isouq block head": list(-rouge)}}
                    for m in ("Accuracy", "Rouge_rougeL")}}))
    judged = {"predictor": "isouq head", "dataset": "triviaqa", "model": "tiny",
              "metric": "Accuracy", "correct": 80, "wrong": 120, "PRR": 0.5, "delta": 0.05,
              "ci_low": 0.01, "ci_high": 0.09, "delta_auroc": -0.02, "ci_low_auroc": -0.05,
              "ci_high_auroc": 0.01, "p_holm": 0.02}
    kept = {"preregistration": {"path": "configs/preregistration/v1.yaml"},
            "design_set": str(tmp_path), "seeds": [0, 1, 2], "answer_sets_judged": 1,
            "answer_sets_expected": 2,
            "rows": [{**judged, "against": "MSP's map", "verdict": "ahead"},
                     {**judged, "against": "forward-only head", "delta": -0.01,
                      "ci_low": -0.03, "p_holm": 0.6, "verdict": "within noise"}]}
    (tmp_path / "verdict").mkdir()
    (tmp_path / "verdict" / "verdict.json").write_text(json.dumps(kept))
    sec, tables = polygraph_section([(path, d)], set(), n_bootstrap=100)
    (row,) = verdict_table(kept)
    assert row["vs MSP's map: Δ PRR [95% CI]"] == "+0.050 [+0.010, +0.090]"
    assert row["vs MSP's map: Δ AUROC [95% CI]"] == "−0.020 [−0.050, +0.010]"
    assert row["vs forward-only head: verdict"] == "within noise"
    shown = [b.ours for b in sec.blocks if b.ours is not None]
    names = [t.name for t in shown]
    assert names.index("polygraph_verdict") < names.index("polygraph_heads")
    heads = next(t for t in shown if t.name == "polygraph_heads")
    assert "verdict" not in heads.columns and "Holm p" not in heads.columns
    assert all("verdict" not in r and "p_holm" not in r for r in tables["heads"])
    assert tables["verdict"] == kept["rows"]
    assert any("3 fold seeds" in n and "1 of 2 answer sets" in n for n in sec.notes)


def test_a_supervised_anchor_is_ranked_and_judged_but_is_neither_sides(tmp_path):
    from isouq.study.analysis.learned_heads import PROBE
    from isouq.study.report.polygraph import polygraph_section

    d = _with_msp(doc(n=200))
    rouge = np.array([q["quality"]["Rouge_rougeL"] for q in d["questions"]])
    path = tmp_path / "polygraph__triviaqa__tiny.json"
    path.write_text(json.dumps(d))
    heads = {"keys": [q["key"] for q in d["questions"]], "density": {},
             "metrics": {m: {"labels": "x", "cross_fitted": {"isouq block head": list(
                 -rouge + 0.5 * np.random.default_rng(2).standard_normal(200))},
                             "anchors": {PROBE: list(-rouge)}}  # the anchor knows every answer
                         for m in ("Accuracy", "Rouge_rougeL")}}
    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "triviaqa__tiny.json").write_text(json.dumps(heads))
    sec, tables = polygraph_section([(path, d)], set(), n_bootstrap=200)
    first = [r for r in tables["estimators"] if r["quality"] == "ROUGE-L"][0]
    assert first["estimator"] == "† " + PROBE and first["rank"] == 1
    for r in tables["ranks"]:  # not LM-Polygraph's best, nor isouq's
        assert r["best LM-Polygraph"] != PROBE and r["isouq best"] != PROBE
    rows = {(r["quality"], r["head"], r["against"]): r for r in tables["heads"]}
    # no control in the file: judged against LM-Polygraph's MSP itself
    assert rows[("accuracy", PROBE, "MaximumSequenceProbability")]["verdict"] == "ahead"
    assert any("† a supervised anchor" in n for n in sec.notes)
    # held against the block head on the same answers too: it knows them all, the head not
    anchor = rows[("accuracy", PROBE, "isouq block head")]
    assert anchor["verdict"] == "ahead" and anchor["delta"] > 0
    assert ("accuracy", "isouq block head", "isouq block head") not in rows


def test_judge_heads_holm_over_the_counted_answer_sets():
    """One family per (head, reference): Holm over the answer sets counted (primary quality)
    and rankable; the other rows get no verdict."""
    from isouq.study.report.polygraph import judge_heads, verdict_counts

    def row(ds, quality, p, delta=0.1, rankable=True, counted=True):
        return {"head": "h", "against": CONTROL, "dataset": ds, "quality": quality, "p": p,
                "delta": delta, "rankable": rankable, "counted": counted}

    got = judge_heads([row("triviaqa", "accuracy", 0.001), row("truthfulqa", "ROUGE-L", 0.03),
                       row("truthfulqa", "accuracy", 0.001, counted=False),
                       row("x", "accuracy", 0.001, rankable=False)])
    assert [r["verdict"] for r in got] == ["ahead", "ahead", None, None]
    tight = judge_heads([row("triviaqa", "accuracy", 0.03), row("truthfulqa", "ROUGE-L", 0.04)])
    assert [r["verdict"] for r in tight] == ["within noise"] * 2  # 0.06, 0.06 after Holm
    assert [r["p_holm"] for r in got[:2]] == pytest.approx([0.002, 0.03])
    assert {r["family"] for r in got} == {2}
    assert verdict_counts(got) == (2, 0, 0)
