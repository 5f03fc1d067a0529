"""score_classifier(classes=...) and epistemic_log: against classes="all" gathered, and against
brute-force autograd of p_c and log p_c; one backward pass per batch; clear errors."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import isouq
from isouq import estimators
from isouq.errors import InputError, ModelError
from isouq.ghost.engine import GhostNorms

torch.manual_seed(0)


def brute(model, x, fn):
    """(N, K) ‖∇θ fn(model(x_i))_k‖², one autograd.grad per example and column."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        o = fn(model(x[i : i + 1]))[0]
        rows.append(torch.stack([sum(g.pow(2).sum() for g in torch.autograd.grad(
            o[k], params, retain_graph=True)) for k in range(o.shape[0])]))
    return torch.stack(rows).detach()


def cnn(C=5):
    m = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Conv2d(4, 4, 3, stride=2, groups=2), nn.GroupNorm(2, 4), nn.Flatten(),
                      nn.Linear(4 * 3 * 3, C))
    with torch.no_grad():
        m[1].running_mean.normal_(0, 0.2)
        m[1].running_var.uniform_(0.5, 2)
        for p in m.parameters():
            p.mul_(1.5)
    return m.eval()


def binary():
    return nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))


def binary_probs(o):
    return torch.cat([1 - torch.sigmoid(o), torch.sigmoid(o)], 1)


@pytest.mark.parametrize("method", ["ghost", "functorch"])
def test_all_classes_epistemic_and_log_against_brute_force(method):
    m, x = cnn(), torch.randn(5, 2, 7, 7)
    s = isouq.score_classifier(m, x, method=method, batch_size=3)
    torch.testing.assert_close(s.epistemic, brute(m, x, lambda o: torch.softmax(o, 1)),
                               rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(s.epistemic_log, brute(m, x, lambda o: torch.log_softmax(o, 1)),
                               rtol=1e-4, atol=1e-10)
    assert s.classes is None and s.epistemic.shape == s.epistemic_log.shape == (5, 5)


@pytest.mark.parametrize("method", ["ghost", "functorch"])
def test_binary_one_logit_epistemic_and_log(method):
    m, x = binary(), torch.randn(6, 3)
    s = isouq.score_classifier(m, x, method=method)
    torch.testing.assert_close(s.epistemic, brute(m, x, binary_probs), rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(s.epistemic_log, brute(m, x, lambda o: binary_probs(o).log()),
                               rtol=1e-4, atol=1e-10)
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    t = isouq.score_classifier(m, x, method=method, classes=y)
    torch.testing.assert_close(t.epistemic_log, s.epistemic_log.gather(1, y[:, None])[:, 0])
    assert t.probs.shape == (6, 2)


@pytest.mark.parametrize("method", ["ghost", "functorch"])
@pytest.mark.parametrize("kind", ["predicted", "labels", "numpy"])
def test_selected_classes_equal_all_gathered(method, kind):
    m, x = cnn(C=7), torch.randn(6, 2, 7, 7)
    full = isouq.score_classifier(m, x, method=method)
    if kind == "predicted":
        want = full.probs.argmax(1)
        classes = "predicted"
    else:
        want = torch.tensor([0, 6, 3, 3, 1, 2])
        classes = want if kind == "labels" else want.cpu().numpy().astype(np.int32)
    s = isouq.score_classifier(m, x, method=method, classes=classes, batch_size=4)
    assert torch.equal(s.classes, want)
    assert s.epistemic.shape == s.epistemic_log.shape == s.aleatoric.shape == (6,)
    assert s.probs.shape == (6, 7)
    pick = lambda t: t.gather(1, want[:, None])[:, 0]  # noqa: E731
    torch.testing.assert_close(s.epistemic, pick(full.epistemic), rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(s.epistemic_log, pick(full.epistemic_log), rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(s.aleatoric, pick(full.aleatoric))
    if kind == "predicted":
        p = full.predicted()
        torch.testing.assert_close(p.epistemic, s.epistemic, rtol=1e-5, atol=1e-12)
        assert torch.equal(p.classes, s.classes)


def test_one_backward_per_batch_whatever_the_number_of_classes(monkeypatch):
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 300))
    x = torch.randn(10, 4)
    calls = []
    orig = GhostNorms.backward_detailed

    def counting(self, s, **kw):
        calls.append(s.shape[0])
        return orig(self, s, **kw)

    monkeypatch.setattr(GhostNorms, "backward_detailed", counting)
    isouq.score_classifier(m, x, classes="predicted", batch_size=4)
    assert calls == [4, 4, 2]


def test_log_scores_survive_tiny_probabilities():
    m = nn.Linear(2, 3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[60.0, 0], [0, 0], [-60, 0]]))
        m.bias.zero_()
    x = torch.tensor([[1.5, 0.3]])  # p_2 ≈ e^-180: p_2² underflows float32
    s = isouq.score_classifier(m, x, classes=torch.tensor([2]))
    assert s.epistemic_log[0] > 1 and torch.isfinite(s.epistemic_log).all()
    assert s.epistemic[0] == 0  # p² ‖∇ log p‖² is below float32's range: 0, not NaN


