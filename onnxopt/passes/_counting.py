"""Helpers to turn onnx-ir's boolean pass results into our per-kind counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx_ir as ir

from onnxopt.rewrite.driver import iter_graphs


@dataclass(frozen=True)
class ModelCensus:
    nodes: int
    initializers: int
    functions: int
    opsets: int

    @staticmethod
    def of(model: ir.Model) -> ModelCensus:
        nodes = 0
        initializers = 0
        for graph in iter_graphs(model):
            nodes += len(graph)
            if isinstance(graph, ir.Graph):
                initializers += len(graph.initializers)
        return ModelCensus(nodes, initializers, len(model.functions), len(model.opset_imports))

    def removed_since(self, before: ModelCensus) -> Counter[str]:
        stats: Counter[str] = Counter()
        for field in ("nodes", "initializers", "functions", "opsets"):
            delta = getattr(before, field) - getattr(self, field)
            if delta > 0:
                stats[f"{field} removed"] = delta
        return stats
