from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite.driver import iter_graphs


def _order(model: ir.Model) -> list[list[int]]:
    return [[id(node) for node in graph] for graph in iter_graphs(model)]


def sort_model(model: ir.Model) -> None:
    """Stable topological sort of the main graph and every local function (the identity on a
    sorted graph): fusions that place new nodes before their inputs' producers call it."""
    model.graph.sort()
    for function in model.functions.values():
        function.sort()


class SortTopologicallyPass(Pass):
    """Stable topological sort of every graph: the original order is kept wherever it is valid."""

    name = "sort-topologically"
    summary = "stable topological sort (keeps the original order where valid)"

    def call(self, model: ir.Model) -> PassResult:
        before = _order(model)
        sort_model(model)
        after = _order(model)
        moved = sum(sum(a != b for a, b in zip(x, y)) for x, y in zip(before, after))
        stats = Counter({"nodes moved": moved}) if moved else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
