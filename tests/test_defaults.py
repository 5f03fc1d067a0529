"""The scores isouq shows first follow the kept evidence (isouq.defaults): the written rule,
applied to the kept files again, picks the defaults the code uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isouq import defaults
from isouq.defaults import Cell, choose, least_trusted

ROOT = Path(__file__).resolve().parents[1]
SPAN_NAMES = {"span aleatoric": "aleatoric", "span epistemic": "epistemic",
              "span epistemic_log": "epistemic_log", "span 1 − p̄": "mean_prob"}


def span_cells() -> list[Cell]:
    """AUROC of each span score for the wrong sentences, per kept model × setting."""
    doc = json.loads((ROOT / "results/qa_long/results.json").read_text(encoding="utf-8"))
    return [Cell(SPAN_NAMES[r["score"]], r["n"], r["auroc"], r["ci_low"], r["ci_high"])
            for r in doc["tables"]["auroc"] if r["score"] in SPAN_NAMES]


def answer_cells() -> list[Cell]:
    """Raw AUROC of each score as a confidence, per kept dataset × model of the QA study."""
    doc = json.loads((ROOT / "results/report/report.json").read_text(encoding="utf-8"))
    (qa,) = [s["tables"] for s in doc["sections"] if s["id"] == "qa-study"]
    return [Cell(r["score"], r["n"], r["auroc"], r["ci_low"], r["ci_high"])
            for r in qa["raw_auroc"]]


def test_the_span_default_is_the_rules_choice_on_the_kept_sentences():
    cells = span_cells()
    assert len({(c.score) for c in cells}) == 4 and len(cells) >= 20
    assert choose(cells, ["aleatoric", "epistemic", "epistemic_log", "mean_prob"]) == \
        defaults.SPAN_SCORE
    # the scores the rule refuses point the wrong way beyond noise somewhere
    for refused in ("epistemic_log", "mean_prob"):
        assert any(c.ci_high < 0.5 for c in cells if c.score == refused)


def test_the_answer_headline_is_the_rules_choice_on_the_kept_qa_study():
    cells = answer_cells()
    assert choose(cells, ["mean_prob", "epistemic", "epistemic_log", "aleatoric"]) == \
        defaults.ANSWER_SCORE


def test_the_rule_by_hand():
    cells = [Cell("a", 100, 0.70, 0.60, 0.80), Cell("a", 100, 0.45, 0.35, 0.55),
             Cell("b", 100, 0.90, 0.80, 0.95), Cell("b", 10, 0.30, 0.10, 0.49),
             Cell("c", 300, 0.56, 0.52, 0.60)]
    assert choose(cells, ["a", "b", "c"]) == "a"  # b is wrong-way once; a pools 0.575 > 0.56
    with pytest.raises(ValueError, match="no candidate"):
        choose(cells, ["b"])


def test_least_trusted_reads_the_score_the_way_it_points():
    def sp(**scores):
        return {"scores": scores}

    spans = [sp(aleatoric=0.1, mean_prob=0.9), sp(aleatoric=0.3, mean_prob=0.2),
             sp(aleatoric=0.2, mean_prob=0.5)]
    assert least_trusted(spans) == 1 and least_trusted(spans, "mean_prob") == 1
    assert least_trusted(spans[:1]) is None
    assert least_trusted([sp(aleatoric=float("nan")), sp(aleatoric=0.5)]) == 1
