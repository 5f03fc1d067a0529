"""The named parameter sets a score may be taken over (``params="NAME"``, ``--params NAME``):
names and meanings only, so that the command line lists them without importing torch
(``params.py`` resolves them on a model)."""

#: set name -> what it holds
PARAM_SETS: dict[str, str] = {
    "all": "every weight as the model computes with it (the default): a quantized weight "
           "counts as its dequantized values, a PEFT model's base weights and its adapter",
    "trainable": "the parameters that require grad, what a plain backward differentiates "
                 "(a 4-bit bitsandbytes model: embeddings, norms and head; a PEFT model: the "
                 "adapter)",
    "adapter": "the weights of the PEFT adapters (LoRA's A and B)",
    "last-layer": "the parameters of the last module with parameters the forward pass calls",
}
DEFAULT_SET = "all"
