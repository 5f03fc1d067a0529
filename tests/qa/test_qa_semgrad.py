"""SemGrad / lm_head / HybridGrad (Li et al. 2026) against autograd on weights and finite
differences on hidden states, on a tiny float64 Llama."""

from __future__ import annotations

import copy

import pytest
import torch

from isouq.errors import InputError
from isouq.llm.prompts import encode_prompt
from isouq.study.qa.semgrad import default_token_offset, semgrad_scores

PROMPT, ANSWER = "Question: What is the capital of France?\nAnswer:", " Paris"


@pytest.fixture(scope="module")
def lm64(tiny_lm):
    return copy.deepcopy(tiny_lm).double()


def _perturbed_loss(model, ids, P, T, ent0, add=None):
    """Their loss with the entropy weights ``ent0`` held fixed; ``add`` = (index into
    hidden_states, position, vector) perturbs that hidden state (0: the embeddings)."""
    emb = model.get_input_embeddings()(ids).clone()
    handle = None
    if add is not None and add[0] == 0:
        emb[0, add[1]] += add[2]
    elif add is not None:
        k, pos, v = add

        def hook(_m, _i, out):
            o = (out[0] if isinstance(out, tuple) else out).clone()
            o[0, pos] += v
            return (o, *out[1:]) if isinstance(out, tuple) else o

        handle = model.model.layers[k - 1].register_forward_hook(hook)
    try:
        logits = model(inputs_embeds=emb).logits[0, P - 1 : P - 1 + T]
    finally:
        if handle is not None:
            handle.remove()
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    w = ent if ent0 is None else ent0
    return (-w * logp.gather(1, ids[0, P:][:, None])[:, 0]).mean(), ent


def test_lm_head_gradient_equals_autograd_on_the_weight(lm64, tok):
    assert not lm64.config.tie_word_embeddings
    got = semgrad_scores(lm64, tok, PROMPT, ANSWER, token_offset=-1)
    p, a = encode_prompt(tok, PROMPT), tok(ANSWER, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + a])
    # entropy weights are constants in their loss: detach them for the reference gradient
    logits = lm64(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(a)]
    logp = torch.log_softmax(logits, -1)
    ent = (-(logp.exp() * logp).sum(-1)).detach()
    loss = (-ent * logp.gather(1, ids[0, len(p):][:, None])[:, 0]).mean()
    (g,) = torch.autograd.grad(loss, [lm64.lm_head.weight])
    assert got.lm_head == pytest.approx(float(g.abs().mean()), rel=1e-9)
    assert got.mean_entropy == pytest.approx(float(ent.mean()), rel=1e-9)
    alpha = torch.exp(-ent.mean()).item()
    assert got.hybrid == pytest.approx(alpha * got.lm_head + (1 - alpha) * got.semgrad, rel=1e-9)
    assert all(q.requires_grad for q in lm64.parameters())  # restored


def test_semgrad_equals_finite_differences(lm64, tok):
    """Mean |∂L/∂h| over the kept layers at the chosen token, by central differences on every
    coordinate (entropy weights held at their unperturbed values, as in their loss). Llama's
    RMSNorm computes in float32 even in a float64 model, so the step is 1e-3, not 1e-6."""
    off = -2
    got = semgrad_scores(lm64, tok, PROMPT, ANSWER, token_offset=off)
    p, a = encode_prompt(tok, PROMPT), tok(ANSWER, add_special_tokens=False)["input_ids"]
    ids, P, T = torch.tensor([p + a]), len(p), len(a)
    n = lm64.config.num_hidden_layers  # hidden_states: n + 1; last dropped; last n // 2 kept
    layers = list(range(n))[-(n // 2):]
    with torch.no_grad():
        _, ent0 = _perturbed_loss(lm64, ids, P, T, None)
        eps, total, count = 1e-3, 0.0, 0
        d = lm64.config.hidden_size
        for k in layers:
            for j in range(d):
                v = torch.zeros(d, dtype=torch.float64)
                v[j] = eps
                lp, _ = _perturbed_loss(lm64, ids, P, T, ent0, (k, P + off, v))
                lm, _ = _perturbed_loss(lm64, ids, P, T, ent0, (k, P + off, -v))
                total += abs(float(lp - lm) / (2 * eps))
                count += 1
    assert got.semgrad == pytest.approx(total / count, rel=2e-4)
    assert got.token_offset == off


def test_token_offset_default_and_range(tok, chat_tok, tiny_lm):
    assert default_token_offset(tok) == -1
    chatml = copy.deepcopy(tok)
    chatml.chat_template = "{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}"
    assert default_token_offset(chatml) == -3
    with pytest.raises(InputError, match="outside the prompt"):
        semgrad_scores(tiny_lm, tok, "Answer:", " Paris", token_offset=-99)
