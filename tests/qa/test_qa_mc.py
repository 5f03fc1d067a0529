"""TruthfulQA MC1 (``isouq qa mc``): option probabilities, decision, labels, scores, resume."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import entropy

from isouq.data.qa import MCItem, load_truthfulqa_mc, read_truthfulqa_mc
from isouq.errors import DataError, InputError
from isouq.llm.prompts import encode_prompt
from isouq.runio import read_jsonl
from isouq.study.qa import mc

QUESTION = "What is the capital of France?"
OPTIONS = ["Paris", "London is the capital", "blue", "William Shakespeare wrote it"]


def brute_force(model, tok, prompt: str, cont: str) -> tuple[float, float]:
    """(p̄, ℓ̄) of one continuation from its own forward pass, no padding, all logits."""
    p_ids = encode_prompt(tok, prompt)
    c_ids = tok(cont, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + c_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    probs = torch.softmax(logits, -1)
    ps = [float(probs[len(p_ids) - 1 + j, t]) for j, t in enumerate(c_ids)]
    return sum(ps) / len(ps), sum(torch.log(torch.tensor(ps)).tolist()) / len(ps)


def test_option_scores_match_one_forward_per_option(tiny_lm, tok):
    prompt = mc.mc_prompt(tok, QUESTION)
    conts = [mc.continuation(tok, o) for o in OPTIONS]
    assert conts[0] == " Paris"  # plain tokenizer: the answer follows "Answer:" after a space
    got = mc.option_scores(tiny_lm, tok, prompt, conts)
    for i, c in enumerate(conts):
        pbar, lbar = brute_force(tiny_lm, tok, prompt, c)
        assert got.mean_prob[i].item() == pytest.approx(pbar, rel=1e-4)
        assert got.mean_logprob[i].item() == pytest.approx(lbar, rel=1e-4, abs=1e-5)
        assert got.n_tokens[i].item() == len(tok(c, add_special_tokens=False)["input_ids"])
    assert len(set(got.n_tokens.tolist())) > 1  # the options have different lengths (padding)


def test_chat_prompt_continuation_is_the_option(tiny_lm, chat_tok):
    prompt = mc.mc_prompt(chat_tok, QUESTION)
    assert prompt.endswith("<|assistant|>\n")
    assert mc.continuation(chat_tok, "Paris") == "Paris"
    got = mc.option_scores(tiny_lm, chat_tok, prompt, ["Paris", "blue sky"])
    assert got.mean_prob[1].item() == pytest.approx(
        brute_force(tiny_lm, chat_tok, prompt, "blue sky")[0], rel=1e-4)


def test_option_distribution_is_softmax_of_mean_logprobs():
    lbar = torch.tensor([-1.0, -2.5, -0.3])
    q = torch.softmax(lbar.double(), 0).numpy()
    mx, ent = mc.option_distribution(lbar)
    assert mx == pytest.approx(q.max())
    assert ent == pytest.approx(entropy(q))


def _mc_file(tmp_path, items: list[tuple[str, list[str], int]]):
    rows = [{"question": q, "mc1_targets": {o: int(i == lab) for i, o in enumerate(opts)},
             "mc2_targets": {o: int(i == lab) for i, o in enumerate(opts)}}
            for q, opts, lab in items]
    path = tmp_path / "mc.json"
    path.write_text(json.dumps(rows))
    return path


def test_decision_rule_and_exact_label(tiny_lm, tok, tmp_path):
    prompt = mc.mc_prompt(tok, QUESTION)
    pbar = [brute_force(tiny_lm, tok, prompt, mc.continuation(tok, o))[0] for o in OPTIONS]
    best = max(range(len(OPTIONS)), key=pbar.__getitem__)
    other = (best + 1) % len(OPTIONS)
    path = _mc_file(tmp_path, [(QUESTION, OPTIONS, best), (QUESTION + " ", OPTIONS, other)])
    items = read_truthfulqa_mc(path)
    rows = [mc.score_question(tiny_lm, tok, it) for it in items]
    for row in rows:
        assert row["chosen"] == best
        assert row["options"] == [mc.continuation(tok, o) for o in OPTIONS]
        assert row["option_mean_prob"] == pytest.approx(pbar, rel=1e-4)
    assert [r["correct"] for r in rows] == [1, 0]
    assert [r["correct_option"] for r in rows] == [best, other]


def test_gradient_scores_of_the_chosen_option(tiny_lm, tok):
    """epistemic = ‖∇θ p̄‖² and epistemic_log = ‖∇θ log p̄‖² of the chosen option, by autograd."""
    item = MCItem("k", QUESTION, OPTIONS, [1, 0, 0, 0])
    row = mc.score_question(tiny_lm, tok, item, p_true=False)
    prompt, cont = row["prompt"], row["options"][row["chosen"]]
    p_ids = encode_prompt(tok, prompt)
    c_ids = tok(cont, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + c_ids])
    params = [p for p in tiny_lm.parameters()]
    logits = tiny_lm(input_ids=ids).logits[0]
    probs = torch.softmax(logits, -1)
    pbar = torch.stack([probs[len(p_ids) - 1 + j, t] for j, t in enumerate(c_ids)]).mean()
    g = torch.autograd.grad(pbar, params, retain_graph=True)
    g_log = torch.autograd.grad(torch.log(pbar), params)
    sq = sum(float(x.double().pow(2).sum()) for x in g)
    sq_log = sum(float(x.double().pow(2).sum()) for x in g_log)
    s = row["scores"]
    assert s["mean_prob"] == pytest.approx(float(pbar.detach()), rel=1e-4)
    assert s["epistemic"] == pytest.approx(sq, rel=1e-3)
    assert s["epistemic_log"] == pytest.approx(sq_log, rel=1e-3)
    assert "p_true" not in s


def test_p_true_reads_the_meta_prompt(tiny_lm, tok):
    from isouq.study.qa.baselines.p_true import p_true_given

    item = MCItem("k", QUESTION, OPTIONS, [1, 0, 0, 0])
    row = mc.score_question(tiny_lm, tok, item)
    others = [o for i, o in enumerate(OPTIONS) if i != row["chosen"]]
    want = p_true_given(tiny_lm, tok, [QUESTION], [OPTIONS[row["chosen"]]], [others])[0]
    assert row["scores"]["p_true"] == pytest.approx(want[0])
    pa, pb = row["p_true_mass"]["p_a"], row["p_true_mass"]["p_b"]
    assert row["scores"]["p_true"] == pytest.approx(pa / (pa + pb))


def test_run_resumes_and_refuses_other_settings(tiny_lm, tok, tmp_path):
    path = _mc_file(tmp_path, [(f"{QUESTION} {i}", OPTIONS, i % 4) for i in range(3)])
    calls = []

    def loader(name):
        calls.append(name)
        return tiny_lm, tok, "tiny"

    out = tmp_path / "out"
    rows_file = mc.run_mc("tiny", out, limit=2, data=str(path), loader=loader, progress=False)
    first = read_jsonl(rows_file)
    assert [r["key"] for r in first] == ["tqa-mc-000", "tqa-mc-001"]
    mc.run_mc("tiny", out, limit=3, data=str(path), loader=loader, progress=False)
    rows = read_jsonl(rows_file)
    assert [r["key"] for r in rows] == ["tqa-mc-000", "tqa-mc-001", "tqa-mc-002"]
    assert rows[:2] == first  # kept, not recomputed
    mc.run_mc("tiny", out, limit=3, data=str(path), loader=loader, progress=False)
    assert len(calls) == 2  # nothing left: the model is not loaded
    rows[0]["settings"] = dict(rows[0]["settings"], decision="something else")
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="other settings"):
        mc.run_mc("tiny", out, limit=3, data=str(path), loader=loader, progress=False)


def test_shipped_mc_file():
    try:
        items = load_truthfulqa_mc()
    except DataError as e:  # pragma: no cover - without the shared data folder
        pytest.skip(str(e))
    assert len(items) == 817
    assert all(sum(it.labels) == 1 and len(it.options) >= 2 for it in items)
    assert items[0].question == "What happens if you eat a pomegranate?"
    assert items[0].options[items[0].correct_index].startswith("Nothing in particular")


def test_bad_mc_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q", "mc1_targets": {"a": 1, "b": 1}}]))
    with pytest.raises(DataError, match="2 true MC1 options"):
        read_truthfulqa_mc(bad)
    with pytest.raises(DataError, match="does not exist"):
        read_truthfulqa_mc(tmp_path / "none.json")


def test_semgrad_of_the_chosen_option_and_backfill(tiny_lm, tok, tmp_path):
    from isouq.runio import JsonlWriter, latest_by_key
    from isouq.study.qa.semgrad import semgrad_scores

    path = _mc_file(tmp_path, [(QUESTION, OPTIONS, 0)])
    item = read_truthfulqa_mc(path)[0]
    row = mc.score_question(tiny_lm, tok, item, p_true=False)
    want = semgrad_scores(tiny_lm, tok, row["prompt"], row["options"][row["chosen"]])
    assert row["scores"]["semgrad"] == pytest.approx(want.semgrad)
    assert row["scores"]["lm_head_grad"] == pytest.approx(want.lm_head)
    assert row["scores"]["hybridgrad"] == pytest.approx(want.hybrid)
    # a row written before SemGrad existed gets it in a revision on the next run
    out = tmp_path / "out"
    old = mc.score_question(tiny_lm, tok, item, semgrad=False)
    assert "semgrad" not in old["scores"]
    settings = dict(mc.SETTINGS, data=str(path))
    JsonlWriter(mc.rows_path(out, "tiny")).write(
        {"key": item.key, "model": "tiny", **old, "settings": settings})
    mc.run_mc("tiny", out, data=str(path), loader=lambda n: (tiny_lm, tok, "tiny"),
              progress=False)
    rows = read_jsonl(mc.rows_path(out, "tiny"))
    assert len(rows) == 2 and rows[1]["revision"] == 1
    (latest,) = latest_by_key(rows)
    assert latest["scores"]["semgrad"] == pytest.approx(want.semgrad)
    assert latest["scores"]["p_true"] == old["scores"]["p_true"]
