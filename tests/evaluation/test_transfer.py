import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from isouq.study.analysis import leave_one_model_out, lomo_table


def _reference_model():
    """What fit_predict should equal: standardize, then scikit-learn's logistic regression."""
    return make_pipeline(StandardScaler(), LogisticRegression(solver="newton-cholesky"))


def test_lomo_matches_direct_computation():
    rng = np.random.default_rng(0)
    Xs, ys = [], []
    for _ in range(3):
        y = (rng.random(60) < 0.5).astype(int)
        Xs.append(np.c_[rng.normal(size=60) + y, rng.normal(size=60)])
        ys.append(y)
    got = leave_one_model_out(Xs, ys)
    for m in range(3):
        tr = [j for j in range(3) if j != m]
        clf = _reference_model()
        clf.fit(np.concatenate([Xs[j] for j in tr]), np.concatenate([ys[j] for j in tr]))
        ref = roc_auc_score(ys[m], clf.predict_proba(Xs[m])[:, 1])
        assert got[m] == pytest.approx(ref)


def test_lomo_inverted_relation_goes_below_chance():
    rng = np.random.default_rng(1)
    ys = [(rng.random(80) < 0.5).astype(int) for _ in range(3)]
    signs = [1.0, 1.0, -1.0]  # the third model's score runs the other way
    Xs = [(s * (2 * y - 1) + 0.3 * rng.normal(size=80))[:, None]
          for s, y in zip(signs, ys, strict=True)]
    got = leave_one_model_out(Xs, ys)
    assert got[2] < 0.2


def test_lomo_table(rows):
    table = lomo_table(rows)
    assert [r["held_out"] for r in table[:5]] == ["m1", "m2", "m3", "Mean", "Std"]
    assert set(table[0]) == {"dataset", "held_out", "Raw", "Normalized", "Raw & Alea.",
                             "Norm & Alea."}
    assert table[3]["Raw & Alea."] > 0.75  # aleatoric transfers in the synthetic data
    two = [r for r in rows if r["model"] != "m3"]
    assert lomo_table(two) == []  # fewer than 3 models: nothing to leave out
