"""Conv, BatchNorm/GroupNorm/InstanceNorm, LayerNorm over any shape and MultiheadAttention rules,
and the rule registry: against a brute-force per-example autograd loop, and against Opacus."""

import copy
import warnings

import pytest
import torch
from torch import nn

from brute import brute
from isouq.errors import ModelError
from isouq.ghost import Call, Materialized, factors, register_rule, registry, rule_for
from isouq.ghost.engine import GhostNorms


def check(model, x, s_of_out=None, rtol=1e-4, **fwd):
    """ghost per-parameter norms == brute force for s = s_of_out(model(x)) (N,)."""
    s_of_out = s_of_out or (lambda o: o.reshape(o.shape[0], -1).pow(2).sum(1).sqrt())
    params = dict(model.named_parameters())
    with GhostNorms(model, params) as ghost:
        res = ghost.backward_detailed(s_of_out(model(x, **fwd)))
    def one(i):  # per-example keyword tensors (masks) sliced like the input
        kw = {k: v[i : i + 1] if isinstance(v, torch.Tensor) else v for k, v in fwd.items()}
        return s_of_out(model(x[i : i + 1], **kw))[0]

    ref = brute(model, params, one, x.shape[0])
    assert res.per_param.shape == ref.shape
    assert (ref > 0).all(), "every parameter must matter, else the test proves less"
    torch.testing.assert_close(res.per_param, ref, rtol=rtol, atol=1e-8)
    return res


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model


@pytest.fixture(params=["gram", "materialize", "materialize_by_conv", "materialize_by_conv_chunks",
                        "materialize_per_example"])
def force(request, monkeypatch):
    """Each branch of the cost rule; convolutions materialize by bmm, by a grouped conv over the
    batch or over chunks of 2 examples (3 = 2 + 1), or by one weight-gradient convolution per
    example."""
    from isouq.ghost import conv

    monkeypatch.setattr(factors, "choose_gram", lambda pairs, **kw: request.param == "gram")
    if request.param.startswith("materialize_by_conv"):
        monkeypatch.setattr(conv, "UNFOLD_MAX_PATCH", 0)
    if request.param == "materialize_by_conv_chunks":

        def two_per_chunk(module, grad, x, pad, *, chunk):
            return original(module, grad, x, pad, chunk=min(2, grad.shape[0]))

        original = conv._weight_grads
        monkeypatch.setattr(conv, "_weight_grads", two_per_chunk)
    if request.param == "materialize_per_example":
        monkeypatch.setattr(conv, "UNFOLD_MAX_BYTES", 0)
    return request.param


CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CASES = [  # (dim, kwargs, in_channels, out_channels)
    (1, dict(kernel_size=3), 2, 4),
    (1, dict(kernel_size=4, stride=2, padding=1, dilation=2, bias=False), 4, 6),
    (1, dict(kernel_size=4, padding="same", padding_mode="reflect"), 3, 3),
    (2, dict(kernel_size=3, stride=2, padding=1), 3, 5),
    (2, dict(kernel_size=(2, 3), padding="same", dilation=(2, 1)), 4, 4),
    (2, dict(kernel_size=3, groups=2, padding=(0, 2), stride=(1, 2), bias=False), 4, 6),
    (2, dict(kernel_size=3, groups=4, padding=1, padding_mode="circular"), 4, 8),  # depthwise ×2
    (2, dict(kernel_size=1, padding="valid"), 3, 2),
    (3, dict(kernel_size=2, stride=(1, 2, 1), padding=1), 2, 3),
    (3, dict(kernel_size=3, groups=3, padding="same", dilation=2, bias=False), 3, 3),
]


