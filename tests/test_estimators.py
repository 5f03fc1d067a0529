"""score_classifier / score_regressor against closed forms and brute-force autograd."""

import pytest
import torch
from torch import nn

import isouq
from isouq.errors import CovarianceError, InputError, MemoryBudgetError, ModelError

torch.manual_seed(0)


def brute(model, x, out_fn):
    """(N, K) ‖∇θ out_k(x_i)‖² by one autograd.grad call per example and output."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        o = out_fn(model(x[i : i + 1]))[0]
        row = []
        for k in range(o.shape[0]):
            gs = torch.autograd.grad(o[k], params, retain_graph=True, allow_unused=True)
            row.append(sum(g.pow(2).sum() for g in gs if g is not None))
        rows.append(torch.stack(row))
    return torch.stack(rows).detach()


def test_logistic_regression_closed_form():
    m = nn.Linear(3, 1)
    x = torch.randn(20, 3)
    s = isouq.score_classifier(m, x)
    p = torch.sigmoid(m(x)).detach()[:, 0]
    want = (p * (1 - p)) ** 2 * (x.pow(2).sum(1) + 1)  # ‖∇p‖² = (p(1−p))² ‖x̃‖²
    assert s.epistemic.shape == (20, 2)
    assert torch.allclose(s.epistemic[:, 1], want, rtol=1e-5)
    assert torch.allclose(s.epistemic[:, 0], want, rtol=1e-5)
    assert torch.allclose(s.aleatoric[:, 1], p * (1 - p), rtol=1e-6)
    assert torch.allclose(s.probs[:, 1], p)
    assert s.params.n_params == 4


def test_softmax_regression_closed_form_per_class():
    m = nn.Linear(2, 4)
    x = torch.randn(15, 2)
    p = torch.softmax(m(x), 1).detach()
    # ∂p_c/∂W_k = p_c(δ_ck − p_k) x̃  =>  ‖∇p_c‖² = p_c² Σ_k (δ_ck − p_k)² ‖x̃‖²
    eye = torch.eye(4)
    want = p.pow(2) * ((eye[None] - p[:, None, :]).pow(2).sum(-1)) * (x.pow(2).sum(1, keepdim=True) + 1)
    for method in ("ghost", "functorch"):
        s = isouq.score_classifier(m, x, method=method)
        assert torch.allclose(s.epistemic, want, rtol=1e-5), method


@pytest.mark.parametrize(
    "sizes,out", [((2, 8, 1), "binary"), ((3, 16, 16, 4), "multi"), ((5, 7, 3, 2), "multi")]
)
def test_mlp_against_bruteforce(sizes, out):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=False):
        layers += [nn.Linear(a, b), nn.Tanh()]
    m = nn.Sequential(*layers[:-1])
    x = torch.randn(9, sizes[0])

    def probs(o):
        if o.shape[1] == 1:
            return torch.cat([1 - torch.sigmoid(o), torch.sigmoid(o)], 1)
        return torch.softmax(o, 1)

    want = brute(m, x, probs)
    for method in ("ghost", "functorch"):
        s = isouq.score_classifier(m, x, method=method, batch_size=4)
        assert torch.allclose(s.epistemic, want, rtol=1e-4, atol=1e-10), method


def test_regressor_against_bruteforce():
    m = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
    assert sum(p.numel() for p in m.parameters()) == 97
    x = torch.linspace(-3, 3, 11)[:, None]
    want = brute(m, x, lambda o: o)[:, 0]
    for method in ("ghost", "functorch"):
        r = isouq.score_regressor(m, x, method=method)
        assert torch.allclose(r.epistemic, want, rtol=1e-4), method
    assert torch.allclose(r.mean, m(x)[:, 0].detach())


def test_laplace_against_explicit_dense_inverse():
    """Full Laplace gᵀ(H+λI)⁻¹g vs an explicit inverse of a closed-form logistic GGN/EF/Hessian."""
    torch.manual_seed(1)
    m = nn.Linear(2, 1).double()
    X = torch.randn(40, 2, dtype=torch.float64)
    y = (X[:, 0] + 0.3 * torch.randn(40, dtype=torch.float64) > 0).long()
    x = torch.randn(7, 2, dtype=torch.float64)
    Xt = torch.cat([X, torch.ones(40, 1, dtype=torch.float64)], 1)  # params: w (2), b (1)
    p = torch.sigmoid(m(X)).detach()[:, 0]
    ggn = (Xt * (p * (1 - p))[:, None]).T @ Xt  # = exact Hessian for logistic regression
    ef = (Xt * ((p - y) ** 2)[:, None]).T @ Xt
    px = torch.sigmoid(m(x)).detach()[:, 0]
    g = (px * (1 - px))[:, None] * torch.cat([x, torch.ones(7, 1, dtype=torch.float64)], 1)
    lam = 0.5
    for kind, H in (("ggn", ggn), ("hessian", ggn), ("ef", ef)):
        inv = torch.linalg.inv(H + lam * torch.eye(3, dtype=torch.float64))
        want = torch.einsum("np,pq,nq->n", g, inv, g)
        s = isouq.score_classifier(m, x, covariance="laplace", data=(X, y), hessian=kind,
                                   prior_precision=lam)
        assert torch.allclose(s.epistemic[:, 1], want, rtol=1e-6), kind
        d = isouq.score_classifier(m, x, covariance="diagonal", data=(X, y),
                                   hessian="ef" if kind == "ef" else "ggn", prior_precision=lam)
        want_d = (g.pow(2) / (torch.diagonal(H) + lam)).sum(1)
        assert torch.allclose(d.epistemic[:, 1], want_d, rtol=1e-6), kind


def test_regression_laplace_linear_closed_form():
    m = nn.Linear(1, 1).double()
    X = torch.randn(30, 1, dtype=torch.float64)
    y = 2 * X[:, 0] + 0.1 * torch.randn(30, dtype=torch.float64)
    x = torch.linspace(-2, 2, 5, dtype=torch.float64)[:, None]
    Xt = torch.cat([X, torch.ones_like(X)], 1)
    sigma = 0.5
    H = Xt.T @ Xt / sigma**2
    g = torch.cat([x, torch.ones_like(x)], 1)
    want = torch.einsum("np,pq,nq->n", g, torch.linalg.inv(H + torch.eye(2, dtype=H.dtype)), g)
    r = isouq.score_regressor(m, x, covariance="laplace", data=(X, y), hessian="hessian",
                              sigma_noise=sigma)
    assert torch.allclose(r.epistemic, want, rtol=1e-8)


def test_last_layer_laplace_equals_laplace_on_features():
    torch.manual_seed(2)
    body = nn.Sequential(nn.Linear(2, 6), nn.Tanh())
    head = nn.Linear(6, 3)
    m = nn.Sequential(body, head)
    X, y = torch.randn(50, 2), torch.randint(0, 3, (50,))
    x = torch.randn(8, 2)
    s = isouq.score_classifier(m, x, covariance="last_layer", data=(X, y))
    assert s.params.names == ("1.weight", "1.bias")
    with torch.no_grad():
        F, f = body(X), body(x)
    ref = isouq.score_classifier(head, f, covariance="laplace", data=(F, y))
    assert torch.allclose(s.epistemic, ref.epistemic, rtol=1e-5)


def test_covariance_scale_keeps_rankings():
    m = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(30, 2)
    X, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    base = isouq.score_classifier(m, x).epistemic[:, 1]
    scaled = isouq.score_classifier(m, x, covariance=isouq.Identity(scale=7.5)).epistemic[:, 1]
    assert torch.allclose(scaled, 7.5 * base, rtol=1e-6)
    assert torch.equal(base.argsort(), scaled.argsort())
    # (cH + cλ)⁻¹ = (H + λ)⁻¹ / c: rankings of the Laplace estimate do not depend on c
    H = isouq.curvature(m, dict(m.named_parameters()), X, y, likelihood="classification")
    a = isouq.score_classifier(m, x, covariance=isouq.Dense(H, 1.0)).epistemic[:, 1]
    b = isouq.score_classifier(m, x, covariance=isouq.Dense(3 * H, 3.0)).epistemic[:, 1]
    assert torch.allclose(b, a / 3, rtol=1e-5)
    assert torch.equal(a.argsort(), b.argsort())


def test_params_selection_and_normalized():
    m = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(5, 2)
    s = isouq.score_classifier(m, x, params="2.*")
    assert s.params.names == ("2.weight", "2.bias") and s.params.n_params == 27
    ll = isouq.score_classifier(m, x, params="last_layer")
    assert torch.allclose(s.epistemic, ll.epistemic)
    by_tensor = isouq.score_classifier(m, x, params=[m[2].weight, m[2].bias])
    assert torch.allclose(s.epistemic, by_tensor.epistemic)
    sq = float(m[2].weight.detach().pow(2).sum() + m[2].bias.detach().pow(2).sum())
    assert torch.allclose(s.normalized_epistemic, s.epistemic / sq)
    pred = s.predicted()
    assert pred.epistemic.shape == (5,)


def test_dropout_model_scored_in_eval_mode_and_mode_restored():
    m = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    x = torch.randn(6, 2)
    a = isouq.score_classifier(m, x).epistemic
    b = isouq.score_classifier(m, x).epistemic
    assert torch.equal(a, b) and m.training


def test_clear_errors(monkeypatch):
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with pytest.raises(InputError, match=r"expects \(N, 3\)"):
        isouq.score_classifier(m, torch.randn(5, 7))
    with pytest.raises(InputError, match="non-empty"):
        isouq.score_classifier(m, torch.randn(0, 3))
    with pytest.raises(InputError, match="NaN"):
        isouq.score_classifier(m, torch.tensor([[1.0, float("nan"), 0.0]]))
    frozen = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(ModelError, match="requires grad"):
        isouq.score_classifier(frozen, torch.randn(2, 3), params="trainable")
    bad = nn.Linear(3, 2)
    with torch.no_grad():
        bad.weight[0, 0] = float("inf")
    with pytest.raises(ModelError, match="NaN/inf"):
        isouq.score_classifier(bad, torch.randn(2, 3))
    with pytest.raises(CovarianceError, match="needs proxy data"):
        isouq.score_classifier(m, torch.randn(2, 3), covariance="laplace")
    with pytest.raises(CovarianceError, match="empty"):
        isouq.score_classifier(m, torch.randn(2, 3), covariance="diagonal",
                               data=(torch.randn(0, 3), torch.zeros(0, dtype=torch.long)))
    with pytest.raises(CovarianceError, match="unknown"):
        isouq.score_classifier(m, torch.randn(2, 3), covariance="kfac")
    big = nn.Sequential(nn.Linear(3, 300), nn.Tanh(), nn.Linear(300, 2))
    monkeypatch.setenv("ISOUQ_MAX_DENSE_BYTES", str(2**20))
    with pytest.raises(MemoryBudgetError, match=r"1,802 parameters .* GiB.*diagonal"):
        isouq.score_classifier(big, torch.randn(2, 3), covariance="laplace",
                               data=(torch.randn(4, 3), torch.zeros(4, dtype=torch.long)))
    with pytest.raises(ModelError, match="one output per example"):
        isouq.score_regressor(m, torch.randn(2, 3))
    with pytest.raises(InputError, match="matches no parameter"):
        isouq.score_classifier(m, torch.randn(2, 3), params="nope.*")
    assert issubclass(InputError, isouq.IsouqError)


def test_one_engine_vocabulary_for_every_scoring_function():
    """method= names the same engines everywhere (isouq.engines): per_example (older names
    functorch and loop) gives the ghost result on classifiers and LLM answers alike, and an
    unknown name is refused with the list."""
    import tiny
    from isouq.engines import ENGINES

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    x = torch.randn(5, 3)
    g = isouq.score_classifier(m, x, method="ghost").epistemic
    for name in ("per_example", "functorch", "auto"):
        torch.testing.assert_close(isouq.score_classifier(m, x, method=name).epistemic, g,
                                   rtol=1e-4, atol=1e-10)
    lm, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    P, A = ["who sat", "the cat"], [" a cat", " on the mat"]
    ghost = isouq.score_sequences(lm, tok, P, A, method="ghost").epistemic
    for name in ("per_example", "loop", "auto"):
        s = isouq.score_sequences(lm, tok, P, A, method=name)
        torch.testing.assert_close(s.epistemic, ghost, rtol=1e-4, atol=0)
        assert s.method in ENGINES
    for fn in (lambda: isouq.score_classifier(m, x, method="fast"),
               lambda: isouq.score_sequences(lm, tok, P, A, method="fast")):
        with pytest.raises(InputError, match="'ghost'.*'per_example'"):
            fn()
