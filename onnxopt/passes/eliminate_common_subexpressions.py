from __future__ import annotations

import contextlib
from collections import Counter

import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt.ops import REDUCTIONS, all_graphs, nested_graphs
from onnxopt.passes._counting import ModelCensus
from onnxopt.passes._shape_facts import axes_param
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite import Mismatch


def _reduced_axes(node: ir.Node) -> tuple[int, ...] | None:
    """The dims ``node`` reduces, sorted and non-negative; None when they are not known (axes
    computed, none given, or a negative one on an input of unknown rank)."""
    data = node.inputs[0] if node.inputs else None
    rank = len(data.shape) if data is not None and data.shape is not None else None
    axes = axes_param(node, rank)
    if not axes or isinstance(axes, Mismatch):
        return None
    return tuple(sorted(set(axes)))


def _unify_reduction_axes(graph: ir.Graph) -> None:
    """Give a reduction (whose axes are a set: [-1] and [rank - 1], or [1, 2] and [2, 1], reduce
    the same dims) the axes spelling of an earlier one of the same input that reduces the
    same dims with the same attributes (torch's dynamo export of ``x.std(-1)`` beside
    ``x.mean(-1)`` reads the last dim as [2] in one and [-1] in the other), so that the merge
    below sees two equal nodes. Only such pairs change: a reduction alone keeps its axes."""
    first: dict[tuple[object, ...], ir.Node] = {}
    for node in graph:
        if node.domain != "" or node.op_type not in REDUCTIONS or not node.inputs:
            continue
        axes = _reduced_axes(node)
        if axes is None or node.inputs[0] is None:
            continue
        others = tuple(
            sorted(
                (name, repr(attr.value)) for name, attr in node.attributes.items() if name != "axes"
            )
        )
        key = (node.op_type, id(node.inputs[0]), axes, others, len(node.inputs))
        earlier = first.setdefault(key, node)
        if earlier is node:
            continue
        if "axes" in node.attributes:
            node.attributes["axes"] = ir.AttrInt64s("axes", earlier.attributes.get_ints("axes", ()))
        elif node.inputs[1] is not earlier.inputs[1]:
            node.replace_input_with(1, earlier.inputs[1])


class EliminateCommonSubexpressionsPass(Pass):
    """Merge nodes that compute the same op on the same inputs with the same attributes.

    Non-deterministic ops (random generators) are never merged. Reductions of one input over the
    same dims spelled differently ([-1] and [2] of a rank-3 tensor) are merged too.
    """

    name = "eliminate-common-subexpressions"
    summary = "merge nodes computing the same op on the same inputs (random ops excluded)"
    # Two nodes are equal by their op, attributes and inputs, whoever reads them.
    reads_producers_only = True

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model).nodes
        for graph in all_graphs(model):
            _unify_reduction_axes(graph)
        cse = ir_common.CommonSubexpressionEliminationPass(size_limit=1024)
        with contextlib.suppress(TypeError):  # see the subgraphs below
            cse(model)
        # onnx-ir's pass covers the main graph only; a merged decoder's whole work is in its If
        # branches. Each subgraph is merged within itself (never across scopes).
        per_graph = getattr(cse, "_eliminate_common_subexpression", None)
        if per_graph is not None:
            for graph in nested_graphs(model.graph):
                # onnx-ir hashes attribute values: a type attribute (Optional's) is unhashable.
                # Each merge is complete when made, so a graph it stops in stays valid.
                with contextlib.suppress(TypeError):
                    per_graph(graph)
        merged = before - ModelCensus.of(model).nodes
        stats = Counter({"nodes merged": merged}) if merged > 0 else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
