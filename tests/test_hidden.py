"""isouq.hidden: each answer's mean hidden state is the model's own ``hidden_states`` averaged
over the prompt and the answer but its last token (as LM-Polygraph averages its embedding), at
the probe's depths, unchanged by padding and batching; score_sequences(hidden=True) returns them
and the rows carry them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny
from isouq import score_sequences
from isouq.errors import InputError
from isouq.hidden import mean_hidden_states, probe_layers, state_name
from isouq.prepare import encode_checked
from isouq.tokens import Encoded

PROMPTS = ["what is the capital of france", "who wrote hamlet"]
ANSWERS = ["paris is the capital", "shakespeare"]


def test_probe_layers_are_a_quarter_half_three_quarters_and_the_final_norm():
    assert probe_layers(24) == [6, 12, 18, -1]
    assert probe_layers(2) == [1, 2, -1]  # a tiny model: a quarter and a half are one layer


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_mean_hidden_states_are_the_forwards_states_averaged(family):
    lm, tok = tiny.causal_lm(family), tiny.tokenizer()
    res = score_sequences(lm, tok, PROMPTS, ANSWERS, hidden=True, batch_size=2)
    depth = len(lm(torch.tensor([[1, 2]]), output_hidden_states=True).hidden_states) - 1
    assert list(res.hidden) == [state_name(k) for k in probe_layers(depth)]
    for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        e = encode_checked(tok, p, a)
        seq = torch.tensor([e.prompt + e.answer[:-1]])
        states = lm(seq, output_hidden_states=True).hidden_states
        for k in probe_layers(depth):
            np.testing.assert_allclose(res.hidden[state_name(k)][i],
                                       states[k][0].mean(0).detach().numpy(), atol=2e-5)
        row = res.row_hidden(i)
        assert list(row) == list(res.hidden) and len(row[state_name(-1)]) == lm.config.hidden_size
    alone = score_sequences(lm, tok, PROMPTS[1:], ANSWERS[1:], hidden=True, batch_size=1)
    for name, X in alone.hidden.items():  # no padding, another batch: the same state
        np.testing.assert_allclose(X[0], res.hidden[name][1], atol=2e-5)
    assert score_sequences(lm, tok, PROMPTS, ANSWERS).hidden is None


def test_a_pair_without_a_prompt_is_one_line():
    lm = tiny.causal_lm("llama")
    with pytest.raises(InputError, match="without prompt tokens"):
        mean_hidden_states(lm, [Encoded(prompt=[], answer=[3, 4])], pad=0)


def test_the_head_computes_one_positions_logits_and_a_forward_without_the_option_still_works():
    lm, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    enc = [encode_checked(tok, p, a) for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    seen = []
    hook = lm.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    try:
        got = mean_hidden_states(lm, enc, pad=0, batch_size=2)
    finally:
        hook.remove()
    assert seen == [(2, 1, lm.config.vocab_size)]  # the states need no logits

    class Plain(torch.nn.Module):  # a forward that does not name logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_input_embeddings(self):
            return self.inner.get_input_embeddings()

        def forward(self, input_ids, attention_mask=None, output_hidden_states=False,
                    use_cache=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              output_hidden_states=output_hidden_states, use_cache=use_cache)

    plain = mean_hidden_states(Plain(lm), enc, pad=0, batch_size=2)
    for name, X in got.items():
        np.testing.assert_allclose(plain[name], X, atol=1e-6)


@pytest.mark.parametrize("method,side", [("ghost", "left"), ("ghost", "right"),
                                         ("per_example", "left")])
def test_the_states_come_from_the_scores_own_forward(method, side):
    lm, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    calls = []
    hook = lm.model.register_forward_hook(lambda m, i, o: calls.append(1))
    try:
        res = score_sequences(lm, tok, PROMPTS, ANSWERS, hidden=True, batch_size=2,
                              method=method, padding_side=side)
        with_states = len(calls)
        calls.clear()
        plain = score_sequences(lm, tok, PROMPTS, ANSWERS, batch_size=2, method=method,
                                padding_side=side)
    finally:
        hook.remove()
    assert with_states == len(calls)  # no second forward
    np.testing.assert_allclose(res.epistemic, plain.epistemic, rtol=1e-5)
    enc = [encode_checked(tok, p, a) for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    alone = mean_hidden_states(lm, enc, pad=0, batch_size=1)  # a forward of its own, unpadded
    assert list(res.hidden) == list(alone)
    for name, X in alone.items():
        np.testing.assert_allclose(res.hidden[name], X, atol=2e-5)


def test_span_scores_take_the_states_from_a_forward_of_their_own():
    lm, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    res = score_sequences(lm, tok, PROMPTS, ["paris. it is the capital.", "shakespeare. yes."],
                          hidden=True, spans="sentences", batch_size=2)
    enc = [encode_checked(tok, p, a) for p, a in
           zip(PROMPTS, ["paris. it is the capital.", "shakespeare. yes."], strict=True)]
    for name, X in mean_hidden_states(lm, enc, pad=0, batch_size=2).items():
        np.testing.assert_allclose(res.hidden[name], X, atol=2e-5)
