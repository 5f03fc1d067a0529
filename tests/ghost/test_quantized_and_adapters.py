"""The models people score: bitsandbytes 4-bit layers and PEFT LoRA adapters.

Exactness against an independent computation: a full-precision twin holding the dequantized
weights (or the merged adapter), differentiated by one autograd backward per answer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import isouq
import tiny
from isouq.errors import InputError, ModelError
from isouq.quantized import dequantized, is_quantized
from test_blocks import ANSWERS as BLOCK_ANSWERS
from test_blocks import PROMPTS as BLOCK_PROMPTS
from test_blocks import check_against_brute

PROMPTS = ["Question: who sat?\nAnswer:", "Q: what is it\nA:", "Say a word:"]
ANSWERS = [" a cat sat", " the dog", " hello there you"]


def _rel(a, b):
    return ((a - b).abs() / b.abs()).max().item()


def _device() -> torch.device:
    """Where the tests' models live: the CPU, or the GPU under ISOUQ_TEST_DEVICE=cuda
    (scripts/gpu_check.sh), where bitsandbytes quantizes a layer when it is moved there."""
    return torch.get_default_device()


def _llama(hidden: int = 16):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=tiny.VOCAB,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return tf.LlamaForCausalLM(cfg).eval()


def _quantize(model, quant_type="nf4", double=False, compute_dtype=torch.float32):
    bnb = pytest.importorskip("bitsandbytes")
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, nn.Linear) and name != "lm_head":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, quant_type=quant_type,
                                      compress_statistics=double, compute_dtype=compute_dtype)
                q.weight = bnb.nn.Params4bit(child.weight.data.clone(), requires_grad=False,
                                             quant_type=quant_type, compress_statistics=double)
                setattr(mod, name, q.to(_device()))
    return model


class _CastLinear(nn.Linear):
    """The twin of a 4-bit layer computing in ``dtype``: y = (x in dtype) Wᵀ, back in x's."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype):
        super().__init__(w.shape[1], w.shape[0], bias=False)
        self.weight = nn.Parameter(w.clone())
        self.cdt = dtype

    def forward(self, x):
        return nn.functional.linear(x.to(self.cdt), self.weight.to(self.cdt)).to(x.dtype)


