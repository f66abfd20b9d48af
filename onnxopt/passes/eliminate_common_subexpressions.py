from __future__ import annotations

import contextlib
from collections import Counter

import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt.passes._counting import ModelCensus
from onnxopt.passes.base import Pass, PassResult


class EliminateCommonSubexpressionsPass(Pass):
    """Merge nodes that compute the same op on the same inputs with the same attributes.

    Non-deterministic ops (random generators) are never merged.
    """

    name = "eliminate-common-subexpressions"
    summary = "merge nodes computing the same op on the same inputs (random ops excluded)"

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model).nodes
        cse = ir_common.CommonSubexpressionEliminationPass(size_limit=1024)
        with contextlib.suppress(TypeError):  # see the subgraphs below
            cse(model)
        # onnx-ir's pass covers the main graph only; a merged decoder's whole work is in its If
        # branches. Each subgraph is merged within itself (never across scopes).
        per_graph = getattr(cse, "_eliminate_common_subexpression", None)
        if per_graph is not None:
            for graph in model.graph.subgraphs():
                # onnx-ir hashes attribute values: a type attribute (Optional's) is unhashable.
                # Each merge is complete when made, so a graph it stops in stays valid.
                with contextlib.suppress(TypeError):
                    per_graph(graph)
        merged = before - ModelCensus.of(model).nodes
        stats = Counter({"nodes merged": merged}) if merged > 0 else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
