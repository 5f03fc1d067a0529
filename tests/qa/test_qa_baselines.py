"""Naive entropy, semantic entropy (clustering, caching, normalization), P(True)."""

import math

import numpy as np
import pytest

from isouq.errors import InputError, ModelError
from isouq.llm.generation import Generation, Sampled, option_token_ids, sample_completions
from isouq.llm.prompts import qa_prompts
from isouq.study.qa.baselines.naive_entropy import naive_entropy, naive_entropy_value
from isouq.study.qa.baselines.p_true import p_true
from isouq.study.qa.baselines.semantic_entropy import (
    CONTRADICTION,
    ENTAILMENT,
    NEUTRAL,
    EntailmentJudge,
    LLMEntailment,
    NLIEntailment,
    cluster_logprobs,
    discrete_semantic_entropy,
    entailment_judge,
    entropy_from_logprobs,
    equivalent,
    semantic_clusters,
    semantic_entropy,
)


def fake_sampled(texts, mean_lps, seconds=0.1):
    comps = [Generation(text=t, raw_text=" " + t, token_ids=[1, 2], logprobs=[lp, lp],
                        model_logprobs=[lp, lp], stop_reason="stop", seconds=seconds)
             for t, lp in zip(texts, mean_lps, strict=True)]
    return Sampled(prompt="p", completions=comps, temperature=1.0, top_k=50, top_p=1.0, seed=0,
                   key="p")


class FirstWordJudge(EntailmentJudge):
    """Entailment iff the answers' first words agree (case-insensitive); counts batches."""

    name = "first-word"

    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def predict_labels(self, items):
        self.batches.append(len(items))
        return [ENTAILMENT if a.split()[0].lower() == b.split()[0].lower() else NEUTRAL
                for _, a, b in items]


@pytest.fixture(scope="module")
def samples(tiny_lm, tok):
    qs = ["What is the capital of France?", "Who wrote Hamlet?"]
    return qs, sample_completions(tiny_lm, tok, qa_prompts(tok, qs), k=10, max_new_tokens=6)


# ----------------------------------------------------------------------------- naive entropy


def test_naive_entropy_matches_hand_computation(samples):
    _, sampled = samples
    res = naive_entropy(sampled)
    for r, s in zip(res, sampled, strict=True):
        hand = -np.mean([np.mean(c.logprobs) for c in s.completions])
        assert math.isclose(r.value, hand, rel_tol=1e-9, abs_tol=1e-12)
        assert r.passes == 10 and r.seconds >= s.seconds and len(r.mean_logprobs) == 10
    model = naive_entropy(sampled, which="model")[0]
    hand = -np.mean([np.mean(c.model_logprobs) for c in sampled[0].completions])
    assert math.isclose(model.value, hand, rel_tol=1e-9)
    with pytest.raises(InputError):
        naive_entropy_value([])


# ----------------------------------------------------------------------------- semantic entropy


def test_identical_samples_have_zero_semantic_entropy(samples, tiny_nli, tok):
    one = fake_sampled(["Paris"] * 10, [-0.1 * i for i in range(10)])
    judge = NLIEntailment(tiny_nli, tok)  # random weights: must not be consulted
    (r,) = semantic_entropy(["q"], [one], judge)
    assert r.value == 0.0 and r.discrete == 0.0 and r.n_clusters == 1
    assert r.cluster_ids == [0] * 10 and r.entailment_calls == 0 and judge.calls == 0


def test_probability_weighted_entropy_by_hand():
    # lm-polygraph #223's example: probabilities 0.6, 0.6, 0.6, 0.3, 0.1
    texts = ["Paris", "Paris", "Paris", "Paris it is", "London"]
    lps = list(np.log([0.6, 0.6, 0.6, 0.3, 0.1]))
    (r,) = semantic_entropy(["q"], [fake_sampled(texts, lps)], FirstWordJudge())
    assert r.cluster_ids == [0, 0, 0, 0, 1]
    p = np.array([2.1, 0.1]) / 2.2  # every sample counts, normalized (Farquhar)
    assert np.allclose(np.exp(r.cluster_logprobs), p) and math.isclose(sum(p), 1.0)
    assert math.isclose(r.value, float(-(p * np.log(p)).sum()), rel_tol=1e-9)
    q = np.array([4, 1]) / 5
    assert math.isclose(r.discrete, float(-(q * np.log(q)).sum()), rel_tol=1e-9)
    # distinct strings once (the remedy): 0.9 / 0.1
    uniq = cluster_logprobs(r.cluster_ids, lps, texts, unique=True)
    assert np.allclose(np.exp(uniq), [0.9, 0.1])
    assert math.isclose(entropy_from_logprobs(uniq), -(0.9 * math.log(0.9) + 0.1 * math.log(0.1)))