def _twin(model, compute_dtype=torch.float32):
    """A copy with every 4-bit layer replaced by a float layer of its dequantized weight."""
    import bitsandbytes as bnb

    t = copy.deepcopy(model)
    for mod in list(t.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                w = dequantized(child.weight)
                if compute_dtype == torch.float32:
                    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
                    lin.weight = nn.Parameter(w)
                else:
                    lin = _CastLinear(w, compute_dtype)
                setattr(mod, name, lin)
    return t


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("double", [False, True])
def test_4bit_ghost_equals_the_dequantized_twins_loop(quant_type, double):
    """params='all' on a 4-bit model: every weight as its dequantized values, ≤ 1e-5 of one
    autograd backward per answer through a float32 twin holding those values."""
    tok = tiny.tokenizer()
    m = _quantize(_llama(), quant_type, double)
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost")
    ref = isouq.score_sequences(_twin(m), tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(g.epistemic, ref.epistemic) < 1e-5
    assert g.params.n_params == ref.params.n_params == g.params.n_model  # dequantized counts
    assert g.params.set == "all" and g.params.share == 1.0
    assert g.params.sq_norm == pytest.approx(ref.params.sq_norm, rel=1e-6)


def test_4bit_in_bfloat16_compute_matches_its_twin():
    """A bfloat16 compute dtype: the rule multiplies the input as the layer does (cast to
    bfloat16); within 1% of the twin's loop, whose own weight gradients are bfloat16-free but
    whose forward rounds differently (the half-precision tolerance of test_sequences)."""
    tok = tiny.tokenizer()
    m = _quantize(_llama(), compute_dtype=torch.bfloat16)
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost")
    ref = isouq.score_sequences(_twin(m, torch.bfloat16), tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(g.epistemic, ref.epistemic) < 1e-2


def test_trainable_set_of_a_4bit_model_is_what_a_plain_backward_differentiates():
    """The paper's 4-bit setting: embeddings, norms and head. Ghost and loop agree, also after
    a no-grad call that makes bitsandbytes repack its CPU weights for a kernel without
    autograd (dims of 64: packable), and the loop refuses the quantized weights."""
    tok = tiny.tokenizer()
    m = _quantize(_llama(hidden=64))
    with torch.no_grad():
        m(input_ids=torch.tensor([[4, 5, 6]]))
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost", params="trainable")
    lo = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop", params="trainable")
    assert _rel(g.epistemic, lo.epistemic) < 1e-5
    assert g.params.set == "trainable" and g.params.share < 0.5
    assert not any(is_quantized(p) for n, p in m.named_parameters() if n in g.params.names)
    with pytest.raises(InputError, match="params='trainable'"):
        isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop")
    full = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost")
    ref = isouq.score_sequences(_twin(m), tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(full.epistemic, ref.epistemic) < 1e-5


# bitsandbytes' int8_mm_dequant multiplies the int32 products by a constant written in its
# source: 6.200124e-05 on the CPU (backends/default/ops.py), not 1/127² = 6.2000124e-05, and
# 6.200012e-05 on CUDA (MM_DEQUANT_CONST, csrc): the layer's int8 part is scaled by c · 127²
INT8_DEQUANT_CONST = {"cpu": 6.200124e-05, "cuda": 6.200012e-05}


def _int8_kernel_scale(device: torch.device) -> float:
    return INT8_DEQUANT_CONST[device.type] * 127 ** 2


class _Int8Twin(nn.Module):
    """What bitsandbytes' ``Linear8bitLt`` computes in eval mode (LLM.int8()), written in plain
    torch from its description, with a float weight W (the dequantized one): each input row in
    float16, entries at or above the threshold set aside, rounded to int8 by its absmax; the
    columns in ``outliers`` (fixed: the ones the batch had) kept as they are. The input's
    gradient passes straight through the rounding, as in bitsandbytes' backward."""

    def __init__(self, w, bias, threshold: float, outliers=None, train: bool = False):
        super().__init__()
        self.weight = nn.Parameter(w.clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone().float())
        self.threshold, self.outliers, self.train_path = threshold, outliers, train

    def forward(self, x):
        if self.train_path:  # bitsandbytes' CPU training path: x Wᵀ
            return nn.functional.linear(x, self.weight, self.bias)
        A = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            h = A.to(torch.float16)
            if self.threshold > 0:
                h = h.masked_fill(h.abs() >= self.threshold, 0)
            absmax = h.abs().amax(1).float()[:, None]
            codes = torch.round(h * (127.0 / absmax)).to(torch.int8)
            a = codes.float() * absmax / 127.0 * _int8_kernel_scale(A.device)
            if self.outliers is not None and len(self.outliers):
                a[:, self.outliers] = A[:, self.outliers]
        a = A + (a - A).detach()  # straight through
        y = nn.functional.linear(a, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], -1)


def _int8(lin: nn.Linear, threshold: float):
    bnb = pytest.importorskip("bitsandbytes")
    q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                            has_fp16_weights=False, threshold=threshold)
    q.weight = bnb.nn.Int8Params(lin.weight.data.clone(), requires_grad=False,
                                 has_fp16_weights=False)
    if lin.bias is not None:
        q.bias = nn.Parameter(lin.bias.data.clone(), requires_grad=False)
    return q.to(_device())


def _quantize8(model, threshold: float):
    """Every linear layer but the head in bitsandbytes int8 (as --quantize 8bit makes them)."""
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, nn.Linear) and name != "lm_head":
                setattr(mod, name, _int8(child, threshold))
    return model


def _twin8(model, outliers: dict | None = None, train: bool = False):
    """A copy with every int8 layer replaced by its plain-torch twin (``outliers``: layer ->
    the outlier columns the batch had)."""
    import bitsandbytes as bnb

    t = copy.deepcopy(model)
    names = {m: n for n, m in model.named_modules()}
    twins = {n: m for n, m in t.named_modules()}
    for layer, name in names.items():
        if isinstance(layer, bnb.nn.Linear8bitLt):
            parent, _, attr = name.rpartition(".")
            w = dequantized(layer.weight, layer)
            cols = (outliers or {}).get(name)
            setattr(twins[parent] if parent else t, attr,
                    _Int8Twin(w, layer.bias, float(layer.state.threshold), cols, train))
    return t


def _record_outliers(model) -> tuple[dict, list]:
    """Hooks recording each int8 layer's outlier columns on its latest call."""
    import bitsandbytes as bnb

    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, _n=n: seen.__setitem__(_n, mod.state.idx))
             for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    return seen, hooks


