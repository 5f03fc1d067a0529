"""Each ghost rule, alone and combined, against brute-force per-example autograd."""

import pytest
import torch
from torch import nn

from brute import brute
from isouq.ghost import factors
from isouq.ghost.engine import GhostNorms

torch.manual_seed(0)


def check(model, inputs, s_of_out, rtol=1e-4):
    """ghost per-parameter norms == brute force, for s = s_of_out(model(inputs)) (N,)."""
    params = dict(model.named_parameters())
    with GhostNorms(model, params) as ghost:
        res = ghost.backward_detailed(s_of_out(model(inputs)))
    ref = brute(model, params, lambda i: s_of_out(model(inputs[i : i + 1]))[0], inputs.shape[0])
    assert res.per_param.shape == ref.shape
    torch.testing.assert_close(res.per_param, ref, rtol=rtol, atol=1e-9)
    return res


class TiedLM(nn.Module):
    """Embedding and output layer share one weight; a block is applied twice (reuse)."""

    def __init__(self, V=11, d=6, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=padding_idx)
        self.block = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = torch.tanh(self.block(h))
        h = torch.tanh(self.block(h)).cumsum(1)  # reuse + mixing across positions
        return self.head(self.norm(h))


def seq_prob(out):
    return torch.softmax(out, -1)[:, :, 3].mean(1)


def test_linear_2d_3d_and_bias():
    m = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    check(m, torch.randn(6, 4), lambda o: o[:, 1])
    check(m, torch.randn(6, 3, 4), lambda o: o[..., 0].pow(2).sum(1))
    check(m, torch.randn(6, 2, 3, 4), lambda o: o.sum((1, 2, 3)))


def test_tied_weights_and_reused_module():
    check(TiedLM(), torch.randint(0, 11, (5, 7)), seq_prob)


def test_single_calls_are_done_inside_backward_shared_ones_after():
    """Solo layers (norm in the backward hook, tensors released) and tied/reused ones
    (deferred to the end, cross terms) give the brute-force norms together."""
    m = TiedLM()
    ids = torch.randint(0, 11, (4, 5))
    params = dict(m.named_parameters())
    seen = {}
    with GhostNorms(m, params) as ghost:
        deferred = ghost._norms

        def at_end_of_backward(*a, **kw):  # what autograd's hooks left for the end
            # a released call holds no inputs (a Linear call never holds its output: no rule
            # reads it)
            seen["released"] = {type(c.module).__name__ for c in ghost.calls if not c.args}
            seen["kept"] = {type(c.module).__name__ for c in ghost.calls if c.args}
            return deferred(*a, **kw)

        ghost._norms = at_end_of_backward
        ghost.backward_detailed(seq_prob(m(ids)))
        after = ghost.calls
    assert seen["released"] == {"LayerNorm"}  # block (reused), emb/head (tied) wait for the end
    assert seen["kept"] == {"Embedding", "Linear"}
    assert after == []  # and nothing is held once the backward is over (no growth per batch)
    check(m, ids, seq_prob)


def test_embedding_padding_idx_matches_autograd():
    ids = torch.randint(0, 11, (5, 7))
    ids[:, :2] = 0  # padding_idx rows get no gradient in autograd
    res = check(TiedLM(padding_idx=0), ids, seq_prob)
    assert (res.per_param > 0).all()


@pytest.mark.parametrize("force", ["gram", "materialize"])
def test_cost_rule_both_branches_agree(force, monkeypatch):
    monkeypatch.setattr(factors, "choose_gram", lambda pairs: force == "gram")
    check(TiedLM(), torch.randint(0, 11, (4, 6)), seq_prob)
    m = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    check(m, torch.randn(6, 3, 4), lambda o: o[..., 0].sum(1))


def test_cost_rule_depends_on_T():
    a, b = 64, 64
    short = [factors.Pair(torch.randn(2, 4, a), torch.randn(2, 4, b))]
    long = [factors.Pair(torch.randn(2, 512, a), torch.randn(2, 512, b))]
    assert factors.choose_gram(short) and not factors.choose_gram(long)


def test_norm_layers_torch_and_hf():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for norm in (nn.LayerNorm(6), nn.RMSNorm(6), LlamaRMSNorm(6), Gemma3RMSNorm(6)):
        with torch.no_grad():
            for p in norm.parameters():
                p.add_(0.3 * torch.randn_like(p))
        m = nn.Sequential(nn.Linear(3, 6), norm, nn.Tanh(), nn.Linear(6, 1))
        check(m, torch.randn(5, 4, 3), lambda o: o[..., 0].sum(1))


