"""How a score's gradients are computed: one vocabulary for ``score_classifier``,
``score_regressor`` and ``score_sequences`` (their ``method=`` argument).

The older names stay accepted: ``"functorch"`` (classifiers, regressors) and ``"loop"`` (LLM
answers) both mean ``"per_example"``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import InputError

#: engine name -> what it does
ENGINES: dict[str, str] = {
    "auto": "ghost where it applies (identity covariance, every layer with a rule), else "
            "per_example",
    "ghost": "every example's ‖g‖² from one backward pass per batch (exact ghost norms; the "
             "identity covariance)",
    "per_example": "every example's gradient materialized, any covariance (classifiers and "
                   "regressors: torch.func per-example Jacobians; LLM answers: one backward "
                   "per answer, the paper's way)",
    "per_token": "LLM answers: one backward per answer token position (the paper's per-token "
                 "comparison)",
    "forward": "LLM answers: the forward pass only (p̄, the sequence log-probability, the "
               "aleatoric score, hidden states; no gradient score): what a calibration that "
               "reads no gradient needs",
}
#: older names, accepted for the engine they name
ALIASES: dict[str, str] = {"functorch": "per_example", "loop": "per_example"}


def engine_name(method: str, among: Iterable[str]) -> str:
    """The engine ``method`` names (an alias resolved), if it is one of ``among``.

    Raises:
        InputError: naming the engines ``among`` holds.
    """
    among = tuple(among)
    name = ALIASES.get(method, method) if isinstance(method, str) else method
    if name not in among:
        raise InputError(f"method={method!r} is not one of {', '.join(repr(m) for m in among)}"
                         f" (older names: {', '.join(f'{k!r} = {v!r}' for k, v in ALIASES.items())})")
    return name
