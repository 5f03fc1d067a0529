import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from isouq.evaluation import (
    auroc,
    auroc_table,
    bootstrap_metrics,
    bootstrap_splits,
    evaluate_splits,
    fit_predict,
)


def _reference_model():
    """What fit_predict should equal: standardize, then scikit-learn's logistic regression."""
    return make_pipeline(StandardScaler(), LogisticRegression(solver="newton-cholesky"))


def test_auroc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.4
    s = np.round(rng.normal(size=300) + y, 1)  # rounding makes ties
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    assert np.isnan(auroc(np.ones(4), np.arange(4.0)))


def test_bootstrap_splits_are_out_of_bag():
    rng = np.random.default_rng(1)
    y = (rng.random(40) < 0.5).astype(int)
    for train, oob in bootstrap_splits(y, 25, np.random.default_rng(2)):
        assert train.size == y.size
        assert np.intersect1d(train, oob).size == 0
        assert np.setdiff1d(np.arange(y.size), train).tolist() == oob.tolist()
        assert set(y[train]) == {0, 1} and set(y[oob]) == {0, 1}


def test_fit_predict_matches_sklearn_pipeline():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 2)) * [1.0, 50.0] + [0.0, 10.0]
    y = (X[:, 0] + rng.normal(size=120) > 0).astype(int)
    ref = _reference_model().fit(X[:90], y[:90])
    assert np.allclose(fit_predict(X[:90], y[:90], X[90:]), ref.predict_proba(X[90:])[:, 1],
                       atol=1e-6)


def test_evaluate_splits_matches_direct_computation():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(100, 1))
    y = (X[:, 0] + rng.normal(size=100) > 0).astype(int)
    splits = bootstrap_splits(y, 3, np.random.default_rng(5))
    res = evaluate_splits(X, y, splits)
    for k, (tr, te) in enumerate(splits):
        clf = _reference_model().fit(X[tr], y[tr])
        p = clf.predict_proba(X[te])[:, 1]
        assert res["auroc"][k] == pytest.approx(roc_auc_score(y[te], p))
        assert res["auroc"][k] == pytest.approx(roc_auc_score(y[te], X[te, 0]))  # monotone


def test_perfect_score_gives_auroc_and_prr_one():
    rng = np.random.default_rng(6)
    y = (rng.random(80) < 0.5).astype(int)
    for score in (1.0 - y + 0.1 * rng.random(80), -3.0 * y):  # uncertainty or confidence
        m = bootstrap_metrics(score[:, None], y, n_bootstrap=20, seed=0)
        assert np.allclose(m["auroc"], 1.0)
        assert np.allclose(m["prr"], 1.0)


def test_random_score_gives_chance():
    rng = np.random.default_rng(7)
    means = []
    for r in range(6):
        y = (rng.random(200) < 0.5).astype(int)
        m = bootstrap_metrics(rng.normal(size=(200, 1)), y, n_bootstrap=20, seed=r)
        means.append([m["auroc"].mean(), m["prr"].mean()])
    auc, prr_ = np.mean(means, axis=0)
    assert auc == pytest.approx(0.5, abs=0.04)
    assert prr_ == pytest.approx(0.0, abs=0.08)


def test_missing_features_are_left_out():
    rng = np.random.default_rng(8)
    y = (rng.random(60) < 0.5).astype(int)
    X = (1.0 - y + 0.1 * rng.random(60))[:, None]
    X[::7] = np.nan
    m = bootstrap_metrics(X, y, n_bootstrap=5, seed=1)
    assert np.allclose(m["auroc"], 1.0)


def test_auroc_table_rows(rows):
    table = auroc_table(rows[:160], n_bootstrap=5)  # one dataset, two models
    assert {(r["model"], r["method"]) for r in table} >= {("m1", "Alea."), ("m2", "P(True)")}
    alea = [r for r in table if r["method"] == "Alea."]
    assert all(r["n"] == 80 and r["auroc_mean"] > 0.75 for r in alea)


def test_dataset_mean_only_for_methods_on_every_model(rows):
    from isouq.evaluation.auroc import method_by_dataset, method_runs, model_by_method
    from isouq.evaluation.rows import group_rows

    rows = [dict(r, scores=dict(r["scores"])) for r in rows if r["dataset"] == "TriviaQA"]
    for r in rows:
        if r["model"] != "m1":  # semantic entropy computed for m1 only
            del r["scores"]["semantic_entropy"]
    groups = group_rows(rows)
    runs = method_runs(groups, n_bootstrap=5)
    table = {r["method"]: r for r in method_by_dataset(runs)}
    assert table["Sem. Ent."]["TriviaQA"] is None and table["Sem. Ent."]["TriviaQA ±"] is None
    want = np.mean(np.concatenate([runs[("TriviaQA", m, "Alea.")]["auroc"]
                                   for m in ("m1", "m2", "m3")]))
    assert table["Alea."]["TriviaQA"] == pytest.approx(want)
    per_model = {r["model"]: r for r in model_by_method(runs, groups)}
    assert per_model["m1"]["Sem. Ent."] is not None and per_model["m2"]["Sem. Ent."] is None