def test_clustering_is_batched_and_cached():
    judge = FirstWordJudge()
    qs = ["q1", "q2"]
    answers = [["Paris", "paris it is", "London", "Paris"], ["A b", "C", "a c", "D", "c d"]]
    ids, calls = semantic_clusters(qs, answers, judge)
    assert ids == [[0, 0, 1, 0], [0, 1, 0, 2, 1]]
    # per round one batch rep ⊨ answer, one batch answer ⊨ rep (both questions together)
    assert len(judge.batches) == 4
    assert sum(calls) == judge.calls == len(judge.cache)
    # each ordered pair asked at most once: ≤ U(U−1) for U unique strings
    assert calls[0] <= 3 * 2 and calls[1] <= 5 * 4
    before = judge.calls
    again, calls2 = semantic_clusters(qs, answers, judge)
    assert again == ids and judge.calls == before and calls2 == [0, 0]


class HashJudge(EntailmentJudge):
    """Arbitrary, not even transitive, but deterministic labels from a hash of the pair."""

    def predict_labels(self, items):
        return [hash((q, a, b)) % 3 if a[0] != b[0] else ENTAILMENT for q, a, b in items]


def both_directions_clusters(answers, label, strict):
    """Reference: greedy clustering that always asks both directions (LM-Polygraph's loop)."""
    uniq = list(dict.fromkeys(answers))
    cid = [None] * len(uniq)
    n = 0
    for i in range(len(uniq)):
        if cid[i] is None:
            cid[i], n = n, n + 1
            for j in range(i + 1, len(uniq)):
                if cid[j] is None and equivalent(label(uniq[i], uniq[j]),
                                                 label(uniq[j], uniq[i]), strict):
                    cid[j] = cid[i]
    return [cid[uniq.index(a)] for a in answers], len(uniq) * (len(uniq) - 1)


@pytest.mark.parametrize("strict", [True, False])
def test_one_direction_first_gives_the_same_clusters_with_fewer_calls(strict):
    rng = np.random.default_rng(0)
    words = ["ab", "ac", "bd", "be", "cf", "cg", "ah", "bi"]
    for trial in range(30):
        q = f"q{trial}"
        answers = [str(w) for w in rng.choice(words, size=10)]
        judge = HashJudge()
        ids, calls = semantic_clusters([q], [answers], judge, strict=strict)
        ref, worst = both_directions_clusters(
            answers, lambda a, b, q=q: HashJudge().predict_labels([(q, a, b)])[0], strict)
        assert ids == [ref]
        assert calls[0] == judge.calls <= worst


def test_strict_versus_lenient_rule():
    class OneWay(EntailmentJudge):
        def predict_labels(self, items):  # "Paris" ⊨ "Paris, France" only, never contradiction
            return [ENTAILMENT if a == "Paris" else NEUTRAL for _, a, _ in items]

    ids_strict, _ = semantic_clusters(["q"], [["Paris", "Paris, France"]], OneWay())
    ids_lenient, _ = semantic_clusters(["q"], [["Paris", "Paris, France"]], OneWay(),
                                       strict=False)
    assert ids_strict == [[0, 1]] and ids_lenient == [[0, 0]]

    class Contra(EntailmentJudge):
        def predict_labels(self, items):
            return [CONTRADICTION for _ in items]

    assert semantic_clusters(["q"], [["a", "b"]], Contra(), strict=False)[0] == [[0, 1]]


def test_discrete_entropy():
    assert discrete_semantic_entropy([0, 0, 1, 1]) == pytest.approx(math.log(2))
    assert discrete_semantic_entropy([0, 1, 2]) == pytest.approx(math.log(3))


