"""polygraph_eval's model loading script (``model.path_to_load_script``): a local folder only.

The folders are isouq's embedded models exported by scripts/polygraph/export_models.py
(float32 weights, the tokenizer isouq scores with). Eager attention: LM-Polygraph's greedy
calculator asks for attention weights (RAUQ, AttentionScore), which PyTorch's SDPA kernels do
not return under transformers 5. Left padding for batched generation.

A finished answer of a batch is padded with the tokenizer's end-of-sequence token, the token at
which LM-Polygraph's greedy calculator cuts an answer. With the model's own pad token (Gemma 3:
``<pad>``, not its ``<eos>``), an answer stopped by a stop string kept its pads: its text read
"<pad>", and LM-Polygraph's estimators (MSP among them) scored the pads as answer tokens.
"""

from transformers import AutoModelForCausalLM, AutoTokenizer


def load_model(model_path: str, device_map: str = "cpu", attn_implementation: str = "eager"):
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, dtype="float32", device_map=device_map,
        attn_implementation=attn_implementation)
    model.generation_config.pad_token_id = load_tokenizer(model_path).eos_token_id
    return model.eval()


def load_tokenizer(model_path: str):
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