@pytest.mark.parametrize("dim,kw,cin,cout", CASES)
@pytest.mark.parametrize("n", [1, 3])
def test_conv_rules(dim, kw, cin, cout, n, force):
    conv = CONV[dim](cin, cout, **kw)
    m = nn.Sequential(conv, nn.Tanh(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(n, cin, *[(7, 5, 6)[i] for i in range(dim)])  # odd spatial sizes
    m(x)  # materialize the lazy layer
    check(m, x, lambda o: o[:, 1] * o[:, 0])


def test_rule_registry_covers_the_layers():
    for mod in (nn.Conv1d(2, 2, 1), nn.Conv2d(2, 2, 1), nn.Conv3d(2, 2, 1), nn.BatchNorm2d(2),
                nn.GroupNorm(1, 2), nn.InstanceNorm2d(2, affine=True), nn.LayerNorm((2, 3)),
                nn.MultiheadAttention(4, 2, batch_first=True), nn.Linear(2, 2), nn.Embedding(3, 2)):
        assert rule_for(mod) is not None, type(mod).__name__
    assert rule_for(nn.MultiheadAttention(4, 2)) is None  # batch_first=False: fallback


class Block(nn.Module):
    """A residual block; ``norm`` builds the normalization layers."""

    def __init__(self, c, norm, stride=1):
        super().__init__()
        self.c1 = nn.Conv2d(c, 2 * c, 3, stride=stride, padding=1, bias=False)
        self.n1 = norm(2 * c)
        self.c2 = nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False)
        self.n2 = norm(2 * c)
        self.skip = nn.Conv2d(c, 2 * c, 1, stride=stride, bias=False)

    def forward(self, x):
        h = torch.relu(self.n1(self.c1(x)))
        return torch.relu(self.n2(self.c2(h)) + self.skip(x))


NORMS = {
    "batchnorm": nn.BatchNorm2d,
    "groupnorm": lambda c: nn.GroupNorm(2, c),
    "instancenorm": lambda c: nn.InstanceNorm2d(c, affine=True),
    "instancenorm_running": lambda c: nn.InstanceNorm2d(c, affine=True, track_running_stats=True),
}


@pytest.mark.parametrize("norm", list(NORMS))
def test_residual_nets_with_norms(norm, force):
    m = perturb(nn.Sequential(Block(3, NORMS[norm], stride=2), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(6, 4))).eval()
    if norm == "instancenorm_running":
        for mod in m.modules():
            if isinstance(mod, nn.InstanceNorm2d):
                mod.running_mean.normal_(0, 0.3)
                mod.running_var.uniform_(0.5, 2.0)
    check(m, torch.randn(3, 3, 9, 7), lambda o: torch.softmax(o, 1)[:, 2])


@pytest.mark.parametrize("norm", ["batchnorm", "instancenorm", "instancenorm_running"])
def test_channel_norm_sums_formed_directly_where_no_fused_kernel_serves(norm, monkeypatch):
    """The path other devices than the CPU take (normalize, multiply, reduce) is exact too."""
    from isouq.ghost import channel_norms

    monkeypatch.setattr(channel_norms, "FUSED_DEVICES", ())
    m = perturb(nn.Sequential(Block(3, NORMS[norm], stride=2), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(6, 4))).eval()
    for mod in m.modules():
        if getattr(mod, "running_mean", None) is not None:
            mod.running_mean.normal_(0, 0.3)
            mod.running_var.uniform_(0.5, 2.0)
    check(m, torch.randn(3, 3, 9, 7).to(memory_format=torch.channels_last),
          lambda o: torch.softmax(o, 1)[:, 2])


def test_channels_last_inputs_and_batch_norm_1d_3d(force):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, groups=2),
                      nn.Flatten(), nn.LazyLinear(6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    x = torch.randn(4, 3, 8, 9).to(memory_format=torch.channels_last)
    m(x)
    m = perturb(m).eval().to(memory_format=torch.channels_last)
    check(m, x, lambda o: o[:, 0])
    m3 = nn.Sequential(nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), nn.Flatten(), nn.LazyLinear(1))
    x3 = torch.randn(2, 2, 3, 4, 5)
    m3(x3)
    check(perturb(m3).eval(), x3, lambda o: o[:, 0])


