"""score_sequences: ghost == loop == brute-force autograd on tiny random models of six families."""

import pytest
import torch

import isouq
import tiny
from isouq.errors import InputError, ModelError

PROMPTS = [
    "what is the capital of france",
    "who wrote hamlet",
    [{"role": "user", "content": "why is the sky blue"}],
    "the moon is made of",
    "yes",
]
ANSWERS = ["paris", "shakespeare wrote hamlet", "because", "cheese rock cheese the moon", "no no"]


def brute_force(model, tok, prompts, answers):
    """Independent reference: per answer, unpadded forward, p̄ over answer tokens, autograd."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for prompt, answer in zip(prompts, answers, strict=False):
        if isinstance(prompt, str):
            p_ids = tok(prompt)["input_ids"]
        else:
            text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            p_ids = tok(text, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p_ids + a_ids])
        probs = torch.softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        tgt = ids[0, 1:]
        pt = probs[torch.arange(len(tgt)), tgt][len(p_ids) - 1 :]
        pbar = pt.mean()
        gs = torch.autograd.grad(pbar, params, retain_graph=True, allow_unused=True)
        per = torch.stack([g.pow(2).sum() if g is not None else torch.tensor(0.0) for g in gs])
        tok_sq = []
        for t in range(len(pt)):
            gt = torch.autograd.grad(pt[t], params, retain_graph=True, allow_unused=True)
            tok_sq.append(sum(g.pow(2).sum() for g in gt if g is not None))
        rows.append(dict(per=per, total=per.sum(), pbar=pbar.detach(),
                         alea=(pt * (1 - pt)).mean().detach(), T=len(pt),
                         per_token=torch.stack(tok_sq).sum() / len(pt) ** 2))
    return rows


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


def rel(a, b):
    return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_ghost_equals_loop_equals_bruteforce(family, tok):
    model = tiny.causal_lm(family)
    ref = brute_force(model, tok, PROMPTS, ANSWERS)
    ghost = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=5, per_param=True)
    loop = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="loop", per_param=True)
    total = torch.stack([r["total"] for r in ref])
    per = torch.stack([r["per"] for r in ref])
    assert rel(ghost.epistemic, total) < 1e-4
    assert rel(loop.epistemic, total) < 1e-4
    # per layer (per parameter tensor), where the reference is not ~0
    big = per > 1e-6 * per.max()
    assert rel(ghost.per_param[big], per[big]) < 1e-4
    assert rel(loop.per_param[big], per[big]) < 1e-4
    assert torch.allclose(ghost.mean_prob, torch.stack([r["pbar"] for r in ref]), rtol=1e-5)
    assert torch.allclose(ghost.aleatoric, torch.stack([r["alea"] for r in ref]), rtol=1e-5)
    assert ghost.n_tokens.tolist() == [r["T"] for r in ref]
    n_params = sum(p.numel() for p in model.parameters())
    assert ghost.params.n_params == n_params
    assert ghost.params.sq_norm == pytest.approx(
        sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()), rel=1e-5)


# module types a family's ghost pass leaves to the exact per-example fallback (subclasses of
# nn.Linear / nn.Embedding with a forward of their own)
FALLBACKS = {"falcon": "FalconLinear", "opt": "OPTLearnedPositionalEmbedding"}


@pytest.mark.parametrize("family", sorted(tiny.MORE_FAMILIES))
def test_more_families_ghost_equals_loop(family, tok):
    """Phi-3/4, OLMo, OLMo 2, Mistral, Gemma 2, Qwen 3, OPT (FFN on the flattened batch), …:
    one backward for the batch gives each answer's ‖∇θ p̄‖² as one backward per answer does."""
    import warnings

    model = tiny.causal_lm(family)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ghost = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=5)
    loop = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="loop")
    assert rel(ghost.epistemic, loop.epistemic) < 1e-4
    assert torch.allclose(ghost.mean_prob, loop.mean_prob, rtol=1e-5)
    fell_back = [str(w.message) for w in caught if "no rule for module" in str(w.message)]
    if family in FALLBACKS:
        assert len(fell_back) == 1 and FALLBACKS[family] in fell_back[0]
    else:
        assert fell_back == []


@pytest.mark.parametrize("family", ["llama-tied", "gpt2"])
def test_per_token_variant_against_bruteforce(family, tok):
    model = tiny.causal_lm(family)
    ref = brute_force(model, tok, PROMPTS, ANSWERS)
    pt = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="per_token")
    assert rel(pt.epistemic, torch.stack([r["per_token"] for r in ref])) < 1e-4


@pytest.mark.parametrize("family", ["llama-tied", "gpt2", "gemma3"])
def test_batch_size_and_padding_side_do_not_change_scores(family, tok):
    model = tiny.causal_lm(family)
    base = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=5).epistemic
    for bs in (1, 2, 3):
        for side in ("right", "left"):
            s = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=bs,
                                      padding_side=side).epistemic
            assert rel(s, base) < 1e-4, (bs, side)


