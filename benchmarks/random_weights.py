"""A causal LM with random weights from a saved config and tokenizer (benchmarks beside this).

For a GPU machine or any place the weights cannot travel: the same architecture costs the same
time and memory, and ghost norms are compared against the loop on the same weights, so timings
and exactness checks hold; the scores themselves mean nothing.
"""

from __future__ import annotations

from pathlib import Path


def random_model(config: str | Path, seed: int = 0, device: str = "cpu"):
    """(model in eval mode, tokenizer with a pad token, name, n_params) for the config and
    tokenizer files saved in folder ``config``, weights drawn by the config's initializer
    directly on ``device``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from isouq.models.info import count_params, ensure_pad_token

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config)).eval()
    tok = AutoTokenizer.from_pretrained(config)
    ensure_pad_token(tok, model)
    return model, tok, f"{Path(config).name} (random weights)", count_params(model)
