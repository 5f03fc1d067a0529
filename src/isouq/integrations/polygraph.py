"""isouq's scores as an LM-Polygraph plugin: a stat calculator, four estimators and a learned
P(correct).

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

With ``blocks`` the calculator also writes ``isouq_blocks`` (N, B), each answer's block profile
‖∇θ_b p̄‖² (``isouq.blocks``), and ``isouq_block_names``; ``IsouqPCorrect`` reads a calibration
of ``isouq calibrate`` (``cfg: {calibration: FILE}``) and gives 1 − P(correct).

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

The LM-Polygraph classes are plain subclasses of its ``StatCalculator`` and ``Estimator``
(``isouq.integrations.polygraph_classes``), imported on first use: without LM-Polygraph
installed this module still imports (its isouq side, :func:`score_generations`, needs only
``isouq[llm]``); asking for a class, ``load_estimator`` or ``load_stat_calculator`` raises
:class:`~isouq.errors.MissingExtraError` with the ``pip install`` line. A model isouq cannot
score (vLLM, an API model, a sequence-to-sequence or vision model) is refused in one line
saying why.
"""

from __future__ import annotations

from ..errors import InputError, require
from .polygraph_stats import (
    BLOCK_STATS,
    CALCULATOR,
    ESTIMATORS,
    EXTRA,
    METHOD_STAT,
    P_CORRECT,
    STATS,
    WHAT,
    lm_polygraph_prompt_ids,
    lm_polygraph_prompts,
    polygraph_stats,
    score_generations,
    stats_rows,
    unwrap,
)

__all__ = ["BLOCK_STATS", "CALCULATOR", "ESTIMATORS", "EXTRA", "METHOD_STAT", "P_CORRECT",
           "STATS", "WHAT",
           "calculator_container", "lm_polygraph_prompt_ids", "lm_polygraph_prompts",
           "load_estimator", "load_stat_calculator", "polygraph_stats", "score_generations",
           "stats_rows", "unwrap"]


# --------------------------------------------------------------------------- LM-Polygraph side
def _classes():
    """The plugin's LM-Polygraph classes (``polygraph_classes``, imported on first use)."""
    require("lm_polygraph", extra=EXTRA, what=WHAT)
    from . import polygraph_classes

    return polygraph_classes


def __getattr__(name: str):
    if name in (CALCULATOR, "IsouqEstimator", P_CORRECT, *ESTIMATORS.values()):
        return getattr(_classes(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plain(config) -> dict:
    """A dict of a polygraph_eval ``cfg`` (an OmegaConf DictConfig) or a mapping."""
    return {} if config is None else {k: config[k] for k in config}


def load_estimator(config=None):
    """LM-Polygraph's hook for an estimator named by module path (``FactoryEstimator``):
    ``cfg: {score: epistemic | epistemic_log | aleatoric | normalized_epistemic | p_correct,
    calculator: bool, batch_size: int, calibration: FILE (p_correct only)}``."""
    classes = _classes()
    cfg = _plain(config)
    score = cfg.pop("score", "epistemic")
    if score == "p_correct":
        unknown = set(cfg) - {"calculator", "batch_size", "calibration"}
        if unknown or "calibration" not in cfg:
            raise InputError(f"isouq's p_correct estimator takes calibration (a FILE of isouq "
                             f"calibrate), calculator and batch_size; got {sorted(cfg)}")
        return getattr(classes, P_CORRECT)(**cfg)
    if score not in ESTIMATORS:
        raise InputError(f"score {score!r} is not one of isouq's estimators: "
                         f"{', '.join([*ESTIMATORS, 'p_correct'])}")
    unknown = set(cfg) - {"calculator", "batch_size"}
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for isouq's estimator; "
                         "use score, calculator, batch_size")
    return getattr(classes, ESTIMATORS[score])(**cfg)


def load_stat_calculator(config=None, environment=None):
    """LM-Polygraph's hook for a stat calculator built by module path (``builder``):
    ``cfg: {batch_size: int, blocks: bool, hidden: bool}`` (answers per backward, default the
    whole batch; also the block profiles, ``isouq_blocks``; also the answers' mean hidden
    states, ``isouq_hidden``)."""
    classes = _classes()
    cfg = _plain(config)
    cfg.pop("obj", None)
    unknown = set(cfg) - {"batch_size", "blocks", "hidden"}
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for {CALCULATOR}; use "
                         "batch_size, blocks, hidden")
    return getattr(classes, CALCULATOR)(**cfg)


def calculator_container(batch_size: int | None = None, blocks: bool = False):
    """The calculator as LM-Polygraph's ``StatCalculatorContainer``, for a ``UEManager`` built
    in Python (``available_stat_calculators=register_default_stat_calculators(...) + [this]``)."""
    cls = getattr(_classes(), CALCULATOR)
    from lm_polygraph.utils.factory_stat_calculator import StatCalculatorContainer

    return StatCalculatorContainer(name=CALCULATOR, obj=cls, builder=__name__,
                                   cfg={"batch_size": batch_size, "blocks": blocks},
                                   stats=list(STATS) + (list(BLOCK_STATS) if blocks else []),
                                   dependencies=["greedy_tokens"])
