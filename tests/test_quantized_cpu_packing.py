"""bitsandbytes 4-bit on the CPU: a forward without gradients repacks the weights for a kernel
without autograd (block scales rounded to bfloat16, stored transposed). A model isouq loads never
repacks, so its answers and scores use the same weights whatever ran before; a model quantized
elsewhere and repacked is unpacked into the layout the autograd path reads."""

from __future__ import annotations

import copy

import pytest
import torch

import isouq
from isouq.quantized import dequantized

PROMPTS = ["what is the capital of france"] * 3
ANSWERS = ["paris", "the cat sat on the mat", "blue sky"]


@pytest.fixture(scope="module")
def q_dir(tmp_path_factory):
    """A tiny Llama whose linear layers fit bitsandbytes' CPU packing (inputs a multiple of the
    block size 64, outputs of 32)."""
    pytest.importorskip("bitsandbytes")
    from transformers import LlamaConfig, LlamaForCausalLM

    import tiny

    tok = tiny.tokenizer()
    cfg = LlamaConfig(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                      eos_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    d = tmp_path_factory.mktemp("q4")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _transformers_4bit(d):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    return AutoModelForCausalLM.from_pretrained(
        d, device_map={"": "cpu"}, quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32)).eval()


def _packs_on_this_cpu(model) -> bool:
    return any(getattr(m, "support_avx512bf16_for_cpu", False) for m in model.modules())


def _no_grad_forward(model, tok):
    with torch.no_grad():
        model(**tok(["what is the capital of france"], return_tensors="pt"))


def test_a_model_isouq_loads_scores_the_same_after_a_forward_without_gradients(q_dir):
    from isouq.models import load_model

    model, tok, _ = load_model(str(q_dir), quantize="4bit")
    before = isouq.score_sequences(model, tok, PROMPTS, ANSWERS)
    _no_grad_forward(model, tok)
    after = isouq.score_sequences(model, tok, PROMPTS, ANSWERS)
    assert after.epistemic.tolist() == before.epistemic.tolist()
    assert after.mean_prob.tolist() == before.mean_prob.tolist()
    assert not any(getattr(m.weight, "quant_state", None) is not None
                   and getattr(m.weight.quant_state, "packing_format_for_cpu", False)
                   for m in model.modules() if hasattr(m, "weight"))


def test_a_repacked_weight_reads_as_its_codes_with_bfloat16_scales(q_dir):
    """dequantized() and the scoring context unpack a repacked weight to the original codes
    with the block scales rounded to bfloat16 (computed here from the weight before it was
    repacked), leave the layer's state alone (dequantized) or usable (the next forward without
    gradients repacks it as before)."""
    import bitsandbytes.functional as bnbf
    from transformers import AutoTokenizer

    model = _transformers_4bit(q_dir)
    if not _packs_on_this_cpu(model):
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes does not repack here")
    tok = AutoTokenizer.from_pretrained(q_dir)
    layer = model.model.layers[0].mlp.down_proj  # two blocks of 64 per row
    codes, state = layer.weight.data.clone(), copy.deepcopy(layer.weight.quant_state)
    state.absmax = state.absmax.to(torch.bfloat16).float()
    want = bnbf.dequantize_4bit(codes, state).float()

    _no_grad_forward(model, tok)
    assert layer.weight.quant_state.packing_format_for_cpu
    assert torch.equal(dequantized(layer.weight), want)
    assert layer.weight.quant_state.packing_format_for_cpu  # left as it was

    first = isouq.score_sequences(model, tok, PROMPTS, ANSWERS)  # unpacks every layer
    assert torch.equal(bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float(),
                       want)
    _no_grad_forward(model, tok)  # repacks
    again = isouq.score_sequences(model, tok, PROMPTS, ANSWERS)
    assert again.epistemic.tolist() == first.epistemic.tolist()
    fresh = isouq.score_sequences(_transformers_4bit(q_dir), tok, PROMPTS, ANSWERS)
    assert first.mean_prob.tolist() == pytest.approx(fresh.mean_prob.tolist(), rel=0.05)
