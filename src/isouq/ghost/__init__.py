"""Ghost norms: exact per-example squared gradient norms from one backward pass.

``GhostNorms`` (engine.py) records layer calls; rules (one file per layer family, registered
with :func:`register_rule`) turn each call into per-example gradient contributions.
"""

from .calls import Call
from .factors import Materialized, Pair
from .registry import register_rule, rule_for

__all__ = ["Call", "Materialized", "Pair", "register_rule", "rule_for"]
