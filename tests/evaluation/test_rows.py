import numpy as np
import pytest

from isouq.errors import DataError
from isouq.evaluation import group_rows
from isouq.evaluation.rows import (
    drop_partial_scores,
    feature_matrix,
    log_transform,
    rows_scored_by_all,
    usable_rows,
)


def test_log_transform_shifts_zeros_and_keeps_nan():
    out = log_transform(np.array([0.0, 1e-3, 10.0, np.nan]))
    assert np.allclose(out[:3], np.log([1e-3, 2e-3, 10.0 + 1e-3]))
    assert np.isnan(out[3])
    assert np.allclose(log_transform(np.array([1.0, np.e])), [0.0, 1.0])
    with pytest.raises(DataError):
        log_transform(np.array([-1.0, 1.0]))


def test_group_rows_aligns_sparse_scores():
    rows = [
        {"key": "a", "model": "m", "dataset": "d", "correct": 1, "scores": {"p_true": 0.9}},
        {"key": "b", "model": "m", "dataset": "d", "correct": None, "scores": {}},
        {"key": "c", "model": "m", "dataset": "d", "correct": 0,
         "scores": {"epistemic": 2.0, "p_true": None}},
    ]
    g = group_rows(rows)[("d", "m")]
    assert g.keys == ("a", "c") and g.correct.tolist() == [1, 0]
    assert np.allclose(g.score("epistemic"), [np.nan, 2.0], equal_nan=True)
    assert np.allclose(g.score("p_true"), [0.9, np.nan], equal_nan=True)
    assert np.isnan(g.score("semantic_entropy")).all()
    X = feature_matrix(g, ("epistemic", "p_true"))
    assert X.shape == (2, 2) and X[1, 0] == pytest.approx(np.log(2.0))


def test_group_rows_errors():
    with pytest.raises(DataError, match="no judged rows"):
        group_rows([{"key": "a", "model": "m", "dataset": "d", "correct": None, "scores": {}}])
    with pytest.raises(DataError, match="infinite"):
        group_rows([{"key": "a", "model": "m", "dataset": "d", "correct": 1,
                     "scores": {"epistemic": float("inf")}}])


def test_scores_of_a_run_in_progress_are_dropped_nulls_kept():
    rows = [{"key": str(i), "dataset": "D", "model": m, "correct": i % 2,
             "scores": {"epistemic": 1.0 + i, "p_true": None if i == 0 else 0.5}}
            for m in ("a", "b") for i in range(6)]
    for r in rows[:2]:  # model a: semantic entropy on 2 of 6 rows so far
        r["scores"]["semantic_entropy"] = 0.3
    for r in rows[6:]:  # model b: on all of its rows
        r["scores"]["semantic_entropy"] = 0.2
    kept, why = drop_partial_scores(rows)
    assert why == ["score 'semantic_entropy' of model 'a' on 'D' left out: on 2 of 6 rows (run "
                   "in progress; resume `isouq qa run` to complete it)"]
    assert all("semantic_entropy" not in r["scores"] for r in kept[:6])
    assert all(r["scores"]["semantic_entropy"] == 0.2 for r in kept[6:])
    assert kept[0]["scores"]["p_true"] is None and "semantic_entropy" in rows[0]["scores"]
    kept, notes = usable_rows(rows)
    assert notes == why + ["score 'semantic_entropy' on 'D' only for model(s) ['b'] of 2: "
                           "per-model results only, no mean over models"]


def test_scores_left_out_for_one_reason_share_one_note():
    rows = [{"key": str(i), "dataset": "D", "model": m, "correct": i % 2,
             "scores": {"epistemic": 1.0 + i}} for m in ("a", "b") for i in range(4)]
    for r in rows[:1] + rows[4:]:  # model a: on 1 of 4 rows; model b: on all of its rows
        r["scores"] |= {"semantic_entropy": 0.3, "semantic_entropy_discrete": 0.4}
    kept, notes = usable_rows(rows)
    assert notes == [
        "scores 'semantic_entropy' and 'semantic_entropy_discrete' of model 'a' on 'D' left "
        "out: on 1 of 4 rows (run in progress; resume `isouq qa run` to complete it)",
        "scores 'semantic_entropy' and 'semantic_entropy_discrete' on 'D' only for model(s) "
        "['b'] of 2: per-model results only, no mean over models"]


def test_rows_scored_by_all_keeps_the_common_rows_of_groups_in_progress():
    rows = [{"key": str(i), "dataset": "D", "model": m, "correct": i % 2,
             "scores": {"epistemic": 1.0 + i, "p_true": None if i == 0 else 0.5}}
            for m in ("a", "b") for i in range(6)]
    for r in rows[1:3] + rows[6:]:  # model a: SE on rows 1 and 2; model b: on all rows
        r["scores"]["semantic_entropy"] = 0.3
    rows[2]["scores"]["naive_entropy"] = 0.1  # and naive entropy on row 2 only
    common, totals = rows_scored_by_all(rows)
    assert [(r["model"], r["key"]) for r in common] == [("a", "2")]
    assert totals == {("D", "a"): 6}
    del rows[2]["scores"]["naive_entropy"]
    common, totals = rows_scored_by_all(rows)
    assert [r["key"] for r in common] == ["1", "2"] and totals == {("D", "a"): 6}
    for r in rows[:6]:
        r["scores"].pop("semantic_entropy", None)  # a null score counts as present
    assert rows_scored_by_all(rows) == ([], {})
