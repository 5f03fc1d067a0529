"""Which optional extras a command needs, checked before it imports them: one line naming
``pip install 'isouq[EXTRA]'`` instead of an ImportError deep inside a run."""

from __future__ import annotations

from ..errors import require

#: What needs more than torch and numpy (the core), by the extra that installs it.
EXTRA_MODULES = {
    "llm": ("transformers", "safetensors", "gguf", "accelerate", "peft"),
    "quantize": ("bitsandbytes",),
    "report": ("scipy", "sklearn", "statsmodels", "matplotlib", "PIL", "threadpoolctl"),
    "reference": ("jax", "numpyro"),
    "serve": ("fastapi", "uvicorn", "prometheus_client", "pydantic"),
}


def require_extras(extras: str, what: str) -> None:
    """Raise MissingExtraError naming ``pip install 'isouq[EXTRAS]'`` if a module is missing.

    Args:
        extras: comma-separated extras, e.g. ``"llm,report"``.
        what: the command that needs them, e.g. ``"isouq qa run"``.
    """
    mods = [m for e in extras.split(",") for m in EXTRA_MODULES[e]]
    require(*mods, extra=extras, what=what)
