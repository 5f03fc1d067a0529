"""The independent floor: forward + activation-only backward of Σᵢ p̄ᵢ in plain Hugging Face
transformers and torch, through none of isouq's code.

The floor of ``benchmarks/floor.py`` calls isouq's own ``token_probs``: a slowdown there (or in
anything else ghost and that floor share) moves both alike and cannot show in ghost/floor.
This floor does the same work on the same batch without isouq: it tokenizes with the tokenizer
itself (a chat prompt through the tokenizer's chat template with the generation prompt, an
answer without special tokens), pads the batch on the right by hand, freezes every weight, runs
the model from its input embeddings made leaves that require grad (so autograd computes
activation gradients only), reads the logits from the first position that predicts an answer
token on (``logits_to_keep``), and takes each answer's mean token probability p̄ by hand. That
it computes the same p̄ as isouq (so it measures the same work) is checked in
``tests/test_benchmark_scripts.py``; ``benchmarks/score_sequences_ab.py`` also checks it on the
batch it times. It imports nothing from isouq and nothing from ``benchmarks/floor.py``.

Run alone (one process, what ``score_sequences_ab.py --mode processes`` starts per side and
round): the pairs from a JSON list of [prompt, answer] (a prompt: a string or chat messages);
prints one JSON line, seconds per answer of each timed call:

    python benchmarks/hf_floor.py --model-dir DIR --pairs pairs.json --batch 16 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class PaddedBatch:
    """Right-padded token ids (N, L), the attention mask (N, L) and the answer mask (N, L): true
    at each answer token (the position a logit one to its left predicts)."""

    input_ids: object
    attention_mask: object
    answer_mask: object


def pair_ids(tokenizer, prompt: str | Sequence[dict], answer: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of one pair, by the tokenizer alone: chat messages rendered by its
    chat template with the generation prompt (no special tokens added after), a string prompt
    with the tokenizer's special tokens unless it already starts with the BOS token; the answer
    without special tokens."""
    if isinstance(prompt, str):
        bos = tokenizer.bos_token
        add = not (bos and prompt.startswith(bos))
        ids = tokenizer(prompt, add_special_tokens=add)["input_ids"]
    else:
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids), list(tokenizer(answer, add_special_tokens=False)["input_ids"])


def padded_batch(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> PaddedBatch:
    """The pairs as one batch, padded on the right to the longest prompt + answer."""
    import torch

    L = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), L), pad_id, dtype=torch.long)
    att = torch.zeros((len(pairs), L), dtype=torch.long)
    ans = torch.zeros((len(pairs), L), dtype=torch.bool)
    for i, (p, a) in enumerate(pairs):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        att[i, :len(p) + len(a)] = 1
        ans[i, len(p):len(p) + len(a)] = True
    return PaddedBatch(ids, att, ans)


def mean_answer_probs(model, batch: PaddedBatch, activations_only: bool = False):
    """p̄ (N,): each answer's mean probability of its tokens, from one forward pass. With
    ``activations_only`` the input embeddings enter as leaves that require grad (with the
    weights frozen, a backward then computes activation gradients only)."""
    import torch

    ids, L = batch.input_ids, batch.input_ids.shape[1]
    # the first position whose logit predicts an answer token, in any row
    first = int(batch.answer_mask.any(0).nonzero()[0]) - 1
    x = model.get_input_embeddings()(ids)
    if activations_only:
        x = x.detach().requires_grad_(True)
    try:
        out = model(inputs_embeds=x, attention_mask=batch.attention_mask,
                    logits_to_keep=L - first)
    except TypeError:  # a model without logits_to_keep: every position's logits
        out = model(inputs_embeds=x, attention_mask=batch.attention_mask)
    logits = out.logits[:, -(L - first):]  # positions first .. L−1
    targets = batch.answer_mask[:, first + 1:]  # the tokens positions first .. L−2 predict
    rows, cols = targets.nonzero(as_tuple=True)
    chosen = logits[:, :-1][rows, cols].float()  # (answer tokens, V)
    token = ids[:, first + 1:][rows, cols]
    p = torch.log_softmax(chosen, dim=-1).gather(1, token[:, None])[:, 0].exp()
    total = torch.zeros(ids.shape[0], dtype=p.dtype).index_add(0, rows, p)
    return total / targets.sum(1)


@contextmanager
def weights_frozen(model):
    """Within it every parameter of ``model`` has ``requires_grad=False``; restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id, else 0 (padded positions are masked)."""
    for v in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(v, int):
            return v
    return 0


def hf_floor(model, tokenizer, prompts: Sequence, answers: Sequence[str]
             ) -> tuple[Callable[[], None], PaddedBatch]:
    """(f, the padded batch): f runs the independent floor once on the whole batch of
    (prompt, answer) pairs, encoded once, here."""
    batch = padded_batch([pair_ids(tokenizer, p, a) for p, a in zip(prompts, answers,
                                                                      strict=True)],
                         pad_token_id(tokenizer))

    def floor() -> None:
        with weights_frozen(model):
            mean_answer_probs(model, batch, activations_only=True).sum().backward()

    return floor, batch


def load(model_dir: str | Path):
    """(model in eval mode, float32, tokenizer) of a saved model folder, by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True, help="a saved model folder (transformers)")
    ap.add_argument("--pairs", required=True, help="JSON list of [prompt, answer]")
    ap.add_argument("--batch", type=int, required=True, help="the first BATCH pairs, one batch")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    model, tok = load(a.model_dir)
    pairs = json.loads(Path(a.pairs).read_text())[:a.batch]
    fn, b = hf_floor(model, tok, [p for p, _ in pairs], [ans for _, ans in pairs])
    for _ in range(a.warmups):
        fn()
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) / a.batch)
    with torch.no_grad():
        p_bar = mean_answer_probs(model, b)
    print(json.dumps({"batch": a.batch, "tokens_padded": int(b.input_ids.shape[1]),
                      "seconds_per_answer": statistics.median(times), "times": times,
                      "p_bar": p_bar.tolist()}))


if __name__ == "__main__":
    main()
