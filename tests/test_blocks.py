"""Block profiles (``score_sequences(..., blocks=True)``): ‖∇θ_b p̄‖² per block of the model from
the one ghost backward, against a brute-force autograd backward per answer grouped by block
names written out here (an independent rule), on three families; a 4-bit model (through its
dequantized twin) and a LoRA model: tests/ghost/test_quantized_and_adapters.py."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import isouq
import tiny
from isouq.blocks import block_map
from isouq.errors import InputError, ModelError

PROMPTS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue"]
ANSWERS = ["paris is the capital", "shakespeare wrote hamlet yes", "because the sky is blue"]
STACK = re.compile(r"^(.*\.(?:layers|h)\.\d+)\.")


def expected_block(name: str) -> str:
    """The block a parameter belongs to, written out: the decoder layer it lies under, else the
    module holding it."""
    m = STACK.match(name)
    return m.group(1) if m else name.rsplit(".", 1)[0]


def brute_blocks(model, tok, prompt: str, answer: str) -> dict[str, float]:
    """{block: ‖∇θ_b p̄‖²} of one answer: its p̄ computed by hand from one forward of the
    unpadded pair, one ``torch.autograd.grad`` over every floating-point weight."""
    p_ids = tok(prompt)["input_ids"]
    a_ids = tok(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + a_ids])
    named = [(n, q) for n, q in model.named_parameters() if q.is_floating_point()]
    flags = [q.requires_grad for _, q in named]
    for _, q in named:
        q.requires_grad_(True)
    try:
        logits = model(input_ids=ids).logits[0].float()
        lp = torch.log_softmax(logits[len(p_ids) - 1:-1], -1)
        p_bar = lp.gather(1, torch.tensor(a_ids)[:, None]).exp().mean()
        grads = torch.autograd.grad(p_bar, [q for _, q in named], allow_unused=True)
    finally:
        for (_, q), f in zip(named, flags, strict=True):
            q.requires_grad_(f)
    out: dict[str, float] = {}
    for (n, _), g in zip(named, grads, strict=True):
        b = expected_block(n)
        out[b] = out.get(b, 0.0) + (0.0 if g is None else float(g.double().pow(2).sum()))
    return out


def check_against_brute(scores, reference_model, tok):
    assert scores.blocks is not None and scores.blocks.shape == (len(ANSWERS),
                                                                 len(scores.block_names))
    torch.testing.assert_close(scores.blocks.sum(1), scores.epistemic, rtol=1e-5, atol=0)
    for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        ref = brute_blocks(reference_model, tok, p, a)
        assert set(ref) == set(scores.block_names)
        got = scores.row_blocks(i)
        total = sum(ref.values())
        for b, v in ref.items():  # each block to ≤ 1e-5 of the answer's total
            assert abs(got[b] - v) <= 1e-5 * total, (i, b, got[b], v)


@pytest.mark.parametrize("family", ["llama-tied", "gpt2", "qwen2"])
def test_blocks_equal_a_brute_force_backward_per_block(family):
    tok, model = tiny.tokenizer(chat=False), tiny.causal_lm(family)
    s = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True, batch_size=2)
    check_against_brute(s, model, tok)
    if family == "llama-tied":  # the head's gradient is the tied embedding's block
        assert "lm_head" not in s.block_names and "model.embed_tokens" in s.block_names
        assert [b for b in s.block_names if b.startswith("model.layers.")] == [
            f"model.layers.{k}" for k in range(model.config.num_hidden_layers)]


def _diagonal(model):
    """A non-identity covariance over every weight of ``model``."""
    from isouq.covariance import Diagonal

    return Diagonal(torch.ones(sum(p.numel() for p in model.parameters())), 1.0)


@pytest.mark.parametrize("strategy", ["retain", "rows"])
def test_blocks_beside_spans_are_the_whole_answers(strategy):
    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    plain = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True)
    spans = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True, spans="sentences",
                                  span_strategy=strategy)
    assert spans.block_names == plain.block_names
    torch.testing.assert_close(spans.blocks, plain.blocks, rtol=1e-5, atol=0)


def test_every_engine_gives_the_same_blocks_and_per_param_agrees():
    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    ghost = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True, per_param=True)
    summed = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True)
    loop = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True, method="per_example")
    torch.testing.assert_close(ghost.blocks, summed.blocks, rtol=1e-5, atol=0)
    torch.testing.assert_close(loop.blocks, summed.blocks, rtol=1e-5, atol=0)
    bm = block_map(model, ghost.params.names)
    torch.testing.assert_close(ghost.per_param @ bm.indicator(), ghost.blocks, rtol=1e-5, atol=0)


def test_blocks_that_cannot_be_named_and_bad_combinations_are_one_line():
    class Bare(nn.Module):  # a weight held by the model itself: no module path
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

    with pytest.raises(ModelError, match="cannot be named: parameter 'w'"):
        block_map(Bare(), ["w"])
    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    with pytest.raises(InputError, match="needs the identity covariance"):
        isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=True, method="per_example",
                              covariance=_diagonal(model))
    seq = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    assert block_map(seq, [n for n, _ in seq.named_parameters()]).names == ("0", "2")