@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_int8_layer_rule_equals_per_example_autograd_through_its_twin(threshold, mode):
    """One Linear8bitLt (bias, 3D input with entries above the threshold) under GhostNorms:
    weight (as dequantized) and bias norms equal one autograd backward per example through the
    twin; the twin's forward is the layer's (≤ 1e-6), and not x Wᵀ (the input is rounded)."""
    from brute import brute
    from isouq.ghost.engine import GhostNorms

    torch.manual_seed(0)
    model = nn.Sequential(_int8(nn.Linear(12, 6), threshold), nn.Tanh(), nn.Linear(6, 3))
    model.train(mode == "train")
    x = torch.randn(5, 4, 12).clamp(-2.5, 2.5) * 2
    x[1, 2, 3], x[3, 0, 7] = 9.0, -7.5  # outlier columns 3 and 7 (with threshold 6)
    s_of = lambda out: out[..., 0].pow(2).sum(1)  # noqa: E731
    params = dict(model.named_parameters())
    with GhostNorms(model, params) as ghost:
        res = ghost.backward_detailed(s_of(model(x)))
    q = model[0]
    if threshold and mode == "eval":
        assert q.state.idx.tolist() == [3, 7]
    twin = _twin8(model, {"0": q.state.idx if threshold else None}, train=mode == "train")
    twin.train(mode == "train")
    with torch.no_grad():
        y, yt = q(x), twin[0](x)
        w = dequantized(q.weight, q)
    assert ((y - yt).abs().max() / y.abs().max()) < 1e-6
    if mode == "eval":
        assert ((y - nn.functional.linear(x, w, q.bias)).abs().max() / y.abs().max()) > 1e-4
    tparams = dict(twin.named_parameters())
    ref = brute(twin, tparams, lambda i: s_of(twin(x[i:i + 1]))[0], x.shape[0])
    assert list(params) == list(tparams)
    torch.testing.assert_close(res.per_param, ref, rtol=1e-5, atol=1e-10)


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_8bit_ghost_equals_the_int8_twins_loop(threshold):
    """params='all' on a Llama whose linear layers are bitsandbytes int8 (has_fp16_weights=False,
    the --quantize 8bit layout): ghost ≤ 1e-5 of one backward per answer through the twin; with
    threshold 6 (transformers' default) norm weights of 8 in a few channels make outlier
    columns, and the twin keeps the columns the batch had. Counts and ‖θ*‖² are those of the
    dequantized weights; the per-answer method refuses the int8 weights in one line."""
    tok = tiny.tokenizer()
    m = _llama()
    if threshold:
        with torch.no_grad():
            for layer in m.model.layers:
                layer.input_layernorm.weight[[2, 9]] = 8.0
                layer.post_attention_layernorm.weight[5] = 8.0
    m = _quantize8(m, threshold)
    seen, hooks = _record_outliers(m)
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost")
    for h in hooks:
        h.remove()
    if threshold:
        assert any(c is not None and c.numel() for c in seen.values())
    twin = _twin8(m, seen if threshold else None)
    ref = isouq.score_sequences(twin, tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(g.epistemic, ref.epistemic) < 1e-5
    assert g.params.n_params == ref.params.n_params == g.params.n_model
    assert g.params.sq_norm == pytest.approx(ref.params.sq_norm, rel=1e-6)
    with pytest.raises(InputError, match="quantized.*params='trainable'"):
        isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop")


def _lora(model, **kw):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.0, init_lora_weights=False, **kw)
    torch.manual_seed(1)
    return peft.get_peft_model(model, cfg).eval()


