from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.ops import may_hold_graphs, node_subgraphs
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite.driver import iter_graphs


def _order(model: ir.Model) -> list[list[int]]:
    return [[id(node) for node in graph] for graph in iter_graphs(model)]


def sort_model(model: ir.Model) -> None:
    """Stable topological sort of the main graph and every local function (the identity on a
    sorted graph): fusions that place new nodes before their inputs' producers call it."""
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        if not _in_order(graph):
            graph.sort()


def _in_order(graph: ir.Graph | ir.Function) -> bool:
    """Whether every node of ``graph`` comes after the producers of its inputs, where it holds
    no graph (a nested graph's reads of outer values are left to the sort): onnx-ir's sort
    rebuilds the graph even where it keeps the order (35 ms on GPT-2, 2400 nodes)."""
    position: dict[ir.Node, int] = {}
    for index, node in enumerate(graph):
        if may_hold_graphs(node.op_type, node.domain) and node_subgraphs(node):
            return False
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and position.get(producer, index) >= index:
                return False
        position[node] = index
    return True


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
