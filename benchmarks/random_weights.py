"""A causal LM with random weights from a saved config and tokenizer (benchmarks beside this).

For a GPU machine or any place the weights cannot travel: the same architecture costs the same
time and memory, and ghost norms are compared against the loop on the same weights, so timings
and exactness checks hold; the scores themselves mean nothing.
"""

from __future__ import annotations

from pathlib import Path


class FoldedTokenizer:
    """A tokenizer whose ids are folded into a smaller vocabulary (id mod ``vocab``).

    For a random-weight model whose own tokenizer cannot travel (Llama 2's 32,000 ids under
    SmolLM2's 49,152-id tokenizer): the token counts, hence the cost, are the tokenizer's; which
    ids the random model reads does not change its cost."""

    def __init__(self, inner, vocab: int):
        self._inner, self._vocab = inner, vocab

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name in ("pad_token_id", "eos_token_id", "bos_token_id") and value is not None:
            return value % self._vocab
        return value

    def __len__(self) -> int:
        return self._vocab

    def __call__(self, *args, **kwargs):
        out = self._inner(*args, **kwargs)
        ids = out["input_ids"]
        out["input_ids"] = ([[i % self._vocab for i in row] for row in ids]
                            if ids and isinstance(ids[0], list) else [i % self._vocab for i in ids])
        return out


def random_model(config: str | Path, seed: int = 0, device: str = "cpu",
                 dtype: str = "float32", tokenizer: str | Path | None = None):
    """(model in eval mode, tokenizer with a pad token, name, n_params) for the config saved in
    folder ``config`` and the tokenizer saved there (or in folder ``tokenizer``), weights drawn
    by the config's initializer directly on ``device`` in ``dtype``. A tokenizer with more ids
    than the config's vocabulary is folded into it (``FoldedTokenizer``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from isouq.models.info import count_params, ensure_pad_token

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(config)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    tok = AutoTokenizer.from_pretrained(tokenizer or config)
    ensure_pad_token(tok, model)
    if len(tok) > cfg.vocab_size:
        tok = FoldedTokenizer(tok, cfg.vocab_size)
    return model, tok, f"{Path(config).name} (random weights)", count_params(model)


def quantize_4bit(model, compute_dtype=None):
    """``model`` with every nn.Linear but the output head replaced by a bitsandbytes NF4
    ``Linear4bit`` holding the same weights (quantized when moved to a CUDA device), as
    ``load_model(quantize="4bit")`` loads a checkpoint; in place, returned."""
    import bitsandbytes as bnb
    import torch
    from torch import nn

    head = model.get_output_embeddings()
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, nn.Linear) and child is not head:
                dev, dt = child.weight.device, child.weight.dtype
                q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, quant_type="nf4",
                                      compute_dtype=compute_dtype or dt)
                q.weight = bnb.nn.Params4bit(child.weight.data.to("cpu"), requires_grad=False,
                                             quant_type="nf4")
                if child.bias is not None:
                    q.bias = nn.Parameter(child.bias.data.to("cpu"), requires_grad=False)
                setattr(mod, name, q.to(dev))
                del child
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return model


def main(argv=None) -> int:
    """Save a random-weight model of a config, with its tokenizer, as a checkpoint folder that
    ``isouq serve --model DIR`` (or any command) loads: the GPU check serves SmolLM2's
    architecture without carrying its weights."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="folder with config.json and a tokenizer")
    ap.add_argument("--save", required=True, help="the checkpoint folder to write")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    model, tok, name, n = random_model(a.config, seed=a.seed)
    if isinstance(tok, FoldedTokenizer):
        raise SystemExit(f"{a.config}: the tokenizer has more ids than the config's vocabulary; "
                         "a saved checkpoint would not load with it")
    model.save_pretrained(a.save)
    tok.save_pretrained(a.save)
    print(f"{name}: {n:,} parameters saved to {a.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
