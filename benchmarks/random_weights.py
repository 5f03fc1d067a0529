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
