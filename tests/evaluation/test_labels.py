"""Label quality: hand labels against judge and lexical labels, and AUROCs under each."""

from __future__ import annotations

import numpy as np
import pytest

from isouq.errors import DataError
from isouq.evaluation.labels import (
    auroc_by_labels,
    gold_index,
    label_agreement,
    label_tables,
    raw_auroc_by_labels,
    with_gold_labels,
)


def _rows(n: int = 60, seed: int = 0):
    """Rows whose hand label is exactly 'aleatoric < 0'; the judge's label is a coin flip,
    lexical is the hand label with the first 6 flipped."""
    rng = np.random.default_rng(seed)
    alea = rng.normal(size=n)
    gold = alea < 0
    judge = rng.random(n) < 0.5
    judge[:2], judge[2:4] = True, False
    lex = gold.copy()
    lex[:6] = ~lex[:6]
    rows, golds = [], []
    for i in range(n):
        rows.append({"key": f"q{i}", "dataset": "D", "model": "m", "correct": int(judge[i]),
                     "lexical_correct": bool(lex[i]),
                     "scores": {"aleatoric": float(alea[i]), "epistemic": float(np.exp(alea[i])),
                                "mean_prob": float(-alea[i]), "naive_entropy": float(rng.normal()),
                                "p_true": float(rng.random())}})
        golds.append({"key": f"q{i}", "dataset": "D", "model": "m",
                      "gold_correct": bool(gold[i]), "note": ""})
    return rows, golds, gold, judge, lex


def _kappa(a, b):  # textbook formula, independent of scikit-learn
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    po = (a == b).mean()
    pe = a.mean() * b.mean() + (1 - a.mean()) * (1 - b.mean())
    return (po - pe) / (1 - pe)


def test_agreement_counts_and_kappa():
    rows, golds, gold, judge, lex = _rows()
    rows.append({**rows[0], "key": "unlabelled"})  # no hand label: not counted
    got = {r["labels"]: r for r in label_agreement(rows, golds)}
    for name, pred in (("judge", judge), ("lexical", lex)):
        r = got[name]
        assert r["n"] == 60 and r["gold correct"] == int(gold.sum())
        assert r["positive"] == int(pred.sum())
        assert r["true positive"] == int((pred & gold).sum())
        assert r["false positive"] == int((pred & ~gold).sum())
        assert r["accuracy"] == pytest.approx((pred == gold).mean())
        assert r["kappa"] == pytest.approx(_kappa(pred, gold))
    assert got["lexical"]["accuracy"] == pytest.approx(54 / 60)


def test_gold_rows_are_checked_and_relabel():
    rows, golds, gold, *_ = _rows(n=8)
    with pytest.raises(DataError, match="lacks one of"):
        gold_index([{"key": "q0", "dataset": "D"}])
    with pytest.raises(DataError, match="disagree"):
        gold_index([golds[0], {**golds[0], "gold_correct": not golds[0]["gold_correct"]}])
    re = with_gold_labels(rows, golds[:5])
    assert [r["key"] for r in re] == [f"q{i}" for i in range(5)]
    assert [r["correct"] for r in re] == [int(g) for g in gold[:5]]
    assert all(r["label_source"] == "gold" for r in re)


def test_raw_auroc_shows_direction_per_labelling():
    rows, golds, *_ = _rows()
    got = {r["labels"]: r for r in raw_auroc_by_labels(rows, golds)}
    # gold = aleatoric < 0: aleatoric and epistemic (monotone in it) rank perfectly as
    # uncertainty, mean_prob = -aleatoric is a certainty and is negated: also perfect
    assert got["gold"]["aleatoric"] == 1.0 and got["gold"]["epistemic"] == 1.0
    assert got["gold"]["mean_prob"] == 1.0
    assert got["gold"]["semantic_entropy"] is None  # no row has it
    assert abs(got["judge"]["aleatoric"] - 0.5) < 0.2  # the judge's labels are coin flips


def test_auroc_by_labels_separates_label_noise_from_method():
    rows, golds, *_ = _rows(n=80)
    t = {r["labels"]: r for r in auroc_by_labels(rows, golds, n_bootstrap=20)}
    assert t["gold"]["Alea."] > 0.95 and t["gold"]["n"] == 80
    assert abs(t["judge"]["Alea."] - 0.5) < 0.2
    assert t["gold"]["Sem. Ent."] is None
    assert set(label_tables(rows, golds, n_bootstrap=5)) == {
        "label_agreement", "auroc_by_labels", "raw_auroc_by_labels"}
    assert label_tables(rows, [], n_bootstrap=5) == {
        "label_agreement": [], "auroc_by_labels": [], "raw_auroc_by_labels": []}
