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