class Twice(nn.Module):
    """One conv and one norm applied twice (shared weights: cross terms between calls)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.norm = nn.GroupNorm(3, 3)
        self.ln = nn.LayerNorm((3, 6, 5))
        self.head = nn.Linear(90, 2)

    def forward(self, x):
        h = torch.tanh(self.norm(self.conv(x)))
        h = self.ln(self.norm(self.conv(h)) + x)
        return self.head(h.flatten(1))


def test_module_called_twice_and_layernorm_over_chw(force):
    check(perturb(Twice()), torch.randn(3, 3, 6, 5), lambda o: o[:, 0] - o[:, 1] ** 2)


def test_layernorm_over_two_trailing_dims_of_tokens():
    m = perturb(nn.Sequential(nn.Linear(4, 6), nn.Unflatten(-1, (2, 3)), nn.LayerNorm((2, 3)),
                              nn.Flatten(-2), nn.Tanh(), nn.Linear(6, 1)))
    check(m, torch.randn(3, 5, 4), lambda o: o[..., 0].sum(1))


class Attn(nn.Module):
    def __init__(self, E=6, H=2, kdim=None, bias=True, zero=False, cross=False):
        super().__init__()
        self.cross = cross
        self.attn = nn.MultiheadAttention(E, H, batch_first=True, kdim=kdim, vdim=kdim, bias=bias,
                                          add_zero_attn=zero)
        self.kv = nn.Linear(E, kdim or E) if cross else None
        self.head = nn.Linear(E, 2)

    def forward(self, x, mask=None, causal=False):
        if self.cross:
            kv = self.kv(x[:, 1:])
            y, _ = self.attn(x, kv, kv, key_padding_mask=mask)
        else:
            cm = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if causal else None
            y, _ = self.attn(x, x, x, key_padding_mask=mask, attn_mask=cm, is_causal=causal,
                             need_weights=not causal)
        return self.head(torch.tanh(y)).mean(1)


@pytest.mark.parametrize("kw", [dict(), dict(bias=False), dict(zero=True), dict(kdim=4, cross=True),
                                dict(cross=True)])
def test_multihead_attention(kw, force):
    m = perturb(Attn(**kw)).eval()
    x = torch.randn(3, 5, 6)
    check(m, x, lambda o: o[:, 0])
    mask = torch.zeros(3, 4 if kw.get("cross") else 5, dtype=torch.bool)
    mask[0, -2:] = True
    check(m, x, lambda o: o[:, 1], mask=mask)


def test_multihead_attention_causal_and_transformer_layer():
    m = perturb(Attn()).eval()
    check(m, torch.randn(2, 5, 6), lambda o: o[:, 0], causal=True)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    net = perturb(nn.Sequential(layer, nn.Flatten(), nn.Linear(32, 1))).eval()
    check(net, torch.randn(3, 4, 8), lambda o: o[:, 0])


def test_batch_norm_mixing_examples_is_refused():
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(4, 2, 5, 5)
    m(x)
    for model, what in ((m.train(), "training mode"),
                        (nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, track_running_stats=False)
                                       ).eval(), "track_running_stats=False")):
        xx = x if model is m else torch.randn(4, 3)
        with GhostNorms(model, dict(model.named_parameters())) as ghost:
            with pytest.raises(ModelError, match=f"{what}.*eval"):
                ghost.backward(model(xx)[:, 0])


class Scale(nn.Module):
    """A layer type of the user's own: y = x·w (per feature)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.w


def test_user_registered_rule_is_used_and_exact():
    calls = []

    @register_rule(Scale)
    def scale_rule(module, call: Call):
        calls.append(1)
        x, b = call.args[0], call.grad
        return {"w": Materialized((x * b).reshape(x.shape[0], -1, x.shape[-1]).sum(1))}

    try:
        m = nn.Sequential(nn.Linear(3, 4), Scale(4), nn.Tanh(), nn.Linear(4, 1))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback warning
            check(m, torch.randn(5, 2, 3), lambda o: o[..., 0].sum(1))
        assert calls
    finally:
        registry._BY_TYPE.pop(Scale)