def test_bad_classes_are_clear_errors():
    m, x = cnn(), torch.randn(4, 2, 7, 7)
    for bad, match in (([0, 1, 2], "shape"), (torch.tensor([0, 1, 2, 5]), "outside 0..4"),
                       (torch.tensor([0.0, 1, 2, 3]), "integer"), ("argmax", "predicted"),
                       (torch.tensor([-1, 0, 0, 0]), "outside")):
        with pytest.raises(InputError, match=match):
            isouq.score_classifier(m, x, classes=bad)
    for kw in (dict(check_independent=False), dict(method="functorch")):  # C from the batch
        with pytest.raises(InputError, match="outside 0..4"):
            isouq.score_classifier(m, x[:1], classes=torch.tensor([7]), **kw)


def test_outputs_not_n_by_c_is_a_clear_error():
    m = nn.Sequential(nn.Linear(3, 4), nn.Unflatten(1, (2, 2)))
    with pytest.raises(ModelError, match="shape \\(N,\\) or \\(N, C\\)"):
        isouq.score_classifier(m, torch.randn(3, 3), classes="predicted")


class MixBatch(nn.Module):
    def forward(self, x):
        return x - x.mean(0, keepdim=True)


@pytest.mark.parametrize("layer", [MixBatch(), nn.BatchNorm1d(4, track_running_stats=False)])
def test_a_layer_mixing_examples_is_refused(layer):
    m = nn.Sequential(nn.Linear(3, 4), layer, nn.Linear(4, 3))
    with pytest.raises(ModelError, match="mixes examples"):
        isouq.score_classifier(m, torch.randn(5, 3), classes="predicted")


class CountBatchOfOne(nn.Module):
    """Counts the forwards of a single example (the mixing check's extra forward)."""

    def __init__(self):
        super().__init__()
        self.ones = 0

    def forward(self, x):
        self.ones += x.shape[0] == 1
        return x


def test_the_mixing_check_runs_once_per_model_and_kind_of_input():
    counter = CountBatchOfOne()
    m = nn.Sequential(counter, nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    x = torch.randn(5, 3)
    first = isouq.score_classifier(m, x, classes="predicted")
    seen = counter.ones
    assert seen >= 1  # the check's forward of example 0 alone
    again = isouq.score_classifier(m, x, classes="predicted")
    assert counter.ones == seen  # remembered: no second check
    torch.testing.assert_close(again.epistemic, first.epistemic)
    isouq.score_classifier(m, torch.randn(7, 3), classes="predicted")  # another batch, same kind
    assert counter.ones == seen
    isouq.score_classifier(m.double(), x.double(), classes="predicted")
    assert counter.ones > seen  # another dtype: checked again
    m.float()
    m[2].track_running_stats = False  # now it mixes examples: the changed mode is seen
    m[2].running_mean = m[2].running_var = None
    seen = counter.ones
    with pytest.raises(ModelError, match="mixes examples"):
        isouq.score_classifier(m, x, classes="predicted")
    assert counter.ones > seen
    with pytest.raises(ModelError, match="mixes examples"):  # and refused on every call
        isouq.score_classifier(m, x, classes="predicted")


def test_batch_first_false_attention_with_ghost_names_the_fix():
    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 2)
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            y, _ = self.attn(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
            return self.head(y.mean(0))

    m, x = A(), torch.randn(3, 5, 4)
    with pytest.raises(InputError, match="batch_first=True"):
        isouq.score_classifier(m, x, method="ghost")
    with pytest.warns(UserWarning, match="MultiheadAttention.*per_example"):
        s = isouq.score_classifier(m, x, classes="predicted")
    torch.testing.assert_close(s.epistemic_log, brute(m, x, lambda o: torch.log_softmax(o, 1))
                               .gather(1, s.classes[:, None])[:, 0], rtol=1e-4, atol=1e-10)


def test_auto_warns_once_per_layer_type(monkeypatch):
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w

    monkeypatch.setattr(estimators, "_WARNED_FALLBACK", set())
    m, x = nn.Sequential(nn.Linear(3, 4), Scale(), nn.Linear(4, 2)), torch.randn(4, 3)
    with pytest.warns(UserWarning, match="Scale"):
        isouq.score_classifier(m, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        isouq.score_classifier(m, x)
