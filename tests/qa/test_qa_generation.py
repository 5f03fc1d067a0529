"""Decoding loop: shapes, exactness against teacher forcing and ``generate``, determinism,
stop handling, option probabilities."""

import math

import pytest
import torch

from isouq.errors import InputError, ModelError
from isouq.llm.generation import (
    _decode,
    _greedy_pick,
    filter_logits,
    generate_greedy,
    option_probs,
    option_token_ids,
    sample_completions,
)
from isouq.llm.prompts import encode_prompt, qa_prompts

from .conftest import scripted

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?",
             "What colour is the sky over London in the summer?"]


def test_greedy_shapes_and_logprobs(tiny_lm, tok):
    gens = generate_greedy(tiny_lm, tok, qa_prompts(tok, QUESTIONS), max_new_tokens=8)
    assert len(gens) == 3
    for g in gens:
        assert 1 <= g.n_tokens <= 8
        assert len(g.logprobs) == len(g.model_logprobs) == g.n_tokens
        assert g.logprobs == g.model_logprobs and all(lp <= 0 for lp in g.logprobs)
        assert g.stop_reason in {"eos", "stop", "length"}
        assert g.text == g.raw_text.strip() and g.seconds > 0
        assert math.isclose(g.mean_logprob, sum(g.logprobs) / g.n_tokens)


