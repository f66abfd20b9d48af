from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt.ops import nested_graphs
from onnxopt.passes._counting import ModelCensus
from onnxopt.passes.base import Pass, PassResult


def _remove_unused_subgraph_initializers(model: ir.Model) -> None:
    for graph in nested_graphs(model.graph):
        for name, value in list(graph.initializers.items()):
            if not value.uses() and not value.is_graph_output() and not value.is_graph_input():
                del graph.initializers[name]


class EliminateDeadCodePass(Pass):
    """Remove nodes, initializers, functions and opset imports nothing uses; graph outputs always stay."""

    name = "eliminate-dead-code"
    summary = "remove unused nodes, initializers, functions and opset imports (graph outputs kept)"
    removes_unread_only = True

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model)
        ir_common.RemoveUnusedNodesPass()(model)
        _remove_unused_subgraph_initializers(model)
        ir_common.RemoveUnusedFunctionsPass()(model)
        ir_common.RemoveUnusedOpsetsPass()(model)
        stats = ModelCensus.of(model).removed_since(before)
        # onnx-ir walks each graph backwards, a node's bodies when it reaches the node, so a
        # producer is reached after every reader, nested ones included: what one run leaves is
        # all read, and a second run would remove nothing.
        return PassResult(model, modified=bool(stats), stats=stats, settled=True)
