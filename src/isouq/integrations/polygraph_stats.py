"""The isouq side of the LM-Polygraph plugin (``isouq.integrations.polygraph``): isouq's scores
of LM-Polygraph's generations, and the names of the stats the plugin writes. Needs only
``isouq[llm]``; LM-Polygraph's classes live in ``polygraph_classes``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError, ModelError
from ..methods import SCORES as SCORE_INFO
from ..scores import SequenceScores
from ..sequences import encode, score_sequences

EXTRA = "polygraph"
WHAT = "isouq's LM-Polygraph plugin (isouq.integrations.polygraph)"
#: score key → estimator class name: each uncertainty of ``SequenceScores.KEYS`` (p̄ and the
#: sequence log-probability are LM-Polygraph's own MSP family)
ESTIMATORS = {k: "Isouq" + "".join(w.capitalize() for w in k.split("_"))
              for k in SequenceScores.KEYS if SCORE_INFO[k].higher == "uncertain"}
#: the learned P(correct) estimator (a calibration of ``isouq calibrate``)
P_CORRECT = "IsouqPCorrect"
CALCULATOR = "IsouqScoresCalculator"
#: the stats the calculator writes (one value per answer each)
STATS = tuple(f"isouq_{k}" for k in (*SequenceScores.KEYS, "n_tokens", "seconds"))
#: what it adds with ``blocks``: (N, B) profiles and their block names
BLOCK_STATS = ("isouq_blocks", "isouq_block_names")
#: each answer's mean hidden states {state name: d floats}, what a calibration's probe reads
HIDDEN_STATS = ("isouq_hidden",)
#: which engine made the batch's stats: "ghost", or "forward" (no gradient score in them)
METHOD_STAT = "isouq_method"


# --------------------------------------------------------------------------- isouq side
def lm_polygraph_prompts(input_texts: Sequence, instruct: bool) -> list:
    """isouq prompts that tokenize as LM-Polygraph's ``WhiteboxModel.tokenize`` tokenizes its
    inputs: with ``instruct``, chat messages (a string becomes one user turn), rendered with the
    chat template and a generation prompt, no special tokens added; otherwise the text itself,
    with the tokenizer's special tokens."""
    out = []
    for i, t in enumerate(input_texts):
        if instruct:
            out.append([{"role": "user", "content": t}] if isinstance(t, str) else list(t))
        elif isinstance(t, str):
            out.append(t)
        else:
            raise InputError(f"input {i} is {type(t).__name__}, not text; chat messages need an "
                             "instruct model (WhiteboxModel(..., instruct=True))")
    return out


