"""Merge MatMuls that share their input and have constant weights into one MatMul and a Split.

    Y_i = X @ W_i (+ b_i)    for i = 1..n, every W_i a constant [K, N_i]
    ->  [Y_1 .. Y_n] = Split(X @ [W_1 | .. | W_n] (+ [b_1 | .. | b_n]), [N_1 .. N_n], axis=-1)

This is the Q/K/V projection of attention layers (three GEMMs become one wider GEMM, which
runs closer to peak), and any other fan-out of projections from one tensor. Column j of X @ W only
depends on column j of W, so the result is the same up to the GEMM's summation order. Biases are
merged too when every MatMul feeds exactly one Add of a constant [N_i] vector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op, single_consumer
from onnxopt.passes._attention_shapes import split_last_axis
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules

# Merging huge weights would double peak weight memory while the pass runs.
MAX_MERGED_BYTES = 512 * 1024 * 1024

_NOT_A_PROJECTION = "not a MatMul with a constant 2-D weight"
_NO_SIBLING = "no sibling MatMul with a constant [K, N] weight reads the same input"
_NOT_FIRST = "merged from the first projection of this input"


@dataclass(frozen=True)
class _Projection:
    matmul: ir.Node
    weight: np.ndarray
    add: ir.Node | None
    bias: np.ndarray | None

    @property
    def output(self) -> ir.Value:
        return (self.add or self.matmul).outputs[0]


def _projection(node: ir.Node) -> _Projection | None:
    """``node`` as X @ W with W a constant 2-D weight, and its constant bias Add if it has one."""
    if not is_op(node, "MatMul") or node.inputs[1] is None:
        return None
    weight = const_array(node.inputs[1])
    if weight is None or weight.ndim != 2 or not np.issubdtype(weight.dtype, np.floating):
        return None
    add = single_consumer(node.outputs[0])
    if is_op(add, "Add") and add is not None:
        other = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
        bias = const_array(other)
        if bias is not None and bias.shape == (weight.shape[1],) and bias.dtype == weight.dtype:
            return _Projection(node, weight, add, bias)
    return _Projection(node, weight, None, None)


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    source = node.inputs[0]
    first = _projection(node)
    if source is None or first is None:
        return Mismatch(_NOT_A_PROJECTION)
    siblings: list[_Projection] = []
    for use in source.uses():
        if use.idx != 0 or any(use.node is p.matmul for p in siblings):
            continue
        projection = _projection(use.node)
        if projection is None or projection.weight.shape[0] != first.weight.shape[0]:
            continue
        if projection.weight.dtype != first.weight.dtype:
            continue
        siblings.append(projection)
    if len(siblings) < 2:
        return Mismatch(_NO_SIBLING)
    if siblings[0].matmul is not node:
        return Mismatch(_NOT_FIRST)
    merged_elements = sum(p.weight.size for p in siblings)
    if merged_elements * first.weight.itemsize > MAX_MERGED_BYTES:
        return Mismatch("the merged weight would be larger than 512 MiB")
    with_bias = all(p.add is not None for p in siblings)
    if not with_bias:  # all or nothing: the Adds stay and read their MatMul's slice of the Split
        siblings = [_Projection(p.matmul, p.weight, None, None) for p in siblings]
    nodes: list[ir.Node] = [p.matmul for p in siblings]
    if with_bias:
        nodes += [p.add for p in siblings if p.add is not None]
    # Graph order, so the driver drops consumers first; the new nodes go before the first MatMul,
    # which precedes every user of the projections.
    position = {id(n): i for i, n in enumerate(context.graph)}
    nodes.sort(key=lambda n: position.get(id(n), -1))
    return Match(nodes, {"projections": siblings, "with_bias": with_bias}, anchor=nodes[0])


def _rewrite_with(
    new_weights: list[ir.Value],
) -> Callable[[Match, RewriteContext], Replacement | Mismatch]:
    def rewrite(match: Match, context: RewriteContext) -> Replacement | Mismatch:
        projections: Sequence[_Projection] = match.bindings["projections"]
        with_bias: bool = match.bindings["with_bias"]
        source = projections[0].matmul.inputs[0]
        assert source is not None
        base = projections[0].matmul.name or (source.name or "x")
        array = np.concatenate([p.weight for p in projections], axis=1)
        weight = ir.Value(name=f"{base}.merged_weight", const_value=ir.tensor(array))
        weight.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
        weight.shape = ir.Shape(list(array.shape))
        new_weights.append(weight)
        tape = ir.tape.Tape()
        merged = tape.op("MatMul", [source, weight])
        if with_bias:
            bias_values = [p.bias for p in projections if p.bias is not None]
            bias = tape.op("Constant", [], {"value": ir.tensor(np.concatenate(bias_values))})
            merged = tape.op("Add", [merged, bias])
        widths = [int(p.weight.shape[1]) for p in projections]
        outputs = split_last_axis(tape, merged, widths, context.opset())
        return Replacement(
            tape.nodes, [(p.output, out) for p, out in zip(projections, outputs, strict=True)]
        )

    return rewrite


class MergeQkvProjectionsPass(Pass):
    """Merge sibling MatMuls (shared input, constant weights) into one MatMul + Split."""

    name = "merge-qkv-projections"
    summary = "merge MatMuls that share an input and have constant weights (Q/K/V) into one MatMul + Split"

    def call(self, model: ir.Model) -> PassResult:
        new_weights: list[ir.Value] = []
        rule = Rule("matmuls->merged-matmul", "MatMul", _match, _rewrite_with(new_weights))
        stats, notes = apply_rules(model, [rule], self.options)
        # Every lone MatMul is "not a candidate"; --explain lists only groups that could have merged.
        notes = [n for n in notes if not n.endswith((_NOT_A_PROJECTION, _NO_SIBLING, _NOT_FIRST))]
        for weight in new_weights:
            if weight.uses():
                model.graph.register_initializer(weight)
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
