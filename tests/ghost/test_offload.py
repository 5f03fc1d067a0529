"""Models larger than one device, accelerate's way: weights kept on ``meta`` between forwards
(offloaded to CPU memory or to disk) score exactly as the same model held in memory.

accelerate's ``AlignDevicesHook`` loads a layer's weights just before its forward and puts
``meta`` back just after, so every ghost rule that reads a weight (the norm rules' f(w + 1) −
f(w) and fused paths, the fallback, nn.MultiheadAttention, ‖θ*‖²) reads it from the hook's
``weights_map`` instead (ghost/weights.py).
"""

import copy

import pytest
import torch
from torch import nn

import tiny
from isouq import score_sequences
from isouq.ghost.engine import GhostNorms

accelerate = pytest.importorskip("accelerate")

PROMPTS = ["what is the capital of france", "who wrote hamlet", "the cat sat on",
           "is the moon made of cheese"]
ANSWERS = ["paris", "shakespeare yes", "the mat", "no rock"]


def _offload(model, how, tmp_path):
    """``model`` with its weights offloaded ``how``; returns the model and how many weights
    are on meta."""
    if how == "cpu":
        m = accelerate.cpu_offload(model, execution_device="cpu")
    elif how == "disk":
        m = accelerate.disk_offload(model, str(tmp_path / "off"), execution_device="cpu")
    else:  # a device map as device_map="auto" makes it: first layer and head on disk
        inner = model.model
        dmap = {f"model.{n}": "cpu" for n, _ in inner.named_children() if n != "layers"}
        dmap |= {f"model.layers.{i}": "disk" if i == 0 else "cpu"
                 for i in range(len(inner.layers))}
        dmap["lm_head"] = "disk"
        dmap["model.norm"] = "disk"
        m = accelerate.dispatch_model(model, device_map=dmap, offload_dir=str(tmp_path / "off"),
                                      main_device="cpu")
    return m, sum(p.device.type == "meta" for p in m.parameters())


@pytest.mark.parametrize("family", ["llama", "llama-tied", "gpt2", "gemma3"])
@pytest.mark.parametrize("how", ["cpu", "disk", "map"])
def test_offloaded_model_scores_as_in_memory(family, how, tmp_path):
    if how == "map" and family == "gpt2":
        pytest.skip("the device map names Llama-style modules")
    from isouq.models.info import has_tied_embeddings

    model = tiny.causal_lm(family)
    tied = has_tied_embeddings(model)
    ref = score_sequences(copy.deepcopy(model), tiny.tokenizer(), PROMPTS, ANSWERS,
                          params="all", per_param=True, batch_size=3)
    off, n_meta = _offload(model, how, tmp_path)
    assert n_meta > 0
    assert has_tied_embeddings(off) == tied  # the model's provenance says so after offloading
    got = score_sequences(off, tiny.tokenizer(), PROMPTS, ANSWERS, params="all",
                          per_param=True, batch_size=3)
    assert got.params.names == ref.params.names  # a tie split by offloading is one weight
    assert got.params.n_params == ref.params.n_params
    torch.testing.assert_close(got.per_param, ref.per_param, rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(got.epistemic, ref.epistemic, rtol=1e-5, atol=1e-12)
    assert got.params.sq_norm == pytest.approx(ref.params.sq_norm, rel=1e-6)  # ‖θ*‖² read too
    # the weights' flags are back on the parameters accelerate put in place
    assert all(p.requires_grad for p in off.parameters())


def test_offloaded_loop_is_refused(tmp_path):
    from isouq.errors import InputError

    off, _ = _offload(tiny.causal_lm("llama"), "cpu", tmp_path)
    with pytest.raises(InputError, match="method='ghost'"):
        score_sequences(off, tiny.tokenizer(), PROMPTS[:1], ANSWERS[:1], method="loop")


class Custom(nn.Module):
    """y = x ⊙ w + b: no rule (the fallback re-runs it with its weights)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.b = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.w + self.b


class Net(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.ln = nn.LayerNorm(d)
        self.rms = nn.RMSNorm(d, eps=1e-6)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.custom = Custom(d)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(d, 1)
        with torch.no_grad():
            for m in (self.ln, self.rms):
                m.weight.add_(0.3 * torch.randn(d))
            self.ln.bias.add_(0.3 * torch.randn(d))
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        h = self.rms(self.ln(torch.tanh(self.inp(x))))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = self.bn(self.custom(h))
        return self.out(torch.tanh(h)).sum((1, 2))


@pytest.mark.parametrize("how", ["cpu", "disk"])
def test_every_weight_reading_rule_on_offloaded_layers(how, tmp_path):
    """Norms (general and fast paths), the fallback, nn.MultiheadAttention and BatchNorm's
    running statistics (offloaded buffers too) on an offloaded model: as in memory."""
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 4, 3)
    for _ in range(2):  # the second batch takes the fast paths found on the first
        params = dict(net.named_parameters())
        with pytest.warns(UserWarning, match="no rule"), GhostNorms(net, params) as ghost:
            ref = ghost.backward_detailed(net(x))
        off = copy.deepcopy(net)
        # nn.MultiheadAttention reads out_proj.weight without calling out_proj: accelerate
        # loads all its weights in its own hook (place_submodules), as it documents
        kw = dict(execution_device="cpu", offload_buffers=True,
                  preload_module_classes=["MultiheadAttention"])
        if how == "cpu":
            off = accelerate.cpu_offload(off, **kw)
        else:
            off = accelerate.disk_offload(off, str(tmp_path / "o"), **kw)
        assert off.ln.weight.device.type == "meta" and off.bn.running_mean.device.type == "meta"
        with pytest.warns(UserWarning, match="no rule"), \
                GhostNorms(off, dict(off.named_parameters())) as ghost:
            got = ghost.backward_detailed(off(x))
            got2 = ghost.backward_detailed(off(x))  # again: fast paths chosen on the first call
        torch.testing.assert_close(got.per_param, ref.per_param, rtol=1e-5, atol=1e-12)
        torch.testing.assert_close(got2.per_param, ref.per_param, rtol=1e-5, atol=1e-12)
        x = torch.randn(3, 4, 3)
