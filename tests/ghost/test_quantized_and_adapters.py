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

PROMPTS = ["Question: who sat?\nAnswer:", "Q: what is it\nA:", "Say a word:"]
ANSWERS = [" a cat sat", " the dog", " hello there you"]


def _rel(a, b):
    return ((a - b).abs() / b.abs()).max().item()


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
                setattr(mod, name, q.to("cpu"))
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


def test_int8_weights_without_a_rule_are_refused_in_one_line():
    bnb = pytest.importorskip("bitsandbytes")
    m = _llama()
    lin = m.model.layers[0].mlp.down_proj
    q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=False,
                            has_fp16_weights=False)
    q.weight = bnb.nn.Int8Params(lin.weight.data.clone(), requires_grad=False,
                                 has_fp16_weights=False)
    m.model.layers[0].mlp.down_proj = q.to("cpu")
    tok = tiny.tokenizer()
    if not any(is_quantized(p) for p in m.parameters()):
        pytest.skip("bitsandbytes kept this 8-bit weight in float on this device")
    with pytest.raises(ModelError, match="Linear8bitLt.*params='trainable'"):
        isouq.score_sequences(m, tok, PROMPTS, ANSWERS)


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
