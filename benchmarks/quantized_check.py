"""Exactness of the 4-bit ghost rule on a device: a small random Llama with its linear layers as
bitsandbytes NF4 (compute in float32), ghost over every weight against one autograd backward
per answer through a float32 twin holding the dequantized weights. Prints one JSON line.

    python benchmarks/quantized_check.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    import transformers as tf

    import isouq
    from isouq.quantized import dequantized
    from random_weights import quantize_4bit

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    model = tf.LlamaForCausalLM(cfg).eval().to(a.device)
    quantize_4bit(model, compute_dtype=torch.float32)
    twin = copy.deepcopy(model)
    import bitsandbytes as bnb

    for mod in list(twin.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                w = dequantized(child.weight)
                lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device)
                lin.weight = nn.Parameter(w)
                setattr(mod, name, lin)
    g = torch.Generator().manual_seed(1)
    answers = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (3, 7, 5, 9)]
    prompts = ["a b c", "d e", "f g h i", "j"]

    class Tok:  # ids as given: a prompt's characters' codes folded into the vocabulary
        pad_token_id, eos_token_id, bos_token, chat_template = 0, 1, None, None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [5 + ord(c) % 290 for c in text]}

    ghost = isouq.score_sequences(model, Tok(), prompts, answers, method="ghost")
    ref = isouq.score_sequences(twin, Tok(), prompts, answers, method="per_example")
    rel = ((ghost.epistemic - ref.epistemic).abs() / ref.epistemic).max().item()
    print(json.dumps({"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                      "max_rel_diff_ghost_4bit_vs_dequantized_twin_loop": rel,
                      "n_params": ghost.params.n_params, "set": ghost.params.set}))


if __name__ == "__main__":
    main()
