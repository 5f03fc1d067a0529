"""Memory stays flat over repeated calls: nothing a backward records outlives it."""

import gc

import pytest
import torch

import isouq
import tiny
from isouq.ghost.engine import GhostNorms

PROMPTS = ["what is the capital of france"] * 6
ANSWERS = ["paris", "the cat sat on the mat", "yes", "no", "rock", "blue sky"]


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def counts(fn, repeats: int = 5) -> list[int]:
    out = []
    for _ in range(repeats):
        fn()
        out.append(live_tensors())
    return out


# tied embeddings (llama-tied, qwen2) take the deferred path that used to leak +4 tensors a batch
@pytest.mark.parametrize("family", ["llama-tied", "qwen2", "gpt2"])
@pytest.mark.parametrize("method", ["ghost", "per_token"])
def test_score_sequences_holds_nothing_between_calls(family, method):
    model, tok = tiny.causal_lm(family), tiny.tokenizer()
    run = lambda: isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method=method, batch_size=2)  # noqa: E731
    run()  # first call: lazily built caches (tokenizer, rotary tables) may appear once
    c = counts(run)
    assert c == [c[0]] * len(c), f"live tensors grow across calls: {c}"


def test_ghost_norms_releases_every_call_after_backward():
    model = tiny.causal_lm("llama-tied")
    ids = torch.randint(4, tiny.VOCAB, (3, 5))
    params = dict(model.named_parameters())

    def once():
        with GhostNorms(model, params, warn=False) as ghost:
            logits = model(input_ids=ids).logits
            ghost.backward(torch.softmax(logits, -1)[:, -1, 5])
            assert ghost.calls == []

    once()
    c = counts(once)
    assert c == [c[0]] * len(c), f"live tensors grow across calls: {c}"


def test_outputs_no_rule_reads_are_not_kept_until_the_backward():
    """A Linear layer's output (autograd would free it early) is not held by the engine; a norm
    layer's, which its rule reads, is; the norms are exact either way (brute force in
    test_rules.py)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Tanh(),
                            torch.nn.Linear(5, 2))
    with GhostNorms(m, dict(m.named_parameters())) as ghost:
        out = m(torch.randn(4, 3))
        held = {type(c.module).__name__: c.output is not None for c in ghost.calls}
        sq = ghost.backward(out[:, 0])
    assert held == {"Linear": False, "LayerNorm": True}
    assert sq.shape == (4,) and bool((sq > 0).all())
