"""Rule, Match, Mismatch and Replacement.

A :class:`Rule` is data: the op it is rooted at, a pure ``match`` returning a :class:`Match` or a
:class:`Mismatch` (with a reason a user can act on), and a ``rewrite`` that builds new nodes from the
match without touching the graph. The driver in ``driver.py`` performs all mutation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnxopt.passes.options import PassOptions


@dataclass(frozen=True)
class Mismatch:
    """Why a candidate was not rewritten, e.g. ``Mismatch("Conv output has 2 consumers")``."""

    reason: str
    # False when the node was never a plausible candidate (e.g. an Add that is not part of any
    # LayerNorm): --explain stays quiet about those and only lists real near-misses.
    candidate: bool = True

    def __bool__(self) -> bool:  # so `if not (m := rule.match(...))` reads naturally
        return False


@dataclass
class Match:
    """A successful match: ``nodes`` are the matched nodes (root last); ``bindings`` what rewrite needs."""

    nodes: Sequence[ir.Node]
    bindings: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> ir.Node:
        return self.nodes[-1]


@dataclass(frozen=True)
class Replacement:
    """New nodes (in execution order) and which old values they stand for.

    ``values`` maps each old value whose users must move to a new value; the new value may be an
    existing value (for eliminations) or an output of one of ``nodes``. Matched nodes whose outputs
    end up unused are removed by the driver.

    ``constants`` are new unnamed values with ``const_value`` set (e.g. merged Unsqueeze axes) that
    ``nodes`` read; the driver names them and adds them as initializers, or as Constant nodes where
    initializers cannot be used (functions, IR version < 4).
    """

    nodes: Sequence[ir.Node]
    values: Sequence[tuple[ir.Value, ir.Value]]
    constants: Sequence[ir.Value] = ()


@dataclass(frozen=True)
class RewriteContext:
    """Read-only facts a rule may consult: the model (opsets, metadata) and the pass options."""

    model: ir.Model
    graph: ir.Graph | ir.Function
    options: PassOptions

    def opset(self, domain: str = "") -> int:
        from onnxopt.ops import opset_version

        version = opset_version(self.graph, domain)
        if version is None:
            version = opset_version(self.model.graph, domain)
        return version or 0


MatchFn = Callable[[ir.Node, RewriteContext], "Match | Mismatch"]
RewriteFn = Callable[[Match, RewriteContext], "Replacement | Mismatch"]


@dataclass(frozen=True)
class Rule:
    """``name`` is the stats key ("conv+bn->conv"); the rule is tried on nodes of ``domain``/``op_type``."""

    name: str
    op_type: str
    match: MatchFn
    rewrite: RewriteFn
    domain: str = ""