@pytest.mark.parametrize("family", tiny.FAMILIES[:2])
def test_forward_only_gives_the_forward_scores_and_no_gradient(family, tok):
    """method='forward': p̄, the aleatoric score and the sequence log-probability as the
    brute-force forward gives them (and as the ghost engine does), the hidden states of its
    forward, no gradient score (NaN) and no backward (no weight or activation gradient)."""
    model = tiny.causal_lm(family)
    ref = brute_force(model, tok, PROMPTS, ANSWERS)
    f = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="forward", batch_size=2,
                              hidden=True)
    g = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=2, hidden=True)
    assert torch.isnan(f.epistemic).all() and f.method == "forward"
    assert torch.allclose(f.mean_prob, torch.stack([r["pbar"] for r in ref]), rtol=1e-5)
    assert torch.allclose(f.aleatoric, torch.stack([r["alea"] for r in ref]), rtol=1e-5)
    assert torch.allclose(f.seq_logprob, g.seq_logprob, rtol=1e-5)
    assert all(torch.allclose(torch.as_tensor(f.hidden[k]), torch.as_tensor(g.hidden[k]),
                              atol=1e-6) for k in g.hidden)
    assert all(p.grad is None for p in model.parameters())
    for bad in ({"blocks": True}, {"spans": "sentences"}, {"per_param": True}):
        with pytest.raises(InputError, match="method='forward' computes no gradient"):
            isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="forward", **bad)


def test_params_subset_and_token_id_answers(tok):
    model = tiny.causal_lm("llama-tied")
    ids = [tok(a, add_special_tokens=False)["input_ids"] for a in ANSWERS]
    a = isouq.score_sequences(model, tok, PROMPTS, ANSWERS)
    b = isouq.score_sequences(model, tok, PROMPTS, ids)
    assert torch.equal(a.epistemic, b.epistemic)
    sub = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, params="*.mlp.*", per_param=True)
    assert all(".mlp." in n for n in sub.params.names)
    assert (sub.epistemic < a.epistemic).all()
    # only the mlp parameters take part: compare with the loop over that subset
    loop = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, params="*.mlp.*", method="loop")
    assert rel(sub.epistemic, loop.epistemic) < 1e-4


def test_weights_requires_grad_restored(tok):
    model = tiny.causal_lm("llama")
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    isouq.score_sequences(model, tok, PROMPTS[:2], ANSWERS[:2])
    flags = [p.requires_grad for p in model.parameters()]
    assert flags.count(False) == 1


def test_clear_errors(tok):
    model = tiny.causal_lm("llama")
    with pytest.raises(InputError, match="answer 1: the answer is empty"):
        isouq.score_sequences(model, tok, ["a", "b"], ["paris", ""])
    with pytest.raises(InputError, match="2 prompts but 1 answers"):
        isouq.score_sequences(model, tok, ["a", "b"], ["paris"])
    long_answer = " ".join(["cat"] * (model.config.max_position_embeddings + 5))
    with pytest.raises(InputError, match="context window"):
        isouq.score_sequences(model, tok, ["the"], [long_answer])
    with pytest.raises(InputError, match="method"):
        isouq.score_sequences(model, tok, ["the"], ["cat"], method="nope")
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(ModelError, match="NaN"):
        isouq.score_sequences(model, tok, ["the"], ["cat"])


@pytest.mark.parametrize("prompt, answer, problem", [
    (0, "paris", "answer 0: the prompt must be a string or a non-empty list"),
    ([], "paris", "answer 0: the prompt must be a string or a non-empty list"),
    ([{"role": "user"}], "paris", "answer 0: the prompt must be a string or a non-empty list"),
    ("q", 4, "answer 0: the answer must be a string or a list of token ids"),
    ("q", [1.7, 5], "answer 0: the answer must be a string or a list of token ids"),
    ("q", [True, 5], "answer 0: the answer must be a string or a list of token ids"),
    ("q", [5, 10_000], "token id 10000 is outside the model's vocabulary"),
])
def test_bad_prompts_and_answers_are_input_errors(prompt, answer, problem):
    """Never silently wrong: no 'Question: None', no str(4), no truncated float ids."""
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    with pytest.raises(InputError, match=problem):
        isouq.score_sequences(model, tok, [prompt], [answer])


def test_chat_template_failure_is_an_input_error():
    tok = tiny.tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InputError, match="chat template cannot render"):
        isouq.score_sequences(tiny.causal_lm("llama"), tok,
                              [[{"role": "user", "content": "hi"}]], ["yes"])


