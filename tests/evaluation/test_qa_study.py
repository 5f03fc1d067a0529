import copy

import pytest

from isouq.errors import DataError
from isouq.runio import markdown_table
from isouq.study.analysis import common_rows_tables, study_tables

FAST = {"n_bootstrap": 10, "n_splits": 4, "n_paired_bootstrap": 300}
TABLES = {"auroc", "prr", "aurac", "auroc_per_model", "metrics_per_model", "significance",
          "significance_wide", "paired_bootstrap", "correlation", "lomo", "cost", "raw_auroc"}


def test_study_tables_on_synthetic_rows(rows):
    t = study_tables(rows, **FAST)
    assert set(t) == TABLES
    auroc = {r["method"]: r for r in t["auroc"]}
    assert list(auroc) == ["Naive Ent.", "Sem. Ent.", "P(True)", "p̄", "Alea.", "Epi.",
                           "Epi. log", "Epi. & Alea."]
    for ds in ("TruthfulQA", "TriviaQA"):
        assert auroc["Alea."][ds] > 0.8 and auroc["Epi. & Alea."][ds] > 0.8
        assert abs(auroc["P(True)"][ds] - 0.5) < 0.1
        assert auroc["Alea."][f"{ds} ±"] > 0
    assert len(t["auroc_per_model"]) == 6
    assert len(t["metrics_per_model"]) == 48  # 6 groups x 8 methods
    assert len(t["significance"]) == 32 and len(t["significance_wide"]) == 8
    assert t["significance_wide"][0]["vs P(True)"].endswith("↑")
    assert len(t["paired_bootstrap"]) == 2 and len(t["correlation"]) == 8
    assert len(t["lomo"]) == 10 and len(t["cost"]) == 24
    # raw scores: the synthetic aleatoric is higher for wrong answers (negated: above 0.5),
    # p_true is noise (no direction claimed); epistemic_log derived from epistemic / p̄²
    raw = {(r["dataset"], r["model"], r["score"]): r for r in t["raw_auroc"]}
    for (_ds, _m, score), r in raw.items():
        if score == "aleatoric":
            assert r["direction"] == "higher = correct" and r["oriented"] == "negated"
            assert r["score_direction"] == "higher = wrong"
        assert r["ci_low"] <= r["auroc"] <= r["ci_high"]
    assert {s for (_, _, s) in raw} >= {"epistemic", "epistemic_log", "mean_prob", "p_true"}
    for table in t.values():
        assert markdown_table(table).startswith("|")


def test_study_tables_deterministic(rows):
    small = [r for r in rows if r["model"] != "m3" and r["dataset"] == "TriviaQA"]
    assert study_tables(small, **FAST) == study_tables(small, **FAST)


def test_unjudged_rows_dropped_and_missing_scores_tolerated(rows):
    rows = copy.deepcopy([r for r in rows if r["dataset"] == "TruthfulQA"])
    rows[0]["correct"] = None
    for r in rows:
        del r["scores"]["semantic_entropy"]
    t = study_tables(rows, **FAST)
    sem = next(r for r in t["auroc"] if r["method"] == "Sem. Ent.")
    assert sem["TruthfulQA"] is None
    n = next(r["n"] for r in t["metrics_per_model"] if r["model"] == "m1")
    assert n == 79
    assert all(r["baseline"] != "Sem. Ent." for r in t["significance"])


def test_missing_field_is_a_data_error(rows):
    bad = copy.deepcopy(rows)
    del bad[5]["correct"]
    with pytest.raises(DataError, match="correct"):
        study_tables(bad, **FAST)


def test_one_class_dataset_is_a_data_error(rows):
    bad = copy.deepcopy(rows)
    for r in bad:
        if r["dataset"] == "TriviaQA":
            r["correct"] = 1
    with pytest.raises(DataError, match="TriviaQA.*only correct"):
        study_tables(bad, **FAST)


def test_one_class_model_is_a_data_error(rows):
    bad = copy.deepcopy(rows)
    for r in bad:
        if r["model"] == "m2" and r["dataset"] == "TriviaQA":
            r["correct"] = 0
    with pytest.raises(DataError, match="m2"):
        study_tables(bad, **FAST)


def test_bad_values_are_data_errors(rows):
    bad = copy.deepcopy(rows)
    bad[0]["correct"] = "yes"
    with pytest.raises(DataError, match="correct"):
        study_tables(bad, **FAST)
    bad = copy.deepcopy(rows)
    bad[0]["scores"]["epistemic"] = -1.0
    with pytest.raises(DataError, match="log_epistemic=False"):
        study_tables(bad, **FAST)
    bad = copy.deepcopy(rows)
    bad[1]["key"] = bad[0]["key"]
    with pytest.raises(DataError, match="repeated"):
        study_tables(bad, **FAST)


def test_common_rows_table_compares_methods_on_the_rows_every_method_has(rows):
    done = [r for r in rows if r["dataset"] == "TriviaQA"]
    for i, r in enumerate(r for r in done if r["model"] == "m2"):
        if i >= 50:  # semantic entropy reached 50 of m2's 80 questions so far
            del r["scores"]["semantic_entropy"]
    assert common_rows_tables(rows[:80 * 3], n_bootstrap=10) == {"auroc_common_rows": []}
    t = common_rows_tables(done, n_bootstrap=10)["auroc_common_rows"]
    assert [(r["dataset"], r["model"], r["n"], r["of"]) for r in t] == [("TriviaQA", "m2", 50, 80)]
    subset = [r for r in done if r["model"] == "m2"][:50]  # the same rows, picked by hand
    want = study_tables(subset, **FAST)["auroc_per_model"][0]
    assert {k: t[0][k] for k in want} == want
    assert t[0]["Sem. Ent."] is not None and t[0]["Alea."] > 0.8
