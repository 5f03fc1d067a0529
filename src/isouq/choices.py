"""The names the library's options accept, held apart from the code that acts on them.

The modules that act on these names import torch (``spans``, ``models``, ``llm.prompts``); the
``isouq`` command lists them as choices (and states the defaults) without importing
torch (``isouq --help`` starts in a fraction of a second). The same pattern as
``isouq.engines`` (``method=``) and ``isouq.param_sets`` (``params=``): names only, each tuple
equal to the one the acting module checks against (``tests/test_cli_start.py``).
"""

from __future__ import annotations

#: how an answer is cut into spans (``spans.SPLITTERS``: ``score_sequences(spans=...)``,
#: ``isouq score --spans``): its sentences, or its non-blank lines
SPAN_SPLITTERS: tuple[str, ...] = ("sentences", "lines")

#: accelerate's placements of a model over its devices (``models.options.DEVICE_MAPS``:
#: ``load_model(device_map=...)``)
DEVICE_MAPS: tuple[str, ...] = ("auto", "balanced", "balanced_low_0", "sequential")

#: bitsandbytes quantizations on load (``models.options.QUANTIZE``: ``load_model(quantize=)``)
QUANTIZE: tuple[str, ...] = ("4bit", "8bit")

#: how the LLM judge of correctness is asked (``llm.prompts.JUDGE_STYLES``): Farquhar et al.'s
#: prompt; the same with explicit rules for small judges; strict plus the dataset's known
#: incorrect answers (TruthfulQA), when the item has them
JUDGE_STYLES: tuple[str, ...] = ("farquhar2024", "strict", "contrast")
#: the judge prompt style unless one is named (measured against hand labels: README, QA study)
DEFAULT_JUDGE_PROMPT = "strict"
#: the judge of correctness and semantic entropy's entailment judge unless one is named
DEFAULT_JUDGE_MODEL = "qwen2.5-coder-1.5b"

#: what a learned P(correct) may read (``evaluation.features.FEATURES``: ``isouq calibrate
#: --features``): the answer's scores and its block profile
FEATURE_NAMES: tuple[str, ...] = ("mean_prob", "seq_logprob", "nll", "aleatoric", "epistemic",
                                  "epistemic_log", "normalized_epistemic", "blocks", "hidden")

#: parameter priors of the toy networks' reference posteriors (``models.toy.PRIORS``):
#: N(0, I/λ), or weights' variance 1/(λ·fan_in) and biases' 1/λ
TOY_PRIORS: tuple[str, ...] = ("isotropic", "fan_in")

__all__ = ["DEFAULT_JUDGE_MODEL", "DEFAULT_JUDGE_PROMPT", "DEVICE_MAPS", "FEATURE_NAMES",
           "JUDGE_STYLES", "QUANTIZE", "SPAN_SPLITTERS", "TOY_PRIORS"]
