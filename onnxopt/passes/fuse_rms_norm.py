"""Fuse LLaMA-style RMS normalization: ``y = x * rsqrt(mean(x^2, -1) + eps) * w``.

rsqrt is spelled Reciprocal(Sqrt(.)), Div(1, Sqrt(.)) or Pow(., -0.5); x^2 as Pow(x, 2) or Mul(x, x).
The normalization may also divide: ``x / sqrt(mean(x^2) + eps) * w`` (ImageGPT's layer norm).
An identity Cast (to x's own type) between the normalization and the weight is absorbed. So is a
float32 island around a float16 input, as ``LlamaRMSNorm`` in half precision exports it:
``Cast(Cast(x, float) * rsqrt(...), float16) * w`` becomes one float16 op (both ops compute in
float32 inside, ``stash_type=1``, and round once instead of twice). TensorFlow's form folds the
weight into the rsqrt first, ``x * (rsqrt(mean(x^2) + eps) * w)`` (T5's TF classes via tf2onnx).
Target ``ort``: SimplifiedLayerNormalization (registered by ONNX Runtime in the default domain).
Target ``onnx``: RMSNormalization, which exists from opset 23 only; older models are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import is_op, single_consumer
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_layer_norm import (
    last_axis_problem,
    mean_of,
    per_channel_vector,
    squared_value,
    widening_cast,
)
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import (
    const_scalar,
    new_constant,
    other_input,
    producer_op,
)

RMS_NORM_OPSET = 23


def _rsqrt_of(value: ir.Value | None) -> tuple[list[ir.Node], ir.Value] | None:
    """(nodes, v) when ``value = 1 / sqrt(v)``."""
    node = None if value is None else value.producer()
    if (
        is_op(node, "Pow")
        and node is not None
        and const_scalar(node.inputs[1]) == -0.5
        and node.inputs[0] is not None
    ):
        return [node], node.inputs[0]
    sqrt = None
    if is_op(node, "Reciprocal") and node is not None:
        sqrt = producer_op(node.inputs[0], "Sqrt")
    elif is_op(node, "Div") and node is not None and const_scalar(node.inputs[0]) == 1.0:
        sqrt = producer_op(node.inputs[1], "Sqrt")
    if node is None or sqrt is None or sqrt.inputs[0] is None:
        return None
    return [sqrt, node], sqrt.inputs[0]


def _scaled_rsqrt(
    node: ir.Node, operand: ir.Value | None
) -> tuple[list[ir.Node], ir.Value, np.ndarray] | None:
    """(nodes, v, w) when ``operand = rsqrt(v) * w`` with w a per-channel constant: TensorFlow's
    form (T5's TF classes, ``x * (rsqrt(mean(x²) + eps) * w)``), the weight folded first."""
    scale = None if operand is None else operand.producer()
    if not is_op(scale, "Mul") or scale is None:
        return None
    for part in scale.inputs[:2]:
        found = _rsqrt_of(part)
        weight = per_channel_vector(other_input(scale, part), other_input(node, operand))
        if found is not None and weight is not None:
            return [*found[0], scale], found[1], weight
    return None


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    found = None
    folded_weight = None
    h = None
    if is_op(node, "Div"):  # h / sqrt(v)
        sqrt = producer_op(node.inputs[1], "Sqrt")
        if sqrt is None or sqrt.inputs[0] is None:
            return Mismatch("the divisor is not sqrt(...)", candidate=False)
        found, h = ([sqrt], sqrt.inputs[0]), node.inputs[0]
    for operand in node.inputs[:2] if found is None else ():
        found = _rsqrt_of(operand)
        h = other_input(node, operand)
        if found is not None:
            break
        scaled = _scaled_rsqrt(node, operand)
        if scaled is not None:
            found, folded_weight = (scaled[0], scaled[1]), scaled[2]
            break
    if found is None:
        return Mismatch("no operand is 1/sqrt(...)", candidate=False)
    rsqrt_nodes, v = found
    add = producer_op(v, "Add")
    if add is None:
        return Mismatch("1/sqrt argument is not mean + epsilon", candidate=False)
    mean = eps = None
    for operand in add.inputs[:2]:
        if mean_of(operand) is not None:
            mean = mean_of(operand)
            eps = const_scalar(other_input(add, operand))
    if mean is None:
        return Mismatch("1/sqrt argument is not ReduceMean(x^2) + epsilon", candidate=False)
    square = mean.inputs[0].producer() if mean.inputs[0] is not None else None
    if square is None or h is None or squared_value(mean.inputs[0]) is not h:
        return Mismatch("mean is not over the square of the normalized input", candidate=False)
    if eps is None:
        return Mismatch("epsilon is not a constant scalar")
    problem = last_axis_problem(mean, h, "RMS")
    if problem is not None:
        return Mismatch(problem)
    core = [square, mean, add, *rsqrt_nodes, node]
    for inner in core[:-1]:
        if inner.outputs[0].is_graph_output() or any(
            use.node not in core for use in inner.outputs[0].uses()
        ):
            return Mismatch(f"intermediate {inner.op_type} result is used outside the pattern")
    if h is None or h.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return Mismatch("input is not float or float16")
    nodes = list(core)
    tail = node.outputs[0]
    follower = single_consumer(tail)
    widening = widening_cast(h, core)
    dtype = h.dtype.numpy()
    if is_op(follower, "Cast") and follower is not None:
        to = follower.attributes.get_int("to", 0)
        if to == h.dtype.value:
            nodes.append(follower)
        elif (
            widening is not None
            and widening.inputs[0] is not None
            and to == ir.DataType.FLOAT16.value
        ):
            nodes = [widening, *nodes, follower]
            h, dtype = widening.inputs[0], np.dtype(np.float16)
        if nodes[-1] is follower:
            tail = follower.outputs[0]
            follower = single_consumer(tail)
    weight = folded_weight
    if weight is None and is_op(follower, "Mul") and follower is not None:
        weight = per_channel_vector(other_input(follower, tail), h)
        if weight is not None:
            nodes.append(follower)
    if weight is None:
        last = None if h.shape is None or len(h.shape) == 0 else h.shape[-1]
        if not isinstance(last, int):
            return Mismatch("no constant weight follows and the hidden size is not static")
        weight = np.ones(last)
    target = context.options.target
    if target == "onnx" and context.opset() < RMS_NORM_OPSET:
        return Mismatch(
            f"RMSNormalization needs opset {RMS_NORM_OPSET}, the model imports {context.opset()}"
        )
    return Match(nodes, {"x": h, "eps": eps, "weight": weight.astype(dtype)})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    weight = new_constant(b["weight"], "rms_norm_weight")
    op = "SimplifiedLayerNormalization" if context.options.target == "ort" else "RMSNormalization"
    new = ir.node(op, [b["x"], weight], {"axis": -1, "epsilon": b["eps"]})
    return Replacement([new], [(match.root.outputs[0], new.outputs[0])], constants=[weight])


RULES = (
    Rule("rms-norm->RMSNormalization", "Mul", _match, _rewrite),
    Rule("rms-norm->RMSNormalization", "Div", _match, _rewrite),
)


class FuseRmsNormPass(RulePass):
    """x * rsqrt(mean(x^2) + eps) * w -> SimplifiedLayerNormalization (ort) / RMSNormalization (onnx, opset 23+)."""

    name = "fuse-rms-norm"
    summary = "fuse RMS normalization (ort: SimplifiedLayerNormalization; onnx: RMSNormalization, opset 23+)"
    rules = RULES
