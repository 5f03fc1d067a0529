"""The LM-Polygraph plugin's isouq side, without LM-Polygraph: (input text, greedy token ids)
in, isouq's scores out, equal to ``isouq score`` on the same pairs; one backward per batch;
refusals in one line; a missing extra names its ``pip install`` line."""

from __future__ import annotations

import sys

import pytest
import torch

from isouq.errors import MissingExtraError, ModelError
from isouq.integrations import polygraph as pg
from isouq.models import load_model
from isouq.sequences import encode

from .conftest import QUESTIONS, SCORE_KEYS, isouq_score


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    model, tok, _ = load_model(str(tiny_llama_dir))
    return model, tok


def greedy(model, tok, prompts, n=5) -> list[list[int]]:
    """Greedy continuations of the prompts (token ids), as a generator would make them."""
    out = []
    for p in prompts:
        ids = encode(tok, [p], [[0]])[0].prompt
        with torch.no_grad():
            seq = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                 min_new_tokens=2, pad_token_id=0)
        out.append(seq[0, len(ids):].tolist())
    return out


class FakeWhitebox:
    """Just what the plugin reads from LM-Polygraph's WhiteboxModel (duck-typed); its tokenize
    follows WhiteboxModel.tokenize."""

    model_type = "CausalLM"

    def __init__(self, model, tok, instruct):
        self.model, self.tokenizer, self.instruct = model, tok, instruct

    def tokenize(self, texts):
        if self.instruct:
            texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                                        add_generation_prompt=True, tokenize=False)
                     for t in texts]
        self.tokenizer.padding_side = "left"
        return self.tokenizer(texts, padding=True, return_tensors="pt",
                              add_special_tokens=not self.instruct)


@pytest.mark.parametrize("instruct", [False, True])
def test_scores_equal_isouq_score_on_the_same_pairs(tiny, tiny_llama_dir, tmp_path, instruct):
    model, tok = tiny
    texts = [f"question {q} answer" for q in QUESTIONS]
    prompts = pg.lm_polygraph_prompts(texts, instruct)
    tokens = greedy(model, tok, prompts)
    wrapper = FakeWhitebox(model, tok, instruct)
    stats = pg.polygraph_stats(wrapper, texts, tokens)
    assert set(stats) == {*pg.STATS, pg.METHOD_STAT} and stats[pg.METHOD_STAT] == "ghost"
    cli = isouq_score(tiny_llama_dir, prompts, tokens, tmp_path)
    for k in SCORE_KEYS:
        got = torch.tensor(stats[f"isouq_{k}"])
        want = torch.tensor([r[k] for r in cli], dtype=torch.float64)
        assert torch.allclose(got, want, rtol=2e-4, atol=1e-9), k
    assert list(stats["isouq_n_tokens"]) == [len(t) for t in tokens]


def test_pad_tokens_after_an_answer_are_not_scored(tiny):
    """A batched generation pads an answer that stopped at a stop string (Gemma's greedy
    answers end in ``<pad>``): the plugin scores the answer without them."""
    model, tok = tiny
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    texts = [f"question {q} answer" for q in QUESTIONS]
    tokens = greedy(model, tok, pg.lm_polygraph_prompts(texts, False))
    padded = [t + [tok.pad_token_id] * (i + 1) for i, t in enumerate(tokens)]
    wrapper = FakeWhitebox(model, tok, False)
    want, got = pg.polygraph_stats(wrapper, texts, tokens), pg.polygraph_stats(wrapper, texts, padded)
    for k in SCORE_KEYS:
        assert torch.allclose(torch.tensor(got[f"isouq_{k}"]), torch.tensor(want[f"isouq_{k}"]),
                              rtol=1e-5, atol=1e-9), k
    assert list(got["isouq_n_tokens"]) == list(want["isouq_n_tokens"])


def test_without_padding_keeps_a_pad_that_ends_a_sequence():
    """Where the pad token is also the end-of-sequence token it may end an answer: kept."""
    from types import SimpleNamespace

    from isouq.integrations.polygraph_stats import without_padding

    assert without_padding([[5, 6, 0, 0], [0, 0]], SimpleNamespace(pad_token_id=0,
                                                               eos_token_id=2)) == [[5, 6], [0]]
    assert without_padding([[5, 2, 2]], SimpleNamespace(pad_token_id=2, eos_token_id=[2, 7])) == [
        [5, 2, 2]]


def test_one_backward_per_batch_with_gradients_off_outside(tiny, monkeypatch):
    model, tok = tiny
    from isouq.ghost.engine import GhostNorms

    calls = []
    real = GhostNorms.backward_detailed

    def counting(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(GhostNorms, "backward_detailed", counting)
    texts = [f"question {q}" for q in QUESTIONS]
    tokens = greedy(model, tok, texts, n=3)
    free = pg.score_generations(model, tok, texts, tokens)
    assert len(calls) == 1  # five answers, one backward
    with torch.no_grad():  # as LM-Polygraph's calculators leave it: isouq turns gradients on
        inside = pg.score_generations(model, tok, texts, tokens)
    assert len(calls) == 2
    assert torch.allclose(torch.tensor(free["epistemic"]), torch.tensor(inside["epistemic"]))
    pg.score_generations(model, tok, texts, tokens, batch_size=2)
    assert len(calls) == 5  # 2 + 2 + 1


def test_inference_mode_is_refused_in_one_line(tiny):
    model, tok = tiny
    with torch.inference_mode(), pytest.raises(ModelError) as e:
        pg.score_generations(model, tok, ["question who wrote hamlet"], [[5, 6]])
    assert "inference_mode" in str(e.value) and "\n" not in str(e.value)


def test_prompt_tokens_that_differ_from_lm_polygraphs_are_refused(tiny):
    model, tok = tiny
    with pytest.raises(ModelError) as e:
        pg.score_generations(model, tok, ["question who wrote hamlet"], [[5, 6]],
                             prompt_ids=[[2, 5, 6]])
    assert "LM-Polygraph fed 3" in str(e.value) and "\n" not in str(e.value)


class VLLMish:
    model_type = "vLLMCausalLM"
    instruct = False


class WhiteboxModelvLLM:  # named like LM-Polygraph's vLLM adapter
    model = object()


class Blackbox:
    model_type = "Blackbox"


class Seq2Seq:
    model_type = "Seq2SeqLM"
    model = torch.nn.Linear(2, 2)
    tokenizer = staticmethod(lambda *a, **k: None)


@pytest.mark.parametrize("wrapper, why", [
    (VLLMish(), "vLLM runs the model without autograd"),
    (WhiteboxModelvLLM(), "vLLM runs the model without autograd"),
    (Blackbox(), "exposes no PyTorch weights"),
    (Seq2Seq(), "decoder-only causal LMs"),
])
def test_a_model_isouq_cannot_score_is_one_line_naming_why(wrapper, why):
    with pytest.raises(ModelError) as e:
        pg.polygraph_stats(wrapper, ["a question"], [[1, 2]])
    msg = str(e.value)
    assert why in msg and "\n" not in msg and msg.startswith("isouq cannot score a ")


def test_without_lm_polygraph_the_plugin_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_polygraph", None)  # looks uninstalled
    for use in (lambda: pg.IsouqEpistemic, lambda: pg.load_estimator({"score": "aleatoric"}),
                lambda: pg.load_stat_calculator({}, None), pg.calculator_container):
        with pytest.raises(MissingExtraError) as e:
            use()
        assert "pip install 'isouq[polygraph]'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(AttributeError):
        pg.NoSuchThing  # noqa: B018