class OddRMSNorm(nn.Module):
    """Named like an RMS norm, but y = w · x / mean|x|: no fused formula fits it."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(d))
        self.eps = 1e-6

    def forward(self, x):
        return self.weight * x / (x.abs().mean(-1, keepdim=True) + self.eps)


class T5LikeLayerNorm(OddRMSNorm):
    """Named LayerNorm, computes an RMS norm (as T5LayerNorm does)."""

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_norm_fast_path_is_taken_only_where_it_matches_the_module():
    """The fused x̂ is used for a module only after it gave f(w + 1) − f(w) on its first call,
    and gᵢ = Σₜ bₜ ⊙ yₜ / w only after y / w gave that x̂ back; a module whose formula is
    neither RMS nor LayerNorm keeps the general path, exactly (Gemma's (1 + w) ⊙ x̂ takes the
    fused x̂ but not the output ratio)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from isouq.ghost import norms

    cases = [(nn.LayerNorm(6), "layer", False), (nn.RMSNorm(6), "rms", True),
             (LlamaRMSNorm(6), "rms", True), (Gemma3RMSNorm(6), "rms", False),
             (T5LikeLayerNorm(6), "rms", True), (OddRMSNorm(6), None, False)]
    for norm, kind, scales in cases:
        with torch.no_grad():
            for p in norm.parameters():
                p.add_(0.3 * torch.randn_like(p))
        m = nn.Sequential(nn.Linear(3, 6), norm, nn.Tanh(), nn.Linear(6, 1))
        for _ in range(2):  # the first call compares the paths, the second uses the verdicts
            check(m, torch.randn(5, 4, 3), lambda o: o[..., 0].sum(1))
        assert norms._memo(norm, norms._FAST_CHECKED) == {torch.float32: kind}, type(norm).__name__
        assert norms._memo(norm, norms._SCALES_OUTPUT) == {torch.float32: scales}, type(norm).__name__


def test_norm_output_ratio_steps_aside_for_a_zero_weight():
    """A weight entry of 0 (y / w undefined) sends the call back to the fused x̂, exactly."""
    from isouq.ghost import norms

    norm = nn.RMSNorm(6)
    m = nn.Sequential(nn.Linear(3, 6), norm, nn.Tanh(), nn.Linear(6, 1))
    check(m, torch.randn(5, 4, 3), lambda o: o[..., 0].sum(1))
    assert norms._memo(norm, norms._SCALES_OUTPUT) == {torch.float32: True}
    with torch.no_grad():
        norm.weight[2] = 0.0
    check(m, torch.randn(5, 4, 3), lambda o: o[..., 0].sum(1))


def test_gpt2_conv1d():
    from transformers.pytorch_utils import Conv1D

    m = nn.Sequential(Conv1D(5, 3), nn.Tanh(), Conv1D(2, 5))
    check(m, torch.randn(4, 6, 3), lambda o: o[..., 1].sum(1))


