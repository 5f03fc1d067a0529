"""Packed prompts (packed_logits): the logits of each prompt encoded alone, for less work."""

from __future__ import annotations

import random

import pytest
import torch

from isouq.llm import packed_logits as pl
from isouq.llm.generation import option_probs

FAMILIES = ["llama", "llama-tied", "gpt2", "gpt_neox", "qwen2", "gemma3"]


def _alone(model, rows):
    """Independent reference: every row encoded whole, by itself, no cache."""
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([r])).logits[:, -1].float()
                          for r in rows])


def _rows(vocab: int, seed: int = 0, shared: int = 12, n: int = 7) -> list[list[int]]:
    """n rows with a common beginning of ``shared`` tokens, then 1-9 tokens of their own, some
    of which share a second, longer beginning."""
    rng = random.Random(seed)
    head = [rng.randrange(4, vocab) for _ in range(shared)]
    second = head + [rng.randrange(4, vocab) for _ in range(3)]
    rows = []
    for i in range(n):
        base = second if i % 2 else head
        rows.append(base + [rng.randrange(4, vocab) for _ in range(rng.randint(1, 9))])
    return sorted(rows)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logits_are_each_prompt_alone(family):
    from tiny import VOCAB, causal_lm

    lm = causal_lm(family)
    rows = _rows(VOCAB)
    if family == "gemma3":  # sliding-window layers: a packed mask would be wrong
        assert not pl.supports_packing(lm)
        return
    assert pl.supports_packing(lm)
    got = torch.cat(list(pl.packed_last_logits(lm, rows, "cpu", batch_size=3)))
    assert got.shape == (len(rows), VOCAB)
    assert torch.allclose(got, _alone(lm, rows), rtol=1e-4, atol=1e-5)


def test_eager_attention_packs_too():
    from tiny import VOCAB, causal_lm

    lm = causal_lm("qwen2")
    lm.set_attn_implementation("eager")
    rows = _rows(VOCAB, seed=3)
    assert pl.supports_packing(lm)
    got = torch.cat(list(pl.packed_last_logits(lm, rows, "cpu", batch_size=8)))
    assert torch.allclose(got, _alone(lm, rows), rtol=1e-4, atol=1e-5)


def test_passes_are_balanced_and_unpadded():
    from tiny import VOCAB, causal_lm

    lm = causal_lm("llama")
    rows = _rows(VOCAB, n=9)
    p = pl.shared_prefix_len(rows)
    shapes = []
    hook = lm.register_forward_hook(lambda m, a, kw, out: shapes.append(kw["input_ids"].shape),
                                    with_kwargs=True)
    sizes = [len(x) for x in pl.packed_last_logits(lm, rows, "cpu", batch_size=8)]
    hook.remove()
    assert sizes == [5, 4]  # 9 rows at batch size 8: two balanced passes
    assert shapes[0] == (1, p)  # the common beginning, once
    # each pass is one row holding exactly its prompts' own tokens: no padding
    assert shapes[1] == (1, sum(len(r) - p for r in rows[:5]))
    assert shapes[2] == (1, sum(len(r) - p for r in rows[5:]))


def test_prefix_is_kept_between_calls():
    from tiny import VOCAB, causal_lm

    lm = causal_lm("qwen2")
    rows = _rows(VOCAB, seed=1, shared=20)
    held = pl.PrefixKV()
    first = torch.cat(list(pl.packed_last_logits(lm, rows[:4], "cpu", prefix=held)))
    p1 = pl.shared_prefix_len(rows[:4])
    assert held.encoded_tokens == p1 and held.ids == rows[0][:p1]
    # a second call whose rows share a longer beginning among themselves: only the tokens
    # beyond the first call's beginning are encoded
    later = [rows[0][:p1] + [5, 6, 7, t] for t in (8, 9, 10)]
    second = torch.cat(list(pl.packed_last_logits(lm, later, "cpu", prefix=held)))
    assert held.encoded_tokens == p1 + 3
    # and one that shares less: the kept part is cut back, not re-encoded
    fewer = [rows[0][:5] + [11, t] for t in (12, 13)]
    third = torch.cat(list(pl.packed_last_logits(lm, fewer, "cpu", prefix=held)))
    assert held.encoded_tokens == p1 + 3 + 1 and held.ids == rows[0][:5] + [11]
    for got, rs in ((first, rows[:4]), (second, later), (third, fewer)):
        assert torch.allclose(got, _alone(lm, rs), rtol=1e-4, atol=1e-5)


def test_a_model_that_packs_wrongly_is_found_and_padded_instead():
    import transformers as tf

    from tiny import VOCAB, causal_lm

    class IgnoresPositions(tf.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                    past_key_values=None, **kw):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                   past_key_values=past_key_values, **kw)

    good = causal_lm("llama")
    with torch.no_grad():  # logits of a real model's size, so that wrong ones stand out
        good.lm_head.weight.mul_(100)
    bad = IgnoresPositions(good.config).eval()
    bad.load_state_dict(good.state_dict())
    rows = _rows(VOCAB, seed=2)
    assert pl.supports_packing(bad)
    with pytest.warns(UserWarning, match="packed prompts do not give"):
        assert not pl.can_pack(bad, rows, "cpu")
    assert not pl.can_pack(bad, rows, "cpu")  # decided once per model
    assert pl.can_pack(good, rows, "cpu")


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_option_probs_same_packed_or_padded(family):
    from isouq.llm.prompts import entailment_prompt
    from tiny import causal_lm, tokenizer

    tk, lm = tokenizer(chat=False), causal_lm(family)
    q = "what is the capital of france because the moon is made of cheese"
    prompts = [entailment_prompt(q, a, b) for a, b in
               [("paris", "the moon"), ("paris", "rock"), ("cheese", "paris"),
                ("the capital is paris", "paris")]]
    opts = {"a": ["yes"], "b": ["no"], "c": ["cat"]}
    held = pl.PrefixKV()
    packed = option_probs(lm, tk, prompts, opts, batch_size=3, prefix=held)
    padded = option_probs(lm, tk, prompts, opts, batch_size=3, pack=False)
    assert torch.allclose(packed, padded, rtol=1e-4, atol=1e-7)
    assert (held.encoded_tokens > 0) == (family != "gemma3")


def test_empty_prompt_is_a_clear_error():
    from isouq.errors import InputError
    from tiny import causal_lm

    with pytest.raises(InputError, match="zero tokens"):
        next(pl.packed_last_logits(causal_lm("llama"), [[5, 6], []], "cpu"))


def test_cache_argument_name_follows_the_forward_signature():
    from types import SimpleNamespace

    class NewName(torch.nn.Module):  # transformers >= 5.24 names the cache ``cache``
        def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None):
            return SimpleNamespace(cache=("kv",))

    class OldName(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
            return SimpleNamespace(past_key_values=("kv",))

    assert pl.cache_kwarg(NewName()) == "cache"
    assert pl.cache_kwarg(OldName()) == "past_key_values"
    assert pl.returned_cache(NewName()(None)) == ("kv",)
    assert pl.returned_cache(OldName()(None)) == ("kv",)
