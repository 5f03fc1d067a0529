"""configs/polygraph/load_local.py, LM-Polygraph's model loading script: a batch's finished
answers are padded with the end-of-sequence token, so that LM-Polygraph's cut (at the first
end-of-sequence token) leaves no pad token in an answer. Needs no LM-Polygraph."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import by_path

ROOT = Path(__file__).resolve().parents[2]


def _loader():
    return by_path.module("configs/polygraph/load_local.py")


class StopFirstAfter(StoppingCriteria):
    """Stops the batch's first answer after ``n`` new tokens, as a stop string would."""

    def __init__(self, prompt_len: int, n: int):
        self.at = prompt_len + n

    def __call__(self, input_ids, scores, **kw):
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[0] = input_ids.shape[1] >= self.at
        return done


def test_a_stopped_answer_ends_at_the_token_lm_polygraph_cuts_at(tiny_llama_dir):
    load = _loader()
    model, tok = load.load_model(str(tiny_llama_dir)), load.load_tokenizer(str(tiny_llama_dir))
    assert tok.pad_token_id != tok.eos_token_id   # as Gemma 3's: the case that went wrong
    batch = tok(["what is the capital of france", "who wrote hamlet"], padding=True,
                return_tensors="pt")
    n_prompt = batch["input_ids"].shape[1]
    out = model.generate(**batch, max_new_tokens=8, do_sample=False, min_new_tokens=2,
                         stopping_criteria=StoppingCriteriaList([StopFirstAfter(n_prompt, 2)]))
    first = out[0, n_prompt:].tolist()
    assert len(first) > 3 and first[2:] == [tok.eos_token_id] * (len(first) - 2)
    # LM-Polygraph's GreedyProbsCalculator: the answer up to and with the first EOS
    cut = first[: first.index(tok.eos_token_id) + 1]
    assert tok.pad_token_id not in cut and len(cut) == 3