def test_lora_adapter_and_all_sets_equal_the_brute_force_loop():
    """PEFT LoRA on q/v: the adapter set and the whole model (base + adapter), ghost against
    one backward per answer; no fallback."""
    import warnings

    tok = tiny.tokenizer()
    m = _lora(_llama())
    for params in ("adapter", "all"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback would warn
            g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost", params=params)
        lo = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop", params=params)
        assert _rel(g.epistemic, lo.epistemic) < 1e-5, params
    a = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params="adapter").params
    # r = 4 on q (16 → 16: A 4×16, B 16×4) and v (16 → 8: A 4×16, B 8×4), two layers
    assert all("lora_" in n for n in a.names) and a.n_params == 2 * ((64 + 64) + (64 + 32))
    assert a.set == "adapter" and 0 < a.share < 0.5


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_dora_adapter_and_all_sets_equal_the_brute_force_loop(family):
    """PEFT DoRA (use_dora=True) on q/v, magnitudes moved off their initial column norms:
    every parameter's norm (adapter set and whole model) against one backward per answer
    through the model itself, no fallback warning; Qwen2's q/v carry a bias, which DoRA reads
    a second time (subtracting it from the base output). A zero magnitude sends the layer to
    the exact fallback, with its warning."""
    import warnings

    import peft

    tok = tiny.tokenizer()
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.0, init_lora_weights=False, use_dora=True)
    torch.manual_seed(1)
    m = peft.get_peft_model(_llama() if family == "llama" else tiny.causal_lm("qwen2"), cfg).eval()
    mags = [p for n, p in m.named_parameters() if "lora_magnitude_vector" in n]
    assert len(mags) == 4
    with torch.no_grad():
        for p in mags:
            p.mul_(1 + 0.5 * torch.rand_like(p))
    for params in ("adapter", "all"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # a fallback would warn
            g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params=params, per_param=True)
        lo = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop", params=params,
                                   per_param=True)
        assert g.params.names == lo.params.names
        mag = [i for i, n in enumerate(g.params.names) if "magnitude" in n]
        assert len(mag) == 4 and g.per_param[:, mag].min() > 0
        torch.testing.assert_close(g.per_param, lo.per_param, rtol=1e-5,
                                   atol=1e-9 * float(lo.per_param.max()))
        assert _rel(g.epistemic, lo.epistemic) < 1e-5, params
    with torch.no_grad():
        mags[0][3] = 0.0
    with pytest.warns(UserWarning, match="Linear.*fallback"):
        g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params="adapter")
    lo = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop", params="adapter")
    assert _rel(g.epistemic, lo.epistemic) < 1e-5


def test_dora_on_a_4bit_base_equals_the_dequantized_twins_loop():
    """QDoRA: a DoRA adapter on bitsandbytes NF4 q/v layers. The adapter set against one
    backward per answer through the model itself; the whole model (4-bit weights as their
    dequantized values) against one through a copy whose base layers hold those values.
    (DoRA on bitsandbytes int8 layers does not run on CPU with peft 0.21: its second forward
    fails inside peft, which moves the int8 weight and so drops its row scales.)"""
    import bitsandbytes as bnb
    import peft

    tok = tiny.tokenizer()
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.0, init_lora_weights=False, use_dora=True)
    torch.manual_seed(1)
    m = peft.get_peft_model(_quantize(_llama()), cfg).eval()
    assert sum(isinstance(getattr(mod, "base_layer", None), bnb.nn.Linear4bit)
               for mod in m.modules()) == 4
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_magnitude_vector" in n:
                p.mul_(1 + 0.5 * torch.rand_like(p))
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params="adapter")
    lo = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop", params="adapter")
    assert _rel(g.epistemic, lo.epistemic) < 1e-5
    full = isouq.score_sequences(m, tok, PROMPTS, ANSWERS)
    ref = isouq.score_sequences(_twin(m), tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(full.epistemic, ref.epistemic) < 1e-5
    assert full.params.n_params == ref.params.n_params


def test_merged_adapter_scores_as_the_unmerged_base_weights():
    """W' = W + s·BA: ∇W' = ∇W, so the merged model's 'all' score equals the unmerged model's
    score over its base weights (everything but the adapter)."""
    tok = tiny.tokenizer()
    m = _lora(_llama())
    adapter = set(isouq.score_sequences(m, tok, PROMPTS[:1], ANSWERS[:1],
                                        params="adapter").params.names)
    base = [p for n, p in m.named_parameters() if n not in adapter]
    unmerged = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params=base)
    merged_model = copy.deepcopy(m).merge_and_unload()
    merged = isouq.score_sequences(merged_model, tok, PROMPTS, ANSWERS, params="all")
    assert _rel(unmerged.epistemic, merged.epistemic) < 1e-5


