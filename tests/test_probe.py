"""isouq.probe: the hidden-state probe as numbers reproduces scikit-learn's fitted pipeline, its
stacking logits are out of fold, and a damaged or mismatched probe is refused."""

from __future__ import annotations

import numpy as np
import pytest

from isouq.errors import DataError, InputError
from isouq.evaluation.classifier import correctness_model
from isouq.probe import PROBE_C, FittedProbe, fit_probe, logit, stack_logits


def states_and_labels(n=150, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(float)
    return X, y


def test_a_fitted_probe_is_scikit_learns_pipeline_as_numbers():
    X, y = states_and_labels()
    probe = fit_probe("hidden_states[3]", X, y, 0.1)
    ref = correctness_model(0.1).fit(X, y)
    np.testing.assert_allclose(probe.logit(X), ref.decision_function(X), rtol=1e-10)
    back = FittedProbe.from_dict(probe.to_dict())
    assert back == probe
    with pytest.raises(DataError, match="incomplete"):
        FittedProbe.from_dict({**probe.to_dict(), "coef": probe.to_dict()["coef"][:-1]})
    with pytest.raises(InputError, match="width 10"):
        probe.logit(X[:, :4])


def test_stacking_logits_are_out_of_fold_and_the_probe_is_refitted_on_all():
    X, y = states_and_labels()
    noise = np.random.default_rng(1).normal(size=X.shape)
    z, probe = stack_logits({"a": noise, "b": X}, y, seed=0)
    assert probe.state == "b" and probe.C in PROBE_C  # the telling state
    rng = np.random.default_rng(0)
    part = rng.permutation(len(y)) % 3  # the same inner folds
    for j in range(3):  # each answer's logit from a probe fitted without its inner fold
        ref = correctness_model(probe.C).fit(X[part != j], y[part != j])
        np.testing.assert_allclose(z[part == j], logit(ref.predict_proba(X[part == j])[:, 1]),
                                   rtol=1e-8, atol=1e-8)
    full = correctness_model(probe.C).fit(X, y)
    np.testing.assert_allclose(probe.logit(X), full.decision_function(X), rtol=1e-10)
