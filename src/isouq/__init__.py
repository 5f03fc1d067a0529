"""isouq: uncertainty quantification from gradient norms.

Epistemic uncertainty = ‖∇θ p(y|x, θ*)‖² (first-order Taylor + isotropic covariance),
aleatoric = p(1 − p); for LLM answers p is the mean per-token probability p̄ and ‖∇θ p̄‖²
comes from one batched backward pass (ghost norms). See README.md and docs/.
"""

from __future__ import annotations

__version__ = "0.1.0"

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
