"""isouq's scores as an LM-Polygraph plugin: a stat calculator and four estimators.

Install with ``pip install 'isouq[polygraph]'`` (LM-Polygraph 0.7). For every greedy generation
LM-Polygraph makes, the plugin computes isouq's scores of the generated tokens given the
prompt, every answer of a batch from one backward pass (ghost norms, gradients on, whatever
LM-Polygraph's own calculators do under ``torch.no_grad``):

==============================  ===========================================  ==============
estimator (``str``)             score (higher = more uncertain)              stat
==============================  ===========================================  ==============
``IsouqEpistemic``              ‖∇θ p̄‖², p̄ = mean token probability          isouq_epistemic
``IsouqEpistemicLog``           ‖∇θ log p̄‖² = ‖∇θ p̄‖² / p̄²                  isouq_epistemic_log
``IsouqAleatoric``              (1/T) Σₜ pₜ(1 − pₜ)                           isouq_aleatoric
``IsouqNormalizedEpistemic``    ‖∇θ p̄‖² / ‖θ*‖²                               isouq_normalized_epistemic
==============================  ===========================================  ==============

The scored tokens are exactly LM-Polygraph's ``greedy_tokens`` (the end-of-sequence token
included when generated, as its own ``greedy_log_likelihoods`` are), after the prompt tokens
LM-Polygraph's ``WhiteboxModel.tokenize`` fed the model: a plain prompt with the tokenizer's
special tokens, or with ``instruct`` the chat template with a generation prompt, which is how
isouq tokenizes a string prompt or chat messages, so the scores equal ``isouq score`` on the
(prompt, generated token ids) pairs (the plugin checks the prompt tokens agree).

From a ``polygraph_eval`` config (module paths; see ``configs/polygraph/``)::

    stat_calculators:
      - auto
      - name: IsouqScoresCalculator
        builder: isouq.integrations.polygraph
        cfg: {}
        stats: [isouq_epistemic, isouq_epistemic_log, isouq_aleatoric,
                isouq_normalized_epistemic, isouq_mean_prob, isouq_n_tokens, isouq_seconds]
        dependencies: [greedy_tokens]
    estimators:
      - name: isouq.integrations.polygraph
        cfg: {score: epistemic, calculator: true}

From Python (``estimate_uncertainty`` registers only LM-Polygraph's own calculators; an
estimator made with ``calculator=False``, the default, computes the scores itself on the first
call of a batch and leaves them in the batch's stats for the other isouq estimators)::

    from lm_polygraph.utils.estimate_uncertainty import estimate_uncertainty
    from isouq.integrations.polygraph import IsouqEpistemic
    estimate_uncertainty(model, IsouqEpistemic(), "Who wrote Hamlet?")

Without LM-Polygraph installed this module still imports (its isouq side,
:func:`score_generations`, needs only ``isouq[llm]``); asking for a class, ``load_estimator``
or ``load_stat_calculator`` raises :class:`~isouq.errors.MissingExtraError` with the
``pip install`` line. A model isouq cannot score (vLLM, an API model, a sequence-to-sequence
or vision model) is refused in one line saying why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError, ModelError, require
from ..sequences import encode, score_sequences

EXTRA = "polygraph"
WHAT = "isouq's LM-Polygraph plugin (isouq.integrations.polygraph)"
#: score key → estimator class name
ESTIMATORS = {
    "epistemic": "IsouqEpistemic",
    "epistemic_log": "IsouqEpistemicLog",
    "aleatoric": "IsouqAleatoric",
    "normalized_epistemic": "IsouqNormalizedEpistemic",
}
SCORES = tuple(ESTIMATORS)
CALCULATOR = "IsouqScoresCalculator"
#: the stats the calculator writes (one value per answer each)
STATS = tuple(f"isouq_{k}" for k in (*SCORES, "mean_prob", "n_tokens", "seconds"))


# --------------------------------------------------------------------------- isouq side
def lm_polygraph_prompts(input_texts: Sequence, instruct: bool) -> list:
    """isouq prompts that tokenize as LM-Polygraph's ``WhiteboxModel.tokenize`` tokenizes its
    inputs: with ``instruct``, chat messages (a string becomes one user turn), rendered with the
    chat template and a generation prompt, no special tokens added; otherwise the text itself,
    with the tokenizer's special tokens."""
    out = []
    for i, t in enumerate(input_texts):
        if instruct:
            out.append([{"role": "user", "content": t}] if isinstance(t, str) else list(t))
        elif isinstance(t, str):
            out.append(t)
        else:
            raise InputError(f"input {i} is {type(t).__name__}, not text; chat messages need an "
                             "instruct model (WhiteboxModel(..., instruct=True))")
    return out


