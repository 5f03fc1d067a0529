"""Toy models: sizes, layout shared with JAX, the posterior they target, and MAP stationarity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpyro.infer.util import potential_energy

import isouq.study.reference as R
from isouq.data.synthetic import make_problem
from isouq.errors import InputError, ModelError
from isouq.models import toy as tm
from isouq.study.reference.jax_models import forward
from isouq.study.reference.model import bnn_model


def test_parameter_counts():
    assert tm.mlp2(2, 32, 1).n_params == 1185
    assert tm.regression_mlp(1, 32).n_params == 97
    assert tm.linear_regression(1).n_params == 2
    assert tm.logistic_regression(2).n_params == 3
    assert tm.softmax_regression(2, 4).n_params == 12
    for spec in (tm.mlp2(2, 8, 4), tm.regression_mlp(), tm.logistic_regression()):
        model = tm.build(spec)
        assert sum(p.numel() for p in model.parameters()) == spec.n_params
        assert [n for n, _ in model.named_parameters()] == [n for n, _ in spec.param_shapes()]
        assert tm.spec_of(model) == spec


def test_build_seeded_and_rng_untouched():
    state = torch.random.get_rng_state()
    a, b = tm.build(tm.mlp2(2, 8), seed=1), tm.build(tm.mlp2(2, 8), seed=1)
    c = tm.build(tm.mlp2(2, 8), seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert np.array_equal(R.flat_params(a), R.flat_params(b))
    assert not np.array_equal(R.flat_params(a), R.flat_params(c))


def test_spec_of_rejects_other_models():
    with pytest.raises(ModelError):
        nn = torch.nn
        tm.spec_of(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)))


@pytest.mark.parametrize(
    "spec", [tm.mlp2(2, 5, 3), tm.regression_mlp(1, 4), tm.logistic_regression()]
)
def test_jax_forward_and_state_dict_match_torch(spec):
    model = tm.build(spec, seed=0).double()
    X = torch.randn(7, spec.in_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    theta = R.flat_params(model)
    out_j = np.asarray(forward(theta, X.numpy(), spec))
    np.testing.assert_allclose(out_j, model(X).detach().numpy(), rtol=1e-12, atol=1e-12)
    other = tm.build(spec, seed=5)
    other.load_state_dict(R.to_state_dict(theta, spec))
    np.testing.assert_allclose(other(X.float()).detach().numpy(), out_j, rtol=1e-5, atol=1e-6)
    R.load_into(other, theta)
    assert np.allclose(R.flat_params(other), theta, atol=1e-7)
    with pytest.raises(InputError):
        R.to_state_dict(theta[:-1], spec)


@pytest.mark.parametrize(
    "name,spec",
    [("binary_xor", tm.mlp2(2, 4, 1)), ("multiclass_spirals", tm.mlp2(2, 4, 4)),
     ("regression_nonlinear", tm.regression_mlp(1, 4))],
)
def test_torch_and_numpyro_target_the_same_posterior(name, spec):
    """−log posterior in torch and NumPyro's potential differ by a θ-independent constant."""
    p = make_problem(name, n_train=40)
    model = bnn_model(spec, p.task, 2.0, p.noise_std if p.task == "regression" else None)
    X = p.X.double().numpy()
    y = p.y.numpy() if p.task != "regression" else p.y.double().numpy()
    diffs = []
    for seed in (0, 1, 2):
        net = tm.build(spec, seed=seed).double()
        yt = p.y if p.task == "multiclass" else p.y.double()
        with torch.no_grad():
            torch_nlp = float(tm.neg_log_posterior(net, p.X.double(), yt, p.task, 2.0,
                                                   p.noise_std))
        pot = float(potential_energy(model, (X, y), {}, {"theta": R.flat_params(net)}))
        diffs.append(pot - torch_nlp)
    D = spec.n_params
    assert np.allclose(diffs, 0.5 * D * np.log(2 * np.pi / 2.0), rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "name,kind", [("binary_xor", "mlp"), ("multiclass_clusters", "linear"),
                  ("binary_linear", "linear"), ("regression_nonlinear", "mlp")],
)
def test_map_is_stationary_and_deterministic(name, kind):
    p = make_problem(name, n_train=80)
    spec = tm.spec_for(p, kind, width=6)
    fits, thetas = [], []
    for _ in range(2):
        model = tm.build(spec, seed=0)
        fit = tm.train_map(model, p.X, p.y, p.task, 1.0, noise_std=p.noise_std,
                           adam_steps=300, lbfgs_iter=500)
        fits.append(fit)
        thetas.append(R.flat_params(model))
    assert np.array_equal(thetas[0], thetas[1])
    # gradient of the float64 objective at the float32 θ* ≈ 0 (relative to the data term)
    model64 = tm.build(spec).double()
    R.load_into(model64, thetas[0])
    loss = tm.neg_log_posterior(model64, p.X.double(),
                                p.y if p.task == "multiclass" else p.y.double(),
                                p.task, 1.0, p.noise_std)
    g = torch.autograd.grad(loss, list(model64.parameters()))
    gnorm = float(torch.sqrt(sum((x**2).sum() for x in g)))
    assert fits[0].grad_norm < 1e-3
    assert gnorm < 1e-2 * np.sqrt(p.n_train)  # float32 rounding of θ* only


