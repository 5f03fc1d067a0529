import pytest

from isouq.errors import DataError
from isouq.study.analysis import cost_table, speedup


def test_speedup():
    assert speedup([0.1, 0.1], [5.0, 7.0]) == pytest.approx(60.0)


def test_cost_table(rows):
    table = cost_table(rows)
    first = [r for r in table if r["dataset"] == "TruthfulQA" and r["model"] == "m1"]
    by = {r["method"]: r for r in first}
    assert by["Gradient norm (ours)"]["passes"] == 1
    assert by["Gradient norm (ours)"]["speedup"] == pytest.approx(1.0)
    assert by["Sem. Ent."]["passes"] == 10
    assert by["Sem. Ent."]["mean_s"] == pytest.approx(6.0)
    assert by["Sem. Ent."]["speedup"] == pytest.approx(60.0)
    assert by["P(True)"]["n"] == 80 and 2.0 < by["P(True)"]["mean_s"] < 4.0


def test_cost_table_rejects_bad_seconds():
    with pytest.raises(DataError, match="seconds"):
        cost_table([{"model": "m", "dataset": "d", "seconds": {"gradient": "fast"}}])


def _timed(key, grad, se, grad_on, se_on):
    return {"key": key, "model": "m", "dataset": "d",
            "seconds": {"gradient": grad, "semantic_entropy": se},
            "passes": {"gradient": 1, "semantic_entropy": 10},
            "timed_on": {k: v for k, v in (("gradient", grad_on), ("semantic_entropy", se_on))
                         if v is not None}}


def test_speedup_compares_timings_taken_on_one_machine():
    rows = [_timed("a", 1.0, 10.0, "fast", "fast"), _timed("b", 1.0, 40.0, "fast", "slow"),
            _timed("c", 4.0, 40.0, "slow", "slow")]
    se = {r["method"]: r for r in cost_table(rows)}["Sem. Ent."]
    assert se["speedup"] == pytest.approx(50.0 / 5.0)  # rows a and c: 10x; b is left out
    assert se["compared"] == "same machine (2 rows)" and se["machines"] == 2
    assert se["mean_s"] == pytest.approx(30.0)  # the cost itself is over every timed row
    assert se["median_s"] == pytest.approx(40.0)
    se = {r["method"]: r for r in cost_table(rows[1:2])}["Sem. Ent."]
    assert se["compared"] == "different machines" and se["speedup"] is None
    old = [_timed("a", 1.0, 10.0, None, None), _timed("b", 1.0, 30.0, None, "slow")]
    se = {r["method"]: r for r in cost_table(old)}["Sem. Ent."]
    assert se["compared"] == "machine not recorded" and se["speedup"] == pytest.approx(20.0)
    grad = {r["method"]: r for r in cost_table(rows)}["Gradient norm (ours)"]
    assert grad["speedup"] == pytest.approx(1.0) and grad["compared"] == "reference"