def score_generations(model: torch.nn.Module, tokenizer, input_texts: Sequence,
                      greedy_tokens: Sequence[Sequence[int]], *, instruct: bool = False,
                      prompt_ids: Sequence[Sequence[int]] | None = None,
                      batch_size: int | None = None) -> dict[str, np.ndarray]:
    """isouq's scores of LM-Polygraph generations: (input text, greedy token ids) pairs in,
    ``{"epistemic", "epistemic_log", "aleatoric", "normalized_epistemic", "mean_prob",
    "n_tokens", "seconds"}`` out, one value per answer (``seconds``: the batch's wall time
    shared equally).

    ``model``/``tokenizer``: the Hugging Face causal LM and tokenizer. ``instruct``: the inputs
    were rendered with the chat template (LM-Polygraph's ``instruct``). ``prompt_ids``: the
    unpadded prompt token ids LM-Polygraph fed the model; when given, isouq's tokenization of
    each prompt must equal them (else :class:`ModelError`). ``batch_size``: answers per
    backward pass (default: all of them, one backward)."""
    if torch.is_inference_mode_enabled():
        raise ModelError("isouq's LM-Polygraph estimators need gradients, and they were called "
                         "inside torch.inference_mode(); call them outside it")
    prompts = lm_polygraph_prompts(input_texts, instruct)
    answers = [[int(t) for t in toks] for toks in greedy_tokens]
    if len(answers) != len(prompts):
        raise InputError(f"got {len(prompts)} inputs but {len(answers)} generations")
    if prompt_ids is not None:
        enc = encode(tokenizer, prompts, answers)
        for i, (e, ids) in enumerate(zip(enc, prompt_ids, strict=True)):
            if e.prompt != [int(t) for t in ids]:
                raise ModelError(
                    f"input {i}: isouq tokenizes the prompt into {len(e.prompt)} tokens but "
                    f"LM-Polygraph fed {len(ids)} (instruct={instruct}); the scores would not be "
                    "those of the generated answer: use a tokenizer whose special tokens "
                    "LM-Polygraph and isouq add alike")
    t0 = time.perf_counter()
    s = score_sequences(model, tokenizer, prompts, answers,
                        batch_size=batch_size or max(len(answers), 1))
    sec = (time.perf_counter() - t0) / max(len(answers), 1)
    return {"epistemic": s.epistemic.double().numpy(),
            "epistemic_log": s.epistemic_log.double().numpy(),
            "aleatoric": s.aleatoric.double().numpy(),
            "normalized_epistemic": s.normalized_epistemic.double().numpy(),
            "mean_prob": s.mean_prob.double().numpy(),
            "n_tokens": s.n_tokens.numpy(),
            "seconds": np.full(len(answers), sec)}


def unwrap(model) -> tuple[torch.nn.Module, object, bool]:
    """(Hugging Face model, tokenizer, instruct) of an LM-Polygraph model; a model isouq cannot
    score raises :class:`ModelError` in one line saying why."""
    name = type(model).__name__
    kind = getattr(model, "model_type", None)
    if kind == "vLLMCausalLM" or "vllm" in name.lower():
        raise ModelError(
            f"isouq cannot score a {name}: vLLM runs the model without autograd, and isouq's "
            "estimators need gradients through its weights; load the model as "
            "lm_polygraph.WhiteboxModel (Hugging Face transformers) instead")
    hf = getattr(model, "model", None)
    if not isinstance(hf, torch.nn.Module):
        raise ModelError(
            f"isouq cannot score a {name} ({kind or 'no model type'}): it exposes no PyTorch "
            "weights to differentiate (an API or black-box model); use lm_polygraph.WhiteboxModel")
    if "visual" in name.lower() or kind not in (None, "CausalLM"):
        raise ModelError(
            f"isouq cannot score a {name} of type {kind!r}: isouq's sequence scores are defined "
            "for decoder-only causal LMs (model_type 'CausalLM')")
    tok = getattr(model, "tokenizer", None)
    if tok is None or not callable(tok):
        raise ModelError(f"isouq cannot score a {name} without a Hugging Face tokenizer")
    return hf, tok, bool(getattr(model, "instruct", False))


def lm_polygraph_prompt_ids(model, input_texts: Sequence) -> list[list[int]]:
    """The prompt token ids LM-Polygraph's ``model.tokenize`` gives, padding removed."""
    batch = model.tokenize(list(input_texts))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def polygraph_stats(model, input_texts: Sequence, greedy_tokens: Sequence,
                    batch_size: int | None = None) -> dict[str, np.ndarray]:
    """The calculator's stats (``isouq_*``) for one LM-Polygraph batch."""
    hf, tok, instruct = unwrap(model)
    scores = score_generations(hf, tok, input_texts, greedy_tokens, instruct=instruct,
                               prompt_ids=lm_polygraph_prompt_ids(model, input_texts),
                               batch_size=batch_size)
    return {f"isouq_{k}": v for k, v in scores.items()}