def test_nli_judge_runs_on_tiny_classifier(samples, tiny_nli, tok):
    qs, sampled = samples
    judge = NLIEntailment(tiny_nli, tok, batch_size=7)
    assert judge.label_map == {0: CONTRADICTION, 1: NEUTRAL, 2: ENTAILMENT}
    res = semantic_entropy(qs, sampled, judge)
    for r, s in zip(res, sampled, strict=True):
        assert 1 <= r.n_clusters <= 10 and len(r.cluster_ids) == 10
        assert math.isclose(sum(np.exp(r.cluster_logprobs)), 1.0, rel_tol=1e-9)
        assert 0 <= r.value <= math.log(10) + 1e-9 and 0 <= r.discrete <= math.log(10) + 1e-9
        assert r.passes == 10 and r.seconds >= s.seconds and r.judge == judge.name
    assert isinstance(judge.entails("q", "a", "b"), bool)


def test_nli_judge_needs_entailment_label(tiny_nli, tok):
    import copy

    m = copy.deepcopy(tiny_nli)
    m.config.id2label = {0: "A", 1: "B", 2: "C"}
    with pytest.raises(ModelError):
        NLIEntailment(m, tok)


def test_entailment_judge_follows_the_model_kind(tiny_nli, tiny_lm, tok):
    assert isinstance(entailment_judge(tiny_nli, tok, name="nli"), NLIEntailment)
    llm = entailment_judge(tiny_lm, tok, name="lm", batch_size=3)
    assert isinstance(llm, LLMEntailment) and llm.batch_size == 3 and llm.name == "lm"


def test_llm_entailment_reads_next_token(rule_lm, tok, tiny_lm):
    ent = option_token_ids(tok, "Response:", [" entailment"])[0]
    neu = option_token_ids(tok, "Response:", [" neutral"])[0]

    def rule(ids, n):  # entailment iff both answers mention Paris
        text = tok.decode(ids)
        return {ent: 5.0} if text.count("Paris") >= 2 else {neu: 5.0}

    judge = LLMEntailment(rule_lm(rule), tok, name="rule")
    assert judge.entails_batch([("q", "Paris", "Paris, France"), ("q", "Paris", "Rome")]) == \
        [True, False]
    (r,) = semantic_entropy(["q"], [fake_sampled(["Paris", "Paris, France", "Rome"],
                                                 [-1.0, -1.0, -1.0])], judge)
    assert r.cluster_ids == [0, 0, 1]
    labels = LLMEntailment(tiny_lm, tok).labels([("q", "a", "b"), ("q", "b", "a")])
    assert set(labels) <= {CONTRADICTION, NEUTRAL, ENTAILMENT}


# ----------------------------------------------------------------------------- P(True)


def test_p_true_in_unit_interval_with_reuse_and_own_samples(samples, tiny_lm, tok):
    qs, sampled = samples
    res = p_true(tiny_lm, tok, qs, ["Paris", "Shakespeare"], brainstormed=sampled)
    for r, s in zip(res, sampled, strict=True):
        assert 0.0 <= r.value <= 1.0 and 0 <= r.p_a <= 1 and 0 <= r.p_b <= 1
        assert math.isclose(r.value, r.p_a / (r.p_a + r.p_b))
        assert r.brainstormed == s.texts[:5] and r.passes == 6 and r.seconds > 0
    own = p_true(tiny_lm, tok, qs, ["Paris", "Shakespeare"], k=3, seed=4)
    assert all(0 <= r.value <= 1 and len(r.brainstormed) == 3 and r.passes == 4 for r in own)


def test_p_true_chat_template(samples, tiny_lm, chat_tok):
    qs, sampled = samples
    res = p_true(tiny_lm, chat_tok, qs, ["Paris", "Shakespeare"], brainstormed=sampled)
    assert all(0 <= r.value <= 1 for r in res)


def test_p_true_reads_the_a_token(rule_lm, tok):
    a = option_token_ids(tok, "is:", [" A"])[0]
    b = option_token_ids(tok, "is:", [" B"])[0]
    lm = rule_lm(lambda ids, n: {a: 3.0, b: 1.0} if "Paris" in tok.decode(ids) else {b: 3.0})
    s = [fake_sampled(["x"] * 5, [-1.0] * 5)] * 2
    yes, no = p_true(lm, tok, ["q", "q"], ["Paris", "Rome"], brainstormed=s)
    # two A tokens (" A", "A"): one at logit 3, one at 0; B likewise at 1 and 0
    assert yes.value == pytest.approx((math.exp(3) + 1) / (math.exp(3) + 1 + math.exp(1) + 1))
    assert no.value < 0.5 < yes.value