def test_subclass_overriding_forward_gets_the_fallback():
    class Doubled(nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    class Plain(nn.Conv2d):
        pass

    assert rule_for(Doubled(2, 2, 1)) is None and rule_for(Plain(2, 2, 1)) is not None
    m = nn.Sequential(Doubled(2, 3, 3), nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(3, 2, 5, 5)
    m(x)
    with pytest.warns(UserWarning, match="no rule for module type.*Doubled"):
        check(m, x, lambda o: o[:, 0])


# ---------------------------------------------------------------- against Opacus
def _opacus_norms(model, x, s_of_out):
    opacus = pytest.importorskip("opacus")
    gsm = opacus.GradSampleModule(model, loss_reduction="sum")
    gsm.zero_grad()
    s_of_out(gsm(x)).sum().backward()
    out = torch.stack([p.grad_sample.reshape(x.shape[0], -1).pow(2).sum(1)
                       for p in model.parameters()], 1)
    gsm._close()
    return out


OPACUS_LAYERS = {
    "linear": lambda: nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)),
    "conv1d": lambda: nn.Sequential(nn.Conv1d(5, 4, 3, stride=2, padding=1), nn.Flatten(),
                                    nn.Linear(12, 3)),
    "conv2d": lambda: nn.Sequential(nn.Conv2d(5, 4, 3, groups=1, dilation=2), nn.Flatten(),
                                    nn.Linear(4 * 3 * 3, 3)),
    "conv3d": lambda: nn.Sequential(nn.Conv3d(5, 2, 2), nn.Flatten(), nn.Linear(2 * 2 * 2 * 2, 3)),
    "groupnorm": lambda: nn.Sequential(nn.Conv2d(5, 4, 1), nn.GroupNorm(2, 4), nn.Flatten(),
                                       nn.Linear(4 * 7 * 7, 3)),
    "instancenorm": lambda: nn.Sequential(nn.Conv1d(5, 4, 1), nn.InstanceNorm1d(4, affine=True),
                                          nn.Flatten(), nn.Linear(4 * 6, 3)),
    "layernorm": lambda: nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)),
    "embedding": lambda: nn.Sequential(nn.Embedding(9, 4), nn.Flatten(), nn.Linear(12, 3)),
}
OPACUS_INPUTS = {"linear": (4, 5), "conv1d": (4, 5, 6), "conv2d": (4, 5, 7, 7),
                 "conv3d": (4, 5, 3, 3, 3), "groupnorm": (4, 5, 7, 7), "instancenorm": (4, 5, 6),
                 "layernorm": (4, 5), "embedding": None}


@pytest.mark.parametrize("layer", list(OPACUS_LAYERS))
def test_against_opacus(layer):
    pytest.importorskip("opacus")
    torch.manual_seed(1)
    m = perturb(OPACUS_LAYERS[layer]())
    shape = OPACUS_INPUTS[layer]
    x = torch.randint(0, 9, (4, 3)) if shape is None else torch.randn(*shape)

    def s_of_out(o):
        return torch.softmax(o, 1)[:, 1]

    params = dict(m.named_parameters())
    with GhostNorms(m, params) as ghost:
        ours = ghost.backward_detailed(s_of_out(m(x))).per_param
    ref = _opacus_norms(m, x, s_of_out)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-9)


def test_bfloat16_models_match_their_float64_copy():
    """Half-precision conv/norm/attention layers: every ghost term is taken in float32, so the
    norms stay as close to the float64 model's as the bf16 activation gradients allow."""
    torch.manual_seed(3)
    m = perturb(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                              nn.Conv2d(4, 4, 3, groups=2), nn.GroupNorm(2, 4), nn.Flatten(2),
                              nn.Linear(25, 6))).eval()
    x = torch.randn(3, 2, 7, 7)
    s_of = lambda o: o[:, :, 0].sum(1)  # noqa: E731
    lo = copy.deepcopy(m).to(torch.bfloat16)
    ref_m = copy.deepcopy(lo).double()  # the same (bf16-rounded) weights in float64
    out = {}
    for name, model, xx in (("bf16", lo, x.to(torch.bfloat16)), ("f64", ref_m, x.double())):
        with GhostNorms(model, dict(model.named_parameters())) as ghost:
            out[name] = ghost.backward_detailed(s_of(model(xx))).per_param
    assert out["bf16"].dtype in (torch.float32, torch.bfloat16)
    torch.testing.assert_close(out["bf16"].double(), out["f64"], rtol=0.1, atol=1e-3)
