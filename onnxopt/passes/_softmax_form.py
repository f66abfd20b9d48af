"""A softmax spelled out, ``exp(x - max(x)) / sum(exp(x - max(x)))`` over one axis, as Softmax.

jax.nn.softmax writes it so (Flax attention; Google's magika through jax2tf and tf2onnx), and so
do hand-written numerically stable softmaxes: the row max subtracted, the exponentials divided by
their row sum, which is what Softmax computes over that axis, in the same order. jax2tf reduces
with keepdims=0 and views each statistic back (``Reshape(r, [0, H, 0, 1])``: the target must put
the 1 at the reduced axis and provably keep every other dim), and floors the max with -inf
(``max(x, initial=-inf)``), which changes nothing: a row of -inf is NaN either way (-inf - -inf),
and a NaN anywhere in a row makes the whole row NaN in both graphs.

Only the max-stabilized form is taken: a bare ``exp(x) / sum(exp(x))`` overflows where Softmax
does not, so the two would differ on large scores.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes._shape_facts import Dims, axes_param, dims_of, int_param
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import const_scalar, other_input

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16)


def _below_floor(node: ir.Node | None) -> ir.Value | None:
    """The other operand when ``node`` is ``Max(m, -inf)`` (either order), else None."""
    if not is_op(node, "Max") or node is None or len(node.inputs) != 2:
        return None
    for operand in node.inputs:
        floor = const_scalar(operand)
        if floor is not None and math.isinf(floor) and floor < 0:
            return other_input(node, operand)
    return None


def _restores_axis(reshape: ir.Node, dims: Dims, axis: int) -> bool:
    """True when ``reshape`` turns ``x``'s reduction over ``axis`` with keepdims=0 into its
    keepdims=1 shape: x's dims (``dims``) with a 1 at ``axis``."""
    target = int_param(reshape, "shape", 1)
    if not isinstance(target, tuple) or len(target) != len(dims) or target[axis] != 1:
        return False
    copies = reshape.attributes.get_int("allowzero", 0) == 0
    inferred = 0
    for index, (want, dim) in enumerate(zip(target, dims, strict=True)):
        if index == axis or (want == 0 and copies and index < axis):
            continue  # a 0 before the axis copies the reduced tensor's dim there, which is x's
        if want == -1:
            inferred += 1  # x's dim once every other dim is proven
        elif dim is None or want != dim:
            return False
    return inferred <= 1


def _kept_reduction(
    value: ir.Value | None, op: str, x: ir.Value
) -> tuple[list[ir.Node], int] | str:
    """(nodes, axis) when ``value`` is ``op(x)`` over one axis with that axis kept: keepdims=1, or
    keepdims=0 viewed back by a Reshape; a ReduceMax also through a -inf floor on either side of
    the view. A string says why not."""
    nodes: list[ir.Node] = []
    node = None if value is None else value.producer()
    view = None
    for _ in range(2):
        floored = _below_floor(node) if op == "ReduceMax" else None
        if floored is not None and node is not None:
            nodes.append(node)
            node = floored.producer()
        if view is None and is_op(node, "Reshape") and node is not None:
            view = node
            nodes.append(node)
            node = None if node.inputs[0] is None else node.inputs[0].producer()
    if not is_op(node, op) or node is None or node.inputs[0] is not x:
        return f"it is not a {op} of the exponentiated tensor's own input"
    dims = dims_of(x)
    axes = axes_param(node, None if dims is None else len(dims))
    if dims is None or not isinstance(axes, tuple) or len(axes) != 1:
        return f"the {op} is not over one axis of a tensor of known rank"
    keep = node.attributes.get_int("keepdims", 1)
    if view is None and keep != 1:
        return f"the {op} drops its axis and nothing views it back"
    if view is not None and (keep != 0 or not _restores_axis(view, dims, axes[0])):
        return f"the view of the {op} does not provably put back the reduced axis"
    nodes.append(node)
    return nodes[::-1], axes[0]  # producers first, as a Match lists them


def _match_softmax(div: ir.Node, context: RewriteContext) -> Match | Mismatch:
    exps, total = [*div.inputs, None, None][:2]
    exp = None if exps is None else exps.producer()
    if not is_op(exp, "Exp") or exp is None or exp.inputs[0] is None or exps is None:
        return Mismatch("the dividend is not an Exp", candidate=False)
    summed = _kept_reduction(total, "ReduceSum", exps)
    if isinstance(summed, str):
        return Mismatch(f"the divisor is not the exponentials' row sum: {summed}")
    sub = exp.inputs[0].producer()
    if not is_op(sub, "Sub") or sub is None or sub.inputs[0] is None:
        return Mismatch("the exponent is not x - max(x)")
    x = sub.inputs[0]
    peak = _kept_reduction(sub.inputs[1], "ReduceMax", x)
    if isinstance(peak, str):
        return Mismatch(f"the exponent does not subtract the row max: {peak}")
    axis = summed[1]
    if peak[1] != axis:
        return Mismatch(f"the max is over axis {peak[1]}, the sum over axis {axis}")
    rank = len(dims_of(x) or ())
    if context.opset() < 13 and axis != rank - 1:
        return Mismatch("before opset 13 Softmax normalizes a flattened 2-D view")
    if x.dtype not in _FLOATS:
        return Mismatch(f"x is {x.dtype}, which Softmax does not take")
    nodes = [*peak[0], sub, exp, *summed[0], div]
    inside = set(nodes)
    for node in nodes[:-1]:
        result = node.outputs[0]
        if result.is_graph_output() or any(use.node not in inside for use in result.uses()):
            return Mismatch(f"the {node.op_type} result is also read outside the softmax")
    return Match(nodes, {"x": x, "axis": axis})


def _rewrite_softmax(match: Match, context: RewriteContext) -> Replacement:
    softmax = ir.node("Softmax", [match.bindings["x"]], {"axis": match.bindings["axis"]})
    return Replacement([softmax], [(match.root.outputs[0], softmax.outputs[0])])


SOFTMAX_RULE = Rule("exp(x-max)/sum->Softmax", "Div", _match_softmax, _rewrite_softmax)
