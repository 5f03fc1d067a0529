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
"""

from __future__ import annotations

from ._version import __version__
from .covariance import Dense, Diagonal, Identity, build_covariance, curvature
from .errors import IsouqError
from .estimators import score_classifier, score_regressor
from .ghost.engine import GhostNorms
from .params import select_params
from .scores import ParamInfo, Scores, SequenceScores
from .sequences import score_sequences

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
    """``isouq.Calibrator`` is imported on first use (it needs scikit-learn: the report extra)."""
    if name == "Calibrator":
        from .calibration import Calibrator

        return Calibrator
    raise AttributeError(f"module 'isouq' has no attribute {name!r}")
