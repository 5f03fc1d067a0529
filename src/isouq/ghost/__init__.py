"""Ghost norms: exact per-example squared gradient norms from one backward pass.

``GhostNorms`` (engine.py) records layer calls; rules (one file per layer family, registered
with :func:`register_rule`) turn each call into per-example gradient contributions.
"""

# the built-in rules register themselves on import; the registry imports none of them
from . import (  # noqa: F401  (each registers its rules)
    attention,
    channel_norms,
    conv,
    conv1d,
    dora,
    embedding,
    linear,
    norms,
    quantized,
)
from .calls import Call
from .factors import Materialized, Pair
from .registry import register_rule, rule_for

__all__ = ["Call", "Materialized", "Pair", "register_rule", "rule_for"]