class Scale(nn.Module):
    """A module type without a ghost rule: y = x·w + b·x² (per-feature)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.b = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.w + self.b * x**2


def test_fallback_is_exact_and_warns():
    m = nn.Sequential(nn.Linear(3, 4), Scale(4), nn.Tanh(), nn.Linear(4, 1))
    with pytest.warns(UserWarning, match="no rule for module type.*Scale"):
        check(m, torch.randn(9, 2, 3), lambda o: o[..., 0].sum(1))


def test_only_selected_params_and_flags_restored():
    m = TiedLM()
    m.block.bias.requires_grad_(False)
    params = {"block.weight": m.block.weight}
    ids = torch.randint(0, 11, (3, 5))
    with GhostNorms(m, params) as ghost:
        assert not any(p.requires_grad for p in m.parameters())
        res = ghost.backward_detailed(seq_prob(m(ids)))
    assert [p.requires_grad for p in m.parameters()].count(False) == 1
    ref = brute(m, params, lambda i: seq_prob(m(ids[i : i + 1]))[0], 3)
    torch.testing.assert_close(res.per_param, ref, rtol=1e-4, atol=1e-9)


def test_broadcast_input_gives_clear_error():
    class Pos(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(8, 4)
            self.out = nn.Linear(4, 1)

        def forward(self, x):
            return self.out(x + self.pos(torch.arange(x.shape[1])[None]))

    m = Pos()
    with GhostNorms(m, dict(m.named_parameters())) as ghost:
        with pytest.raises(ValueError, match="broadcast"):
            ghost.backward(m(torch.randn(3, 5, 4))[..., 0].sum(1))


class FlatFFN(nn.Module):
    """A block that flattens (N, T, d) to (N·T, d) for its feed-forward part, as OPT does."""

    def __init__(self, d=4):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x)).cumsum(1)  # mixing across positions, per example
        shape = h.shape
        flat = self.fc(self.norm(h.reshape(-1, shape[-1])))
        return flat.reshape(shape[0], shape[1], -1)


def test_layers_fed_the_flattened_batch_are_read_per_example_with_seq_len():
    m = FlatFFN()
    x = torch.randn(3, 5, 4)
    params = dict(m.named_parameters())
    s_of = lambda out: out[..., 0].pow(2).mean(1)  # noqa: E731
    with GhostNorms(m, params, seq_len=5) as ghost:
        res = ghost.backward_detailed(s_of(m(x)))
    ref = brute(m, params, lambda i: s_of(m(x[i : i + 1]))[0], 3)
    torch.testing.assert_close(res.per_param, ref, rtol=1e-4, atol=1e-9)
    with GhostNorms(m, params) as ghost:  # without it: refused, never summed across examples
        with pytest.raises(ValueError, match="needs seq_len=T"):
            ghost.backward(s_of(m(x)))


def _f64_truth_norm_weight(x, c, kind, eps):
    x64 = x.double()
    if kind == "layer":
        xh = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(
            x64.var(-1, unbiased=False, keepdim=True) + eps)
    else:
        xh = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return (xh * c.double()).sum(1).pow(2).sum(1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_terms_are_exact_in_float32(dtype):
    """bf16/fp16 layers: ∂y/∂w of a norm layer and the Gram/bias sums are formed in float32, so
    the per-example norms equal a float64 computation from the same half-precision inputs
    (a difference of two rounded half-precision outputs kept ~2-3 digits)."""
    torch.manual_seed(0)
    d, T, N = 96, 24, 3
    x = torch.randn(N, T, d).to(dtype)
    c = torch.randn(N, T, d).to(dtype)
    for kind, mod in (("layer", nn.LayerNorm(d)), ("rms", nn.RMSNorm(d))):
        with torch.no_grad():
            mod.weight.copy_(1 + 3 * torch.randn(d))
        mod = mod.to(dtype)
        with GhostNorms(mod, {"weight": mod.weight}) as ghost:
            s = (mod(x).float() * c.float()).sum((1, 2))
            got = ghost.backward(s)
        eps = mod.eps if mod.eps is not None else torch.finfo(dtype).eps
        truth = _f64_truth_norm_weight(x, c, kind, eps)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), truth, rtol=1e-5, atol=0)
    lin = nn.Linear(d, 2 * d).to(dtype)
    with GhostNorms(lin, dict(lin.named_parameters())) as ghost:
        out = lin(x)
        # the same draw on any default device (ISOUQ_TEST_DEVICE): a CPU generator, then moved
        c = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), device="cpu")
        c = c.to(out.device).to(dtype)
        res = ghost.backward_detailed((out.float() * c.float()).sum((1, 2)))
    b = c.double()
    w_truth = torch.einsum("nto,nti->noi", b, x.double()).pow(2).sum((1, 2))
    b_truth = b.sum(1).pow(2).sum(1)
    torch.testing.assert_close(res.per_param.double(), torch.stack([w_truth, b_truth], 1),
                               rtol=1e-5, atol=0)


def test_the_registry_imports_no_rule_and_the_rules_load_with_the_package():
    """No import cycle: the rule files import the registry, the registry imports none of
    them (the package imports them); importing the registry alone finds every rule."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import isouq.ghost as ghost

    reg = Path(ghost.__file__).with_name("registry.py")
    imported = set()
    for node in ast.walk(ast.parse(reg.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            imported.update(a.name for a in node.names)
            imported.add(node.module or "")
    rules = {"attention", "channel_norms", "conv", "conv1d", "embedding", "linear", "norms",
             "quantized", "fallback", "engine"}
    assert not (imported & rules), imported & rules
    code = ("import torch.nn as nn; from isouq.ghost.registry import rule_for; "
            "print(all(rule_for(m) is not None for m in (nn.Linear(2, 2), nn.LayerNorm(2), "
            "nn.Embedding(3, 2), nn.Conv2d(1, 1, 1))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