def test_adapter_set_on_a_model_without_adapters_names_the_fix():
    with pytest.raises(InputError, match="no PEFT adapter.*--adapter"):
        isouq.score_sequences(_llama(), tiny.tokenizer(), PROMPTS, ANSWERS, params="adapter")


def _score_quantized(folder, tmp_path, bits: str) -> tuple:
    """``isouq score --quantize BITS`` on three answers, on the test device (the GPU under
    ISOUQ_TEST_DEVICE=cuda): (rows written, the model loaded again the same way, its
    tokenizer, the rows' prompts, their answers)."""
    import json

    from isouq.cli import main
    from isouq.llm.prompts import qa_prompt
    from isouq.models import load_model
    from isouq.runio import read_jsonl

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    qa = [("who sat on the mat", "the cat sat"), ("what is the capital of france", "paris"),
          ("why is the sky blue", "because the sky is blue")]
    inp.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": a}) + "\n"
                           for i, (q, a) in enumerate(qa)))
    assert main(["score", str(inp), "--out", str(out), "--model", str(folder),
                 "--quantize", bits, "--device", str(_device())]) == 0
    rows = read_jsonl(out)
    assert {r["params"]["set"] for r in rows} == {"all"} and rows[0]["params"]["share"] == 1.0
    m, tok, _ = load_model(str(folder), quantize=bits, device=str(_device()))
    assert any(is_quantized(p) for p in m.parameters())
    assert all(p.device.type == _device().type for p in m.parameters())
    return rows, m, tok, [qa_prompt(tok, r["question"]) for r in rows], [r["answer"] for r in rows]


def test_quantize_4bit_on_the_command_line_scores_every_weight_exactly(tiny_llama_dir, tmp_path):
    """isouq score --quantize 4bit on a local folder: NF4 layers, every weight scored, each
    answer's epistemic ≤ 1e-5 of one backward through a float32 twin holding the dequantized
    weights of the loaded model."""
    pytest.importorskip("bitsandbytes")
    rows, m, tok, prompts, answers = _score_quantized(tiny_llama_dir, tmp_path, "4bit")
    ref = isouq.score_sequences(_twin(m), tok, prompts, answers, method="loop")
    got = torch.tensor([r["scores"]["epistemic"] for r in rows])
    assert _rel(got, ref.epistemic.cpu()) < 1e-5
    assert rows[0]["n_params"] == ref.params.n_params


def test_quantize_8bit_on_the_command_line_scores_every_weight_exactly(tiny_llama_dir, tmp_path):
    """isouq score --quantize 8bit on a local folder: transformers' int8 layers (threshold 6),
    every weight scored (set 'all', share 1), each answer's epistemic ≤ 1e-5 of one backward
    through the int8 twin of the loaded model (no input entry reached the threshold here, so
    no outlier column couples the answers of a batch)."""
    pytest.importorskip("bitsandbytes")
    rows, m, tok, prompts, answers = _score_quantized(tiny_llama_dir, tmp_path, "8bit")
    seen, hooks = _record_outliers(m)
    g = isouq.score_sequences(m, tok, prompts, answers)
    for h in hooks:
        h.remove()
    assert {float(q.state.threshold) for q in m.modules() if hasattr(q, "state")} == {6.0}
    assert not any(c is not None and c.numel() for c in seen.values())
    ref = isouq.score_sequences(_twin8(m), tok, prompts, answers, method="loop")
    got = torch.tensor([r["scores"]["epistemic"] for r in rows])
    assert _rel(got, ref.epistemic.cpu()) < 1e-5 and _rel(g.epistemic, ref.epistemic) < 1e-5
    assert rows[0]["n_params"] == ref.params.n_params == g.params.n_model


def _torchao(config_name: str):
    """A tiny Llama whose linear layers torchao quantized in place (``quantize_``):
    "int4-groups" is IntxWeightOnlyConfig with 4-bit codes in groups of 8 inputs."""
    q = pytest.importorskip("torchao.quantization")
    m = _llama()
    if config_name == "int4-groups":
        from torchao.quantization.granularity import PerGroup

        config = q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(8))
    else:
        config = getattr(q, config_name)()
    q.quantize_(m, config)
    assert all(is_quantized(mod.weight) for mod in m.modules() if isinstance(mod, nn.Linear))
    return m