def test_map_linear_regression_equals_analytic_posterior_mean():
    p = make_problem("regression_linear", n_train=60)
    model = tm.build(tm.linear_regression(1))
    tm.train_map(model, p.X, p.y, "regression", 3.0, noise_std=p.noise_std, adam_steps=0)
    mean, _ = R.blr_posterior(R.linear_features(p.X), p.y, 3.0, p.noise_std)
    np.testing.assert_allclose(R.flat_params(model), mean.numpy(), atol=1e-6)


def test_train_map_errors():
    p = make_problem("regression_linear", n_train=20)
    model = tm.build(tm.linear_regression(1))
    with pytest.raises(InputError, match="noise_std"):
        tm.train_map(model, p.X, p.y, "regression", 1.0)
    with pytest.raises(InputError, match="task"):
        tm.train_map(model, p.X, p.y, "ordinal", 1.0)
    with pytest.raises(InputError):
        tm.train_map(model, p.X, p.y[:5], "regression", 1.0, noise_std=0.1)
    with pytest.raises(InputError):
        tm.train_map(model, p.X, p.y, "regression", 0.0, noise_std=0.1)


def test_fan_in_prior_potential_is_nll_plus_per_layer_gaussian():
    """NumPyro's potential with prior="fan_in" = torch NLL + Σ_layers (fan_in λ/2)‖W‖² + (λ/2)‖b‖²
    + the Gaussian normaliser, computed layer by layer from the torch module."""
    spec = tm.mlp2(2, 5, 4)
    p = make_problem("multiclass_spirals", n_train=30)
    lam = 3.0
    model = bnn_model(spec, p.task, lam, prior="fan_in")
    net = tm.build(spec, seed=1).double()
    with torch.no_grad():
        nll = float(tm.neg_log_likelihood(net(p.X.double()), p.y, p.task, None))
        prior, log_norm = 0.0, 0.0
        for layer in (m for m in net if isinstance(m, torch.nn.Linear)):
            prec_w = lam * layer.in_features
            prior += 0.5 * prec_w * float((layer.weight**2).sum()) + 0.5 * lam * float(
                (layer.bias**2).sum())
            log_norm += 0.5 * layer.weight.numel() * np.log(2 * np.pi / prec_w)
            log_norm += 0.5 * layer.bias.numel() * np.log(2 * np.pi / lam)
    pot = float(potential_energy(model, (p.X.double().numpy(), p.y.numpy()), {},
                                 {"theta": R.flat_params(net)}))
    assert pot == pytest.approx(nll + prior + log_norm, rel=1e-10)
    sd = tm.prior_std(spec, lam, "fan_in")
    assert sd.shape == (spec.n_params,) and sd[0] == pytest.approx((lam * 2) ** -0.5)
    np.testing.assert_allclose(tm.prior_std(spec, lam), np.full(spec.n_params, lam**-0.5))
    with pytest.raises(InputError, match="prior must be one of"):
        tm.prior_std(spec, lam, "laplace")
