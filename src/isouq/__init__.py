"""isouq: uncertainty quantification from gradient norms.

For a model at its trained weights θ* and a prediction p (a class probability, a regression
output, or the mean token probability p̄ of an LLM answer):

- epistemic uncertainty = ‖∇θ p‖² (a first-order Taylor expansion of p around θ* with an
  isotropic weight covariance; gᵀCg with a Laplace or diagonal covariance C), in squared units
  of p;
- aleatoric uncertainty = p(1 − p) (for an answer, the mean of pₜ(1 − pₜ) over its tokens).

The public API, all importable from ``isouq``:

- ``score_classifier(model, x)``: (N, C) scores of any PyTorch classifier;
- ``score_regressor(model, x)``: (N,) scores of a scalar regressor;
- ``score_sequences(model, tokenizer, prompts, answers)``: (N,) scores of LLM answers, every
  answer of a batch in one backward pass;
- ``GhostNorms``: ‖∇θ sᵢ‖² of any per-example scalar sᵢ in one backward pass;
- ``Scores``, ``SequenceScores``, ``ParamInfo``: the results;
- ``Identity``, ``Diagonal``, ``Dense``, ``build_covariance``, ``curvature``: covariances;
- ``select_params``: which parameters take part;
- ``Calibrator``: P(correct) from the scores (needs the ``report`` extra);
- ``IsouqError``: the base class of every error a user can fix.

The core needs only torch and numpy; ``isouq.models.load_model`` needs the ``llm`` extra.
Each name is imported on first use, so ``import isouq.cli`` (the ``isouq`` command) loads no
torch until a command needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from .calibration import Calibrator
    from .covariance import Dense, Diagonal, Identity, build_covariance, curvature
    from .errors import IsouqError
    from .estimators import score_classifier, score_regressor
    from .ghost.engine import GhostNorms
    from .params import select_params
    from .scores import ParamInfo, Scores, SequenceScores
    from .sequences import score_sequences

#: public name -> the module that defines it (imported on first use: PEP 562)
_HOMES: dict[str, str] = {
    "Calibrator": "calibration",  # needs scikit-learn: the report extra
    "Dense": "covariance",
    "Diagonal": "covariance",
    "GhostNorms": "ghost.engine",
    "Identity": "covariance",
    "IsouqError": "errors",
    "ParamInfo": "scores",
    "Scores": "scores",
    "SequenceScores": "scores",
    "build_covariance": "covariance",
    "curvature": "covariance",
    "score_classifier": "estimators",
    "score_regressor": "estimators",
    "score_sequences": "sequences",
    "select_params": "params",
}

__all__ = [
    "Calibrator",
    "Dense",
    "Diagonal",
    "GhostNorms",
    "Identity",
    "IsouqError",
    "ParamInfo",
    "Scores",
    "SequenceScores",
    "__version__",
    "build_covariance",
    "curvature",
    "score_classifier",
    "score_regressor",
    "score_sequences",
    "select_params",
]


def __getattr__(name: str):
    """A public name, imported from its module on first use; ``isouq.X`` for a submodule X
    imports it as ``import isouq.X`` would."""
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'isouq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