def without_padding(answers: Sequence[Sequence[int]], tokenizer) -> list[list[int]]:
    """Each generation's token ids without the pad tokens that a batched generation appends
    after an answer that stopped at a stop string (Gemma: ``" 41\\n<pad><pad>…"``).

    Args:
        answers: token ids per generation.
        tokenizer: the model's tokenizer; its ``pad_token_id`` is removed from the end of each
            answer unless it is also an end-of-sequence token (then it may end an answer).

    Returns:
        the answers, trailing pad tokens removed.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    if pad is None or pad in (eos if isinstance(eos, (list, tuple)) else [eos]):
        return [list(a) for a in answers]
    out = []
    for a in answers:
        end = len(a)
        while end > 1 and a[end - 1] == pad:   # an answer keeps its first token
            end -= 1
        out.append(list(a[:end]))
    return out


def score_generations(model: torch.nn.Module, tokenizer, input_texts: Sequence,
                      greedy_tokens: Sequence[Sequence[int]], *, instruct: bool = False,
                      prompt_ids: Sequence[Sequence[int]] | None = None,
                      batch_size: int | None = None, blocks: bool = False,
                      hidden: bool = False, method: str = "ghost") -> dict[str, np.ndarray]:
    """isouq's scores of LM-Polygraph generations: (input text, greedy token ids) pairs in,
    the scores of ``SequenceScores.KEYS`` with ``"n_tokens"`` and ``"seconds"`` out, one value
    per answer (``seconds``: the batch's wall time shared equally); with ``blocks`` also
    ``"blocks"`` (N, B) and ``"block_names"`` (B,); with ``hidden`` also ``"hidden"`` (N,) of
    {state name: d floats} (``score_sequences(hidden=True)``).

    ``model``/``tokenizer``: the Hugging Face causal LM and tokenizer. ``instruct``: the inputs
    were rendered with the chat template (LM-Polygraph's ``instruct``). ``prompt_ids``: the
    unpadded prompt token ids LM-Polygraph fed the model; when given, isouq's tokenization of
    each prompt must equal them (else :class:`ModelError`). ``batch_size``: answers per
    backward pass (default: all of them, one backward). ``blocks``: also each answer's block
    profile (``score_sequences(blocks=True)``), from the same backward. ``method``:
    ``"forward"`` computes no gradient score (NaN): what a calibration that reads none needs."""
    if torch.is_inference_mode_enabled() and method != "forward":
        raise ModelError("isouq's LM-Polygraph estimators need gradients, and they were called "
                         "inside torch.inference_mode(); call them outside it")
    prompts = lm_polygraph_prompts(input_texts, instruct)
    answers = without_padding([[int(t) for t in toks] for toks in greedy_tokens], tokenizer)
    if len(answers) != len(prompts):
        raise InputError(f"got {len(prompts)} inputs but {len(answers)} generations")
    if prompt_ids is not None:
        enc = encode(tokenizer, prompts, answers)
        for i, (e, ids) in enumerate(zip(enc, prompt_ids, strict=True)):
            if e.prompt != [int(t) for t in ids]:
                raise ModelError(
                    f"input {i}: isouq tokenizes the prompt into {len(e.prompt)} tokens but "
                    f"LM-Polygraph fed {len(ids)} (instruct={instruct}); the scores would not be "
                    "those of the generated answer: use a tokenizer whose special tokens "
                    "LM-Polygraph and isouq add alike")
    t0 = time.perf_counter()
    s = score_sequences(model, tokenizer, prompts, answers,
                        batch_size=batch_size or max(len(answers), 1), blocks=blocks,
                        hidden=hidden, method=method)
    sec = (time.perf_counter() - t0) / max(len(answers), 1)
    out = {k: getattr(s, k).double().numpy() for k in SequenceScores.KEYS}
    out |= {"n_tokens": s.n_tokens.numpy(), "seconds": np.full(len(answers), sec)}
    if blocks:
        out |= {"blocks": s.blocks.double().numpy(),
                "block_names": np.array([list(s.block_names)] * len(answers), dtype=object)}
    if hidden:
        out["hidden"] = np.array([s.row_hidden(i) for i in range(len(answers))], dtype=object)
    return out


def unwrap(model) -> tuple[torch.nn.Module, object, bool]:
    """(Hugging Face model, tokenizer, instruct) of an LM-Polygraph model; a model isouq cannot
    score raises :class:`ModelError` in one line saying why."""
    name = type(model).__name__
    kind = getattr(model, "model_type", None)
    if kind == "vLLMCausalLM" or "vllm" in name.lower():
        raise ModelError(
            f"isouq cannot score a {name}: vLLM runs the model without autograd, and isouq's "
            "estimators need gradients through its weights; load the model as "
            "lm_polygraph.WhiteboxModel (Hugging Face transformers) instead")
    hf = getattr(model, "model", None)
    if not isinstance(hf, torch.nn.Module):
        raise ModelError(
            f"isouq cannot score a {name} ({kind or 'no model type'}): it exposes no PyTorch "
            "weights to differentiate (an API or black-box model); use lm_polygraph.WhiteboxModel")
    if "visual" in name.lower() or kind not in (None, "CausalLM"):
        raise ModelError(
            f"isouq cannot score a {name} of type {kind!r}: isouq's sequence scores are defined "
            "for decoder-only causal LMs (model_type 'CausalLM')")
    tok = getattr(model, "tokenizer", None)
    if tok is None or not callable(tok):
        raise ModelError(f"isouq cannot score a {name} without a Hugging Face tokenizer")
    return hf, tok, bool(getattr(model, "instruct", False))


def lm_polygraph_prompt_ids(model, input_texts: Sequence) -> list[list[int]]:
    """The prompt token ids LM-Polygraph's ``model.tokenize`` gives, padding removed."""
    batch = model.tokenize(list(input_texts))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def polygraph_stats(model, input_texts: Sequence, greedy_tokens: Sequence,
                    batch_size: int | None = None, blocks: bool = False, hidden: bool = False,
                    method: str = "ghost") -> dict:
    """The calculator's stats (``isouq_*``) for one LM-Polygraph batch, and ``isouq_method``:
    ``"forward"`` when they hold no gradient score (``score_generations``)."""
    hf, tok, instruct = unwrap(model)
    scores = score_generations(hf, tok, input_texts, greedy_tokens, instruct=instruct,
                               prompt_ids=lm_polygraph_prompt_ids(model, input_texts),
                               batch_size=batch_size, blocks=blocks, hidden=hidden,
                               method=method)
    return {**{f"isouq_{k}": v for k, v in scores.items()}, METHOD_STAT: method}


def stats_rows(stats: Mapping, n: int) -> list[dict]:
    """The batch's isouq stats as answer rows (``scores``, and ``blocks`` or ``hidden`` when
    the stats hold the profiles or the hidden states), as a calibration reads them."""
    rows = [{"scores": {k: float(stats[f"isouq_{k}"][i]) for k in SequenceScores.KEYS
                        if f"isouq_{k}" in stats}} for i in range(n)]
    if "isouq_blocks" in stats:
        for i, r in enumerate(rows):
            r["blocks"] = dict(zip(stats["isouq_block_names"][i],
                                   map(float, stats["isouq_blocks"][i]), strict=True))
    if "isouq_hidden" in stats:
        for i, r in enumerate(rows):
            r["hidden"] = stats["isouq_hidden"][i]
    return rows
