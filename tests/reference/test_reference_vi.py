"""Mean-field VI reference: the mean-field optimum of a Gaussian posterior, ELBO trace, shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import isouq.study.reference as R
from isouq.data.synthetic import make_problem
from isouq.errors import InputError
from isouq.models import toy as tm


@pytest.fixture(scope="module", params=["trace", "analytic_kl"])
def blr(request):
    p = make_problem("regression_linear", n_train=200, grid_n=11)
    spec = tm.linear_regression(1)
    ref = R.vi_reference(p, spec, prior_precision=1.0, num_steps=3000, batch_size=50, lr=0.05,
                         final_lr_ratio=0.01, seed=0, num_predictive_draws=4000,
                         elbo=request.param)
    return p, spec, ref


def test_vi_recovers_mean_field_optimum(blr):
    """For a Gaussian posterior the mean-field optimum has the exact mean, variances 1/Λᵢᵢ
    (either ELBO estimator)."""
    p, _, ref = blr
    mean, cov = R.blr_posterior(R.linear_features(p.X), p.y, 1.0, p.noise_std)
    mf_mean, mf_var = R.mean_field_optimum(mean, cov)
    mf_sd = mf_var.sqrt().numpy()
    assert np.all(np.abs(ref.param_mean.numpy() - mf_mean.numpy()) < 0.25 * mf_sd)
    assert np.all(np.abs(ref.param_std.numpy() / mf_sd - 1) < 0.15)
    assert np.all(mf_var.numpy() <= np.diag(cov.numpy()) + 1e-15)  # mean field underestimates
    # predictive variance of f from q's draws ≈ φᵀ diag(s²) φ
    phi = R.linear_features(p.grid).numpy()
    expected = (phi**2) @ (ref.param_std.numpy() ** 2)
    np.testing.assert_allclose(ref.epistemic.numpy(), expected, rtol=0.1)


def test_elbo_trace(blr):
    _, _, ref = blr
    elbo = ref.elbo.numpy()
    assert elbo.shape == (3000,) and np.isfinite(elbo).all()
    assert elbo[-300:].mean() > elbo[:300].mean()
    d = ref.diagnostics
    assert d["elbo_final"] == pytest.approx(elbo[-300:].mean())
    assert ref.settings["batch_size"] == 50 and ref.method == "vi"


@pytest.fixture(scope="module")
def spirals():
    """Full batch, float32, started from given parameters; run twice with the same seed."""
    p = make_problem("multiclass_spirals", n_train=60, grid_n=3)
    spec = tm.mlp2(2, 4, 4)
    init = R.flat_params(tm.build(spec, seed=3))
    kw = dict(num_steps=200, batch_size=None, num_predictive_draws=50, dtype="float32",
              init=init)
    return p, spec, init, [R.vi_reference(p, spec, seed=0, **kw) for _ in range(2)]


def test_classification_shapes_state_dict_and_seed(spirals):
    p, spec, init, (a, b) = spirals
    assert torch.equal(a.param_mean, b.param_mean) and torch.equal(a.elbo, b.elbo)
    assert a.epistemic.shape == a.aleatoric.shape == a.mean.shape == (9, 4)
    assert torch.allclose(a.mean.sum(1), torch.ones(9, dtype=torch.float64), atol=1e-5)
    assert a.settings["batch_size"] == 60 and a.settings["init"] == "given"
    assert not np.allclose(a.param_mean.numpy(), init)  # it moved from the start
    model = tm.build(spec)
    model.load_state_dict(a.state_dict())
    np.testing.assert_allclose(R.flat_params(model), a.param_mean.numpy(), rtol=1e-6, atol=1e-7)


def test_errors():
    p = make_problem("binary_rings", n_train=40, grid_n=3)
    spec = tm.logistic_regression(2)
    with pytest.raises(InputError, match="init"):
        R.vi_reference(p, spec, init=np.zeros(7), num_steps=5)
    with pytest.raises(InputError, match="init"):
        R.vi_reference(p, spec, init="prior", num_steps=5)
    with pytest.raises(InputError, match="dtype"):
        R.vi_reference(p, spec, dtype="float16", num_steps=5)
    with pytest.raises(InputError, match="elbo must be one of"):
        R.vi_reference(p, spec, elbo="renyi", num_steps=5)
    with pytest.raises(InputError, match="prior must be one of"):
        R.vi_reference(p, spec, prior="wide", num_steps=5)
    with pytest.raises(InputError, match="ONE logit"):
        R.vi_reference(p, tm.softmax_regression(2, 2), num_steps=5)