# --------------------------------------------------------------------------- LM-Polygraph side
_BUILT: dict[str, type] = {}


def _classes() -> dict[str, type]:
    if _BUILT:
        return _BUILT
    require("lm_polygraph", extra=EXTRA, what=WHAT)
    from lm_polygraph.estimators.estimator import Estimator
    from lm_polygraph.stat_calculators.stat_calculator import StatCalculator

    class IsouqScoresCalculator(StatCalculator):
        """isouq's scores of the greedy generations: every answer of the batch from one
        backward pass (``batch_size``: answers per backward; default the whole batch)."""

        @staticmethod
        def meta_info():
            return list(STATS), ["greedy_tokens"]

        def __init__(self, batch_size: int | None = None):
            super().__init__()
            self.batch_size = batch_size

        def __call__(self, dependencies, texts, model, max_new_tokens: int = 100, **kwargs):
            return polygraph_stats(model, texts, dependencies["greedy_tokens"], self.batch_size)

        def __repr__(self):
            return CALCULATOR

    class IsouqEstimator(Estimator):
        """Base of isouq's estimators. ``calculator``: read the scores from
        IsouqScoresCalculator's stats (it must be registered, as in a polygraph_eval config);
        False (default): compute them on the first call of a batch from the batch's model,
        inputs and greedy tokens, and leave them in its stats for the other isouq estimators."""

        score = ""

        def __init__(self, calculator: bool = False, batch_size: int | None = None):
            deps = [f"isouq_{self.score}"] if calculator else ["greedy_tokens"]
            super().__init__(deps, "sequence")
            self.calculator, self.batch_size = bool(calculator), batch_size

        def __str__(self):
            return type(self).__name__

        def __call__(self, stats: Mapping) -> np.ndarray:
            key = f"isouq_{self.score}"
            if key not in stats:
                for k in ("model", "input_texts", "greedy_tokens"):
                    if k not in stats:
                        raise InputError(f"{self}: the batch's stats have no {k!r}; run it "
                                         "through LM-Polygraph's UEManager")
                stats.update(polygraph_stats(stats["model"], stats["input_texts"],
                                             stats["greedy_tokens"], self.batch_size))
            return np.asarray(stats[key], dtype=float)

    built = {CALCULATOR: IsouqScoresCalculator, "IsouqEstimator": IsouqEstimator}
    for score, cls_name in ESTIMATORS.items():
        built[cls_name] = type(cls_name, (IsouqEstimator,), {
            "score": score, "__doc__": f"isouq's {score} score of the greedy answer."})
    for cls_name, cls in built.items():  # picklable, importable by name
        cls.__module__, cls.__qualname__ = __name__, cls_name
        globals()[cls_name] = cls
    _BUILT.update(built)
    return _BUILT


def __getattr__(name: str):
    if name in (CALCULATOR, "IsouqEstimator", *ESTIMATORS.values()):
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plain(config) -> dict:
    """A dict of a polygraph_eval ``cfg`` (an OmegaConf DictConfig) or a mapping."""
    return {} if config is None else {k: config[k] for k in config}


def load_estimator(config=None):
    """LM-Polygraph's hook for an estimator named by module path (``FactoryEstimator``):
    ``cfg: {score: epistemic | epistemic_log | aleatoric | normalized_epistemic,
    calculator: bool, batch_size: int}``."""
    classes = _classes()
    cfg = _plain(config)
    score = cfg.pop("score", "epistemic")
    if score not in ESTIMATORS:
        raise InputError(f"score {score!r} is not one of isouq's estimators: "
                         f"{', '.join(ESTIMATORS)}")
    unknown = set(cfg) - {"calculator", "batch_size"}
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for isouq's estimator; "
                         "use score, calculator, batch_size")
    return classes[ESTIMATORS[score]](**cfg)


def load_stat_calculator(config=None, environment=None):
    """LM-Polygraph's hook for a stat calculator built by module path (``builder``):
    ``cfg: {batch_size: int}`` (answers per backward; default the whole batch)."""
    classes = _classes()
    cfg = _plain(config)
    cfg.pop("obj", None)
    unknown = set(cfg) - {"batch_size"}
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for {CALCULATOR}; use batch_size")
    return classes[CALCULATOR](**cfg)


def calculator_container(batch_size: int | None = None):
    """The calculator as LM-Polygraph's ``StatCalculatorContainer``, for a ``UEManager`` built
    in Python (``available_stat_calculators=register_default_stat_calculators(...) + [this]``)."""
    cls = _classes()[CALCULATOR]
    from lm_polygraph.utils.factory_stat_calculator import StatCalculatorContainer

    return StatCalculatorContainer(name=CALCULATOR, obj=cls, builder=__name__,
                                   cfg={"batch_size": batch_size}, stats=list(STATS),
                                   dependencies=["greedy_tokens"])