def test_token_id_answers_equal_their_text():
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    ids = tok("the cat sat", add_special_tokens=False)["input_ids"]
    a = isouq.score_sequences(model, tok, ["who sat"], ["the cat sat"])
    b = isouq.score_sequences(model, tok, ["who sat"], [torch.tensor(ids)])
    torch.testing.assert_close(a.epistemic, b.epistemic)
    # epistemic_log = ‖∇ log p̄‖², against autograd of log p̄ directly
    params = [p for p in model.parameters() if p.requires_grad]
    p_ids = tok("who sat")["input_ids"]
    full = torch.tensor([p_ids + ids])
    probs = torch.softmax(model(input_ids=full).logits[0, :-1], -1)
    pt = probs[torch.arange(full.shape[1] - 1), full[0, 1:]][len(p_ids) - 1:]
    g = torch.autograd.grad(pt.mean().log(), params)
    ref = sum(x.pow(2).sum() for x in g)
    torch.testing.assert_close(a.epistemic_log[0], ref, rtol=1e-4, atol=0)


@pytest.mark.parametrize("family", ["llama-tied", "gpt2", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_ghost_matches_the_same_dtype_loop(family, dtype):
    """Every ghost term is accumulated in float32: in bf16/fp16 ghost is within 1% of one
    backward per answer in the same dtype, and as close to the float32 loop as that loop
    (up to the rounding noise of the dtype itself)."""
    tok = tiny.tokenizer()
    ref = isouq.score_sequences(tiny.causal_lm(family), tok, PROMPTS, ANSWERS,
                                method="loop").epistemic
    model = tiny.causal_lm(family).to(dtype)
    g = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="ghost").epistemic
    lo = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="loop").epistemic
    assert g.dtype == torch.float32
    assert ((g - lo).abs() / lo).max() < 0.01
    err_g, err_l = ((g - ref).abs() / ref).median(), ((lo - ref).abs() / ref).median()
    eps = torch.finfo(dtype).eps
    assert err_g <= err_l + eps, (err_g, err_l)


def test_token_multiple_pads_on_cuda_only():
    from isouq.ghost.factors import TOKEN_MULTIPLE, round_up, token_multiple

    assert TOKEN_MULTIPLE == 8  # the default (ISOUQ_TOKEN_MULTIPLE unset)
    assert token_multiple("cuda") == 8 and token_multiple(torch.device("cuda", 0)) == 8
    assert token_multiple("cpu") == 1 and token_multiple(None) == 1
    assert [round_up(n, 8) for n in (1, 8, 9, 69)] == [8, 8, 16, 72]
    enc = isouq.sequences.encode(tiny.tokenizer(), PROMPTS, ANSWERS)
    b1 = isouq.sequences.collate(enc, 0)
    b8 = isouq.sequences.collate(enc, 0, multiple=8)
    L = b1.input_ids.shape[1]
    assert L % 8 and b8.input_ids.shape[1] == round_up(L, 8)  # the test pads something
    assert torch.equal(b8.input_ids[:, :L], b1.input_ids)
    assert not b8.attention_mask[:, L:].any() and not b8.answer_mask[:, L - 1:].any()


@pytest.mark.parametrize("family", ["llama-tied", "gpt2", "gemma3"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_rows_padded_to_a_multiple_of_8_do_not_change_scores(family, side, tok, monkeypatch):
    """What CUDA runs (rows and the lm_head's compacted positions padded to 8), forced on the
    CPU, against the brute-force reference on unpadded rows."""
    import isouq.ghost.factors as factors
    import isouq.passes as passes

    model = tiny.causal_lm(family)
    ref = torch.stack([r["total"] for r in brute_force(model, tok, PROMPTS, ANSWERS)])
    seen, natural = [], []
    collate = passes.collate

    def spy(enc, *args, **kwargs):
        b = collate(enc, *args, **kwargs)
        seen.append(b.input_ids.shape[1])
        natural.append(max(len(e.prompt) + len(e.answer) for e in enc))
        return b

    monkeypatch.setattr(passes, "token_multiple", lambda device: 8)
    monkeypatch.setattr(factors, "token_multiple", lambda device: 8)
    monkeypatch.setattr(passes, "collate", spy)
    s = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, batch_size=3, padding_side=side)
    assert seen and all(n % 8 == 0 for n in seen) and any(n % 8 for n in natural)
    assert rel(s.epistemic, ref) < 1e-4


def test_compacted_positions_padded_with_zero_rows(monkeypatch):
    import isouq.ghost.factors as factors

    torch.manual_seed(0)
    N, T = 3, 40
    left = torch.randn(N, T, 50)
    left[:, 11:] = 0  # the first 11 positions carry a gradient (an answer)
    left[1, :4] = 0
    right = torch.randn(N, T, 6)
    pair = factors.Pair(left, right)
    exact = factors.sq_norms([pair], {})
    assert pair.compacted(by="left").left.shape[1] == 11
    monkeypatch.setattr(factors, "token_multiple", lambda device: 8)
    padded = pair.compacted(by="left")
    assert padded.left.shape[1] == 16 and padded.right.shape[1] == 16
    assert rel(factors.sq_norms([padded], {}), exact) < 1e-5
