"""Pattern rules and the driver that applies them: ``match`` is pure, only the driver mutates."""

from onnxopt.rewrite.driver import apply_rules, iter_graphs
from onnxopt.rewrite.rule import Match, Mismatch, Replacement, RewriteContext, Rule

__all__ = [
    "Match",
    "Mismatch",
    "Replacement",
    "RewriteContext",
    "Rule",
    "apply_rules",
    "iter_graphs",
]
