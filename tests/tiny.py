"""Tiny random models and a word-level tokenizer built locally (no downloads) for tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

WORDS = (
    "the a cat dog sat on mat what is capital of france paris answer question yes no "
    "who wrote hamlet shakespeare moon made cheese rock blue sky why because user assistant"
).split()

CHAT_TEMPLATE = (
    "{% for m in messages %}[BOS] {{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def tokenizer(chat: bool = True) -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3}
    vocab |= {w: i + 4 for i, w in enumerate(WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
        eos_token="[EOS]",
    )
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


VOCAB = len(WORDS) + 4


def causal_lm(family: str, seed: int = 0):
    """A tiny random causal LM of the given family, in eval mode, float32."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if family in ("llama", "llama-tied"):
        cfg = tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             tie_word_embeddings=family == "llama-tied", **common)
        m = tf.LlamaForCausalLM(cfg)
    elif family == "gpt2":
        cfg = tf.GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, **common)
        m = tf.GPT2LMHeadModel(cfg)
    elif family == "gpt_neox":
        cfg = tf.GPTNeoXConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=64,
                               tie_word_embeddings=False, **common)
        m = tf.GPTNeoXForCausalLM(cfg)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             tie_word_embeddings=True, **common)
        m = tf.Qwen2ForCausalLM(cfg)
    elif family == "gemma3":
        cfg = tf.Gemma3TextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                  tie_word_embeddings=True, sliding_window=8, **common)
        m = tf.Gemma3ForCausalLM(cfg)
    elif family in MORE_FAMILIES:
        m = _more_family(tf, family, common)
    else:
        raise ValueError(family)
    # random (non-zero) norm weights so that their gradients are non-trivial
    with torch.no_grad():
        for _n, p in m.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


FAMILIES = ["llama", "llama-tied", "gpt2", "gpt_neox", "qwen2", "gemma3"]

MORE_FAMILIES = {
    # family: (config class, model class, config arguments beyond vocab/special tokens)
    "mistral": ("MistralConfig", "MistralForCausalLM", "decoder"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "decoder"),  # Phi-3 / Phi-4
    "phi": ("PhiConfig", "PhiForCausalLM", "decoder"),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", "decoder"),  # LayerNorm without weights
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "decoder"),  # q/k norms
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "decoder_head_dim"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "decoder_head_dim"),
    "cohere": ("CohereConfig", "CohereForCausalLM", "decoder"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", "decoder"),
    "granite": ("GraniteConfig", "GraniteForCausalLM", "decoder"),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"hidden_size": 16, "n_layer": 2, "n_head": 4}),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             {"n_embd": 16, "n_layer": 2, "n_head": 4, "rotary_dim": 2}),
    "opt": ("OPTConfig", "OPTForCausalLM",  # flattens (N, T, d) to (N·T, d) in its FFN
            {"hidden_size": 16, "ffn_dim": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "word_embed_proj_dim": 16}),
}
"""More Hugging Face causal-LM families (the paper's Phi-4 and OLMo among them), tiny."""


def _more_family(tf, family: str, common: dict):
    config_cls, model_cls, kw = MORE_FAMILIES[family]
    if isinstance(kw, str):
        kw = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              **({"head_dim": 4} if kw == "decoder_head_dim" else {})}
    return getattr(tf, model_cls)(getattr(tf, config_cls)(**kw, **common))


def absent_registry_model(monkeypatch, name: str = "absent") -> str:
    """Register (for one test) a registry model whose wheel is not installed; returns its name."""
    from dataclasses import replace

    from isouq.models import REGISTRY
    from isouq.models.registry import PartFile

    entry = replace(REGISTRY["smollm2"], name=name, gguf_sha256="4" * 64,
                    parts=(PartFile(f"isouq-{name}-dist", f"{name}/m.gguf", "4" * 64, 1),))
    monkeypatch.setitem(REGISTRY, name, entry)
    return name
