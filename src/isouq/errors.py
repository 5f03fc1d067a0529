"""Errors a user can cause. Each message names the problem and the fix.

Everything isouq raises for bad input derives from :class:`IsouqError`, so callers (and the
CLI) can tell a user mistake from a bug. The CLI prints these as one clean line, no traceback.
"""

from __future__ import annotations


class IsouqError(Exception):
    """Base class: a problem the user can fix; the message says what and how."""


class InputError(IsouqError, ValueError):
    """Inputs of the wrong shape, type, or content (empty answers, NaN data, ...)."""


class ModelError(IsouqError, ValueError):
    """The model cannot be scored as given (no trainable parameters, NaN/inf outputs, ...)."""


class CovarianceError(IsouqError, ValueError):
    """A covariance cannot be built (no proxy data, unknown kind, singular matrix, ...)."""


class MemoryBudgetError(IsouqError, MemoryError):
    """A request would need more memory than allowed; the message says how much and what to use."""


class CaptureRefused(IsouqError, ValueError):
    """Graph capture (``compile=True``) is not offered: the message names the check that failed
    (``isouq.capture``), what it found, and the fix (score without it)."""


class DataError(IsouqError, ValueError):
    """A dataset or results file is missing, malformed, or has the wrong columns."""


def check_finite(x, what: str, fix: str) -> None:
    """Raise ModelError if tensor/array ``x`` holds NaN or inf. ``what`` names it, ``fix`` helps."""
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ModelError(f"{what} contains {n_bad} NaN/inf value(s). {fix}")


class MissingExtraError(IsouqError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(*modules: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` unless every module in ``modules`` can be imported.

    Checks only that each module is installed (``importlib.util.find_spec``); nothing is imported.

    Args:
        *modules: top-level import names, e.g. ``"transformers"``, ``"matplotlib"``.
        extra: the isouq extra(s) that install them, e.g. ``"llm"`` or ``"reference,report"``.
        what: what needs them, for the message, e.g. ``"isouq ask"``.

    Raises:
        MissingExtraError: naming the missing modules and ``pip install 'isouq[EXTRA]'``.
    """
    from importlib.util import find_spec

    def absent(name: str) -> bool:
        try:
            return find_spec(name) is None
        except ImportError:  # a broken or blocked install counts as missing
            return True

    missing = [m for m in modules if absent(m)]
    if missing:
        one = len(missing) == 1
        raise MissingExtraError(
            f"{what} needs {', '.join(missing)}, which {'is' if one else 'are'} not installed; "
            f"install {'it' if one else 'them'} with: pip install 'isouq[{extra}]'")
