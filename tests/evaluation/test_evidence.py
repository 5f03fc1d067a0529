"""Evidence tables of the MC1 / short-answer settings and their report sections."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from isouq.errors import DataError
from isouq.study.analysis.evidence import MC_BASELINES, evidence_tables, raw_auroc_ci, verdict


def _rows(n=120, seed=0, model="m"):
    rng = np.random.default_rng(seed)
    correct = rng.integers(0, 2, n)
    rows = []
    for i, c in enumerate(correct):
        pbar = float(np.clip(0.3 + 0.4 * c + rng.normal(0, 0.15), 0.01, 0.99))  # informative
        epi = float(rng.lognormal(0, 1))  # noise
        rows.append({"key": f"k{i}", "model": model, "dataset": "truthfulqa_mc1",
                     "correct": int(c), "option_mean_prob": [pbar, 0.1],
                     "scores": {"epistemic": epi, "epistemic_log": epi / pbar**2,
                                "aleatoric": float(rng.uniform(0, 0.25)), "mean_prob": pbar,
                                "max_prob": float(rng.uniform(0.3, 1)),
                                "option_entropy": float(rng.uniform(0, 1.5)),
                                "p_true": float(rng.uniform())}})
    return rows


def test_raw_auroc_matches_sklearn_and_orients_uncertainties():
    rows = _rows()
    t = evidence_tables(rows, MC_BASELINES, n_bootstrap=30, n_raw_bootstrap=200)
    y = np.array([r["correct"] for r in rows])
    raw = {r["score"]: r for r in t["raw_auroc"]}
    for s in ("mean_prob", "p_true"):
        x = np.array([r["scores"][s] for r in rows])
        assert raw[s]["auroc"] == pytest.approx(roc_auc_score(y, x))
    e = np.array([r["scores"]["epistemic"] for r in rows])
    assert raw["epistemic"]["auroc"] == pytest.approx(roc_auc_score(y, -e))
    assert raw["mean_prob"]["direction"] == "higher = correct"
    assert raw["mean_prob"]["ci_low"] < raw["mean_prob"]["auroc"] < raw["mean_prob"]["ci_high"]
    assert t["counts"] == [{"dataset": "truthfulqa_mc1", "model": "m", "n": 120,
                            "correct": int(y.sum()), "accuracy": pytest.approx(y.mean())}]


def test_paired_comparisons_are_bh_adjusted_and_find_the_informative_baseline():
    t = evidence_tables(_rows(n=300), MC_BASELINES, n_bootstrap=100, n_raw_bootstrap=50)
    pairs = {(p["method"], p["baseline"]): p for p in t["paired"]}
    assert len(pairs) == 5 * 4
    noise_vs_pbar = pairs[("Epi.", "p̄")]
    assert noise_vs_pbar["delta_auroc"] < 0 and noise_vs_pbar["significant"]
    assert all(p["p_bh"] >= p["p"] - 1e-12 for p in t["paired"])
    line = verdict(t)[0]
    assert "best AUROC" in line and "significantly below it" in line


def test_raw_direction_reverse_and_none():
    y = np.array([0, 1] * 50)
    assert raw_auroc_ci(y, -y + 0.01 * np.arange(100))["direction"] == "higher = wrong"
    flat = raw_auroc_ci(y, np.zeros(100))
    assert flat["auroc"] == 0.5 and flat["direction"] == "none"


def test_one_class_is_an_error():
    rows = _rows(n=10)
    for r in rows:
        r["correct"] = 1
    with pytest.raises(DataError):
        evidence_tables(rows, MC_BASELINES, n_bootstrap=5)


def test_report_puts_mc_and_short_rows_in_their_own_sections(tmp_path):
    from isouq.study.report.build import build_report

    short = _rows(n=80, seed=1, model="s")
    from isouq.answer_row import short_key

    for r in short:
        r |= {"dataset": "triviaqa", "label_source": "alias_match", "key": short_key(r["key"])}
        del r["option_mean_prob"]
        r["scores"] = {k: r["scores"][k] for k in ("epistemic", "epistemic_log", "aleatoric",
                                                   "mean_prob", "p_true")}
        r["scores"]["naive_entropy"] = 1.0
    for r in short:
        r["lexical_correct"] = r["correct"]
    # hand labels of 10 short answers: 2 the alias match calls correct are wrong, 1 the reverse
    gold = [{"key": r["key"], "dataset": "triviaqa", "model": "s",
             "gold_correct": bool(r["correct"]), "labeler": "t"} for r in short[:10]]
    ones = [g for g in gold if g["gold_correct"]]
    zeros = [g for g in gold if not g["gold_correct"]]
    for g in ones[:2] + zeros[:1]:
        g["gold_correct"] = not g["gold_correct"]
    (tmp_path / "in").mkdir()
    mc_rows = _rows(n=80) + _rows(n=80, seed=3, model="m2")  # two models: a pooled panel
    for name, rows in (("mc.jsonl", mc_rows), ("short.jsonl", short),
                       ("short.gold.jsonl", gold)):
        (tmp_path / "in" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report([tmp_path / "in"], tmp_path / "out", n_bootstrap=20)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    kinds = [(s["id"], s["kind"]) for s in doc["sections"]]
    assert kinds == [("qa-evidence-mc", "qa_evidence"), ("qa-evidence-short", "qa_evidence")]
    mc = doc["sections"][0]["tables"]
    assert {r["method"] for r in mc["metrics"]} >= {"Epi.", "Epi. log", "p̄", "Max prob."}
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "TruthfulQA MC1" in md and "TriviaQA short answers" in md
    q = {r["labels"]: r for r in doc["sections"][1]["tables"]["label_quality"]}
    assert q["alias match"]["n"] == 10
    assert (q["alias match"]["false yes"], q["alias match"]["false no"]) == (2, 1)
    for sec in doc["sections"]:  # each setting draws its raw AUROC forest
        assert sec["figures"] == [f"{sec['id']}/raw_auroc.png"]
        assert (tmp_path / "out" / sec["figures"][0]).stat().st_size > 1000
    assert mc["raw_pooled"] and not doc["sections"][1]["tables"]["raw_pooled"]


def test_pooled_tables_average_the_models():
    from isouq.evaluation.auroc import method_runs
    from isouq.evaluation.rows import group_rows
    from isouq.study.analysis.evidence import paired_pooled_rows

    rows = _rows(n=150, seed=1, model="a") + _rows(n=150, seed=2, model="b")
    t = evidence_tables(rows, MC_BASELINES, n_bootstrap=100, n_raw_bootstrap=100)
    one = evidence_tables(_rows(n=150, seed=1, model="a"), MC_BASELINES, n_bootstrap=10,
                          n_raw_bootstrap=20)
    assert one["raw_pooled"] == [] and one["paired_pooled"] == []  # one model: nothing pooled
    per_model = {(r["model"], r["score"]): r["auroc"] for r in t["raw_auroc"]}
    pooled = {r["score"]: r for r in t["raw_pooled"]}
    for score in ("epistemic", "mean_prob", "p_true"):
        assert pooled[score]["auroc"] == pytest.approx(
            (per_model[("a", score)] + per_model[("b", score)]) / 2)
        assert pooled[score]["ci_low"] <= pooled[score]["auroc"] <= pooled[score]["ci_high"]
    assert pooled["mean_prob"]["direction"] == "higher = correct"
    # pooled Δ, run by run, is the mean of the two models' paired Δ (no degenerate runs here)
    runs = method_runs(group_rows(rows), n_bootstrap=100, seed=0,
                       methods={"Epi.": ("epistemic",), "p̄": ("mean_prob",)})
    pp = paired_pooled_rows(runs, ["Epi."], ["p̄"])
    by_model = {(p["model"], p["method"], p["baseline"]): p["delta_auroc"] for p in t["paired"]}
    assert len(pp) == 1 and pp[0]["models"] == 2
    assert pp[0]["delta_auroc"] == pytest.approx(
        (by_model[("a", "Epi.", "p̄")] + by_model[("b", "Epi.", "p̄")]) / 2)
    tp = {(r["method"], r["baseline"]): r for r in t["paired_pooled"]}
    assert tp[("Epi.", "p̄")]["delta_auroc"] < 0 and tp[("Epi.", "p̄")]["significant"]
    assert all(r["p_bh"] >= r["p"] - 1e-12 for r in t["paired_pooled"])
    assert any(line.startswith("Pooled over the 2 models") for line in verdict(t))


def test_a_baseline_on_the_first_questions_gets_its_own_tables_on_those_rows(tmp_path):
    """Semantic entropy on a nested subset: the main tables leave it out, the subset tables
    refit every method on the rows that carry it (raw AUROC as sklearn's on those rows)."""
    from isouq.study.report.evidence_section import evidence_section

    rows = _rows(n=150, seed=4, model="s")
    rng = np.random.default_rng(5)
    for r in rows:
        r |= {"dataset": "triviaqa", "label_source": "alias_match"}
        del r["option_mean_prob"]
    sub = rows[:60]
    for r in sub:  # informative: lower for correct answers
        r["scores"]["semantic_entropy"] = float(1.0 - 0.5 * r["correct"] + rng.normal(0, 0.3))
    sec, tables = evidence_section("short", rows, set(), n_bootstrap=20)
    assert "Sem. Ent." not in {m["method"] for m in tables["metrics"]}
    assert {r["n"] for r in tables["raw_auroc"]} == {150}
    assert tables["subset_counts"][0]["n"] == 60
    raw = {r["score"]: r for r in tables["subset_raw_auroc"]}
    y = np.array([r["correct"] for r in sub])
    se = np.array([r["scores"]["semantic_entropy"] for r in sub])
    assert raw["semantic_entropy"]["auroc"] == pytest.approx(roc_auc_score(y, -se))
    assert raw["semantic_entropy"]["n"] == raw["mean_prob"]["n"] == 60
    assert {p["baseline"] for p in tables["subset_paired"]} == {"Sem. Ent."}
    assert {m["method"] for m in tables["subset_metrics"]} >= {"Epi.", "Sem. Ent."}
    assert any(n.startswith("On the 60 answers with Sem. Ent.") for n in sec.notes)
    for r in sub[2:]:  # too few rows of one class left: said, not an error
        r["scores"]["semantic_entropy"] = None
    sub[0]["correct"] = sub[1]["correct"] = 1
    sec, tables = evidence_section("short", rows, set(), n_bootstrap=20)
    assert "subset_counts" not in tables
    assert any("not yet evaluable" in n for n in sec.notes)


def test_the_tables_do_not_depend_on_the_order_of_the_rows():
    """A nested `--limit` run rewrites a rows file with its questions first: the seeded
    resampling must draw the same questions whatever order the file lists them in."""
    rows = _rows(n=90, seed=6)
    shuffled = [rows[i] for i in np.random.default_rng(1).permutation(len(rows))]
    a = evidence_tables(rows, MC_BASELINES, n_bootstrap=20, n_raw_bootstrap=100)
    b = evidence_tables(shuffled, MC_BASELINES, n_bootstrap=20, n_raw_bootstrap=100)
    assert a == b