def _float_twin(model):
    """A copy with every torchao weight replaced by a float parameter of its dequantized values."""
    t = copy.deepcopy(model)
    for mod in t.modules():
        if isinstance(mod, nn.Linear) and is_quantized(mod.weight):
            mod.weight = nn.Parameter(dequantized(mod.weight))
    return t


@pytest.mark.parametrize("config_name", ["Int8WeightOnlyConfig", "int4-groups"])
def test_torchao_weight_only_ghost_equals_the_dequantized_twins_loop(config_name):
    """torchao weight-only quantization (int8 codes with a scale per row; int4 codes with a
    scale per group of 8 inputs, IntxWeightOnlyConfig), every linear layer and the head: the
    layers compute x Wᵀ with W the
    dequantized weight (the twin's logits agree ≤ 1e-5), and ghost params='all' equals one
    backward per answer through the twin (≤ 1e-5), counts and ‖θ*‖² those of W; the
    per-answer method refuses the quantized weights in one line."""
    tok = tiny.tokenizer()
    m = _torchao(config_name)
    twin = _float_twin(m)
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        a, b = m(input_ids=ids).logits, twin(input_ids=ids).logits
    assert ((a - b).abs().max() / b.abs().max()) < 1e-5
    g = isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="ghost")
    ref = isouq.score_sequences(twin, tok, PROMPTS, ANSWERS, method="loop")
    assert _rel(g.epistemic, ref.epistemic) < 1e-5
    assert g.params.n_params == ref.params.n_params == g.params.n_model
    assert g.params.sq_norm == pytest.approx(ref.params.sq_norm, rel=1e-6)
    plain = isouq.score_sequences(_llama(), tok, PROMPTS, ANSWERS, method="ghost")
    assert _rel(g.epistemic, plain.epistemic) > 1e-4  # the rounding shows
    with pytest.raises(InputError, match="quantized.*params='trainable'"):
        isouq.score_sequences(m, tok, PROMPTS, ANSWERS, method="loop")


def test_torchao_activation_quantization_is_refused_in_one_line():
    """Int8DynamicActivationInt8WeightConfig rounds each layer's input as well, into a tensor
    without autograd history: no gradient reaches anything before such a layer (the model's own
    backward gives none), so scoring is refused before any forward, whatever the set, naming
    the weight-only configurations."""
    tok = tiny.tokenizer()
    m = _torchao("Int8DynamicActivationInt8WeightConfig")
    x = torch.randn(2, 16, requires_grad=True)
    assert not m.model.layers[0].mlp.gate_proj(x).requires_grad
    for params in ("all", "trainable"):
        with pytest.raises(ModelError, match="no gradient passes.*Int8WeightOnlyConfig"):
            isouq.score_sequences(m, tok, PROMPTS, ANSWERS, params=params)


# ---------------------------------------------------------------- block profiles (isouq.blocks)

def test_blocks_of_a_4bit_model_equal_its_dequantized_twin():
    bnb = pytest.importorskip("bitsandbytes")
    tok = tiny.tokenizer(chat=False)
    m = _quantize(_llama())
    assert any(isinstance(x, bnb.nn.Linear4bit) for x in m.modules())
    s = isouq.score_sequences(m, tok, BLOCK_PROMPTS, BLOCK_ANSWERS, blocks=True)
    check_against_brute(s, _twin(m), tok)


def test_blocks_of_a_lora_model_hold_their_adapters():
    tok = tiny.tokenizer(chat=False)
    m = _lora(_llama())
    s = isouq.score_sequences(m, tok, BLOCK_PROMPTS, BLOCK_ANSWERS, blocks=True)
    check_against_brute(s, m, tok)
    assert "base_model.model.model.layers.0" in s.block_names
    adapter = isouq.score_sequences(m, tok, BLOCK_PROMPTS, BLOCK_ANSWERS, blocks=True,
                                    params="adapter")
    assert adapter.block_names == ("base_model.model.model.layers.0",
                                   "base_model.model.model.layers.1")
    torch.testing.assert_close(adapter.blocks.sum(1), adapter.epistemic, rtol=1e-5, atol=0)