def test_model_logprobs_match_teacher_forcing(tiny_lm, tok):
    prompts = qa_prompts(tok, QUESTIONS)
    for g, p in zip(generate_greedy(tiny_lm, tok, prompts, max_new_tokens=6), prompts,
                    strict=True):
        ids = encode_prompt(tok, p)
        full = torch.tensor([ids + g.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_lm(full).logits[0].float(), -1)
        want = [logp[len(ids) - 1 + t, tid].item() for t, tid in enumerate(g.token_ids)]
        assert torch.allclose(torch.tensor(g.model_logprobs), torch.tensor(want), atol=1e-4)


def test_decode_loop_matches_hf_generate(tiny_lm, tok):
    prompts = qa_prompts(tok, QUESTIONS)
    ids = [encode_prompt(tok, p) for p in prompts]
    rows = _decode(tiny_lm, tok, ids, _greedy_pick, max_new_tokens=6, stop=(), eos_ids=set())
    for pid, (gen, *_rest) in zip(ids, rows, strict=True):
        ref = tiny_lm.generate(torch.tensor([pid]), attention_mask=torch.ones(1, len(pid)),
                               do_sample=False, max_new_tokens=6, min_new_tokens=6,
                               pad_token_id=tok.pad_token_id)
        assert gen == ref[0, len(pid):].tolist()


def test_greedy_does_not_depend_on_batch_size(tiny_lm, tok):
    prompts = qa_prompts(tok, QUESTIONS)
    a = generate_greedy(tiny_lm, tok, prompts, max_new_tokens=6, batch_size=1)
    b = generate_greedy(tiny_lm, tok, prompts, max_new_tokens=6, batch_size=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_sampling_shapes_determinism_and_seed(tiny_lm, tok):
    prompts = qa_prompts(tok, QUESTIONS[:2])
    a = sample_completions(tiny_lm, tok, prompts, k=4, max_new_tokens=6, seed=1, batch_size=3)
    b = sample_completions(tiny_lm, tok, prompts, k=4, max_new_tokens=6, seed=1, batch_size=8)
    c = sample_completions(tiny_lm, tok, prompts, k=4, max_new_tokens=6, seed=2, batch_size=8)
    assert len(a) == 2 and all(s.k == 4 and s.passes == 4 for s in a)
    assert [s.texts for s in a] == [s.texts for s in b]  # per-row streams: batching-invariant
    assert [[x.token_ids for x in s.completions] for s in a] != \
        [[x.token_ids for x in s.completions] for s in c]
    for s in a:
        assert s.seconds > 0 and s.temperature == 1.0 and s.key == s.prompt
        for g in s.completions:
            assert len(g.logprobs) == len(g.model_logprobs) == g.n_tokens >= 1
            # top-k renormalizes, so sampled tokens are at least as likely as under the model
            assert all(x >= y - 1e-6 for x, y in zip(g.logprobs, g.model_logprobs, strict=True))


def test_sampling_logprobs_follow_temperature_and_top_k(tiny_lm, tok):
    prompts = qa_prompts(tok, QUESTIONS[:1])
    full = sample_completions(tiny_lm, tok, prompts, k=3, max_new_tokens=5, top_k=None)
    for g in full[0].completions:  # T = 1, no truncation: sampling == model distribution
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(g.model_logprobs), atol=1e-5)
    one = sample_completions(tiny_lm, tok, prompts, k=2, max_new_tokens=5, top_k=1)
    greedy = generate_greedy(tiny_lm, tok, prompts, max_new_tokens=5)
    for g in one[0].completions:  # top-k = 1 is greedy, drawn with probability 1
        assert g.token_ids == greedy[0].token_ids and all(abs(x) < 1e-6 for x in g.logprobs)
    with pytest.raises(InputError):
        sample_completions(tiny_lm, tok, prompts, temperature=0)


def test_stop_at_newline(rule_lm, tok):
    lm = rule_lm(scripted(tok, " Paris\nQuestion: next"))
    (g,) = generate_greedy(lm, tok, ["Question: q\nAnswer:"], max_new_tokens=20)
    assert g.text == "Paris" and g.raw_text == " Paris" and g.stop_reason == "stop"
    assert g.token_ids == tok(" Paris", add_special_tokens=False)["input_ids"]
    assert lm.forward_calls <= 4  # stopped right after the newline


def test_stop_at_question_and_eos_and_length(rule_lm, tok):
    (g,) = generate_greedy(rule_lm(scripted(tok, " Paris Question: x")), tok, ["Answer:"])
    assert g.text == "Paris" and g.raw_text == " Paris" and g.stop_reason == "stop"
    assert g.token_ids == tok(" Paris", add_special_tokens=False)["input_ids"]
    (e,) = generate_greedy(rule_lm(scripted(tok, " Paris", eos=True)), tok, ["Answer:"])
    assert e.text == "Paris" and e.stop_reason == "eos" and tok.eos_token_id not in e.token_ids
    (n,) = generate_greedy(rule_lm(scripted(tok, " Paris Paris Paris")), tok, ["A:"],
                           max_new_tokens=2)
    assert n.stop_reason == "length" and n.n_tokens == 2


def test_empty_answer_keeps_the_stop_token(rule_lm, tok):
    (g,) = generate_greedy(rule_lm(scripted(tok, "\nQuestion")), tok, ["Answer:"])
    assert g.text == "" and g.n_tokens == 1
    assert g.token_ids == tok("\n", add_special_tokens=False)["input_ids"]
    (e,) = generate_greedy(rule_lm(scripted(tok, "", eos=True)), tok, ["Answer:"])
    assert e.text == "" and e.token_ids == [tok.eos_token_id] and e.stop_reason == "eos"


def test_option_probs_from_controlled_logits(rule_lm, tok):
    a_ids = option_token_ids(tok, "is:", [" A", "A"])
    b_ids = option_token_ids(tok, "is:", [" B", "B"])
    assert len(a_ids) == 2 and not set(a_ids) & set(b_ids)
    lm = rule_lm(lambda h, n: {a_ids[0]: 2.0, b_ids[0]: 1.0})
    mass = option_probs(lm, tok, ["is:", "is:"], {"A": [" A", "A"], "B": [" B", "B"]})
    z = (len(tok) - 2) + math.exp(2.0) + math.exp(1.0)
    assert mass.shape == (2, 2)
    assert math.isclose(mass[0, 0].item(), (math.exp(2.0) + 1) / z, rel_tol=1e-5)
    assert math.isclose(mass[1, 1].item(), (math.exp(1.0) + 1) / z, rel_tol=1e-5)
    with pytest.raises(ModelError):
        option_probs(lm, tok, ["is:"], {"A": [" A"], "also A": ["xx", " A"]})


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_samples_of_one_prompt_share_one_prefill(family):
    from tiny import causal_lm, tokenizer

    tk, lm = tokenizer(chat=False), causal_lm(family)
    prompts = ["Question: what is the capital of france? Answer:", "Question: who? Answer:"]
    calls = []
    hook = lm.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape),
                                    with_kwargs=True)
    shared = sample_completions(lm, tk, prompts, k=4, max_new_tokens=5, seed=1, batch_size=8,
                                stop=())
    hook.remove()
    assert calls[0][0] == 2 and all(c == (8, 1) for c in calls[1:])  # one prefill per prompt
    alone = sample_completions(lm, tk, prompts, k=4, max_new_tokens=5, seed=1, batch_size=8,
                               stop=(), share_prefill=False)
    for a, b in zip(shared, alone, strict=True):
        for x, y in zip(a.completions, b.completions, strict=True):
            assert x.token_ids == y.token_ids
            assert torch.allclose(torch.tensor(x.model_logprobs), torch.tensor(y.model_logprobs),
                                  atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_shared_prefix_gives_the_logits_of_each_prompt_alone(family):
    from isouq.llm import generation
    from isouq.llm.prompts import entailment_prompt
    from tiny import causal_lm, tokenizer

    tk, lm = tokenizer(chat=False), causal_lm(family)
    q = "what is the capital of france because the moon is made of cheese"
    prompts = [entailment_prompt(q, "the capital is paris", b) for b in
               ["paris", "the moon", "the capital of france is rock", "cheese"]]
    prompts += [entailment_prompt(q, "cheese", "paris")]  # shorter shared prefix
    rows = [encode_prompt(tk, p) for p in prompts]
    assert generation.shared_prefix_len(rows) >= generation.MIN_SHARED_PREFIX
    assert generation.shared_prefix_len(rows[:4]) > generation.shared_prefix_len(rows)
    opts = {"a": ["yes"], "b": ["no"], "c": ["cat"]}
    shared = option_probs(lm, tk, prompts, opts, batch_size=8, pack=False)
    alone = torch.cat([option_probs(lm, tk, [p], opts) for p in prompts])
    assert torch.allclose(shared, alone, rtol=1e-4, atol=1e-7)
    # the prefix is really reused: one forward of the prefix, one of the suffixes
    calls = []
    hook = lm.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape),
                                    with_kwargs=True)
    option_probs(lm, tk, prompts[:4], opts, batch_size=8, pack=False)
    hook.remove()
    assert len(calls) == 2 and calls[0][0] == 1 and calls[1][0] == 4
    assert calls[1][1] < len(rows[0]) - generation.MIN_SHARED_PREFIX


def test_bad_inputs(tiny_lm, tok):
    with pytest.raises(InputError):
        generate_greedy(tiny_lm, tok, "one string")
    with pytest.raises(InputError):
        sample_completions(tiny_lm, tok, ["a"], keys=["x", "y"])


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    kept = torch.isfinite(filter_logits(logits, None, 0.6))
    assert kept.tolist() == [[True, True, False], [False, True, True]]
    assert torch.isfinite(filter_logits(logits, 1, 1.0)).sum(-1).tolist() == [1, 1]
    assert torch.isfinite(filter_logits(logits, None, 0.1)).sum(-1).tolist() == [1, 1]
