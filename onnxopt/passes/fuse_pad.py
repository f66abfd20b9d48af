"""Fold a constant zero Pad into the following Conv / AveragePool, or a -inf Pad into MaxPool.

The Pad must pad only spatial axes, by non-negative amounts, in ``constant`` mode; an Unsqueeze of
spatial axes may stand between (tf2onnx's Conv1D pads the 1-D input, then runs a 2-D Conv). Conv and
AveragePool (which then counts the padded zeros: ``count_include_pad=1``) need pad value 0;
MaxPool ignores its own padding, which equals padding with -inf.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes._shape_facts import axes_param
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import users


def _pad_amounts(pad: ir.Node, rank: int) -> tuple[list[int], float] | Mismatch:
    """(pads in [begin..., end...] order over all ``rank`` axes, pad value) of a constant-mode Pad."""
    if pad.attributes.get_string("mode", "constant") != "constant":
        return Mismatch(
            f"Pad mode is '{pad.attributes.get_string('mode', 'constant')}', not constant"
        )
    if "pads" in pad.attributes:  # opset < 11
        pads = list(pad.attributes.get_ints("pads", []))
        value = pad.attributes.get_float("value", 0.0)
    else:
        array = const_array(pad.inputs[1] if len(pad.inputs) > 1 else None)
        if array is None:
            return Mismatch("Pad amounts are not constant")
        pads = [int(p) for p in array.reshape(-1)]
        value_input = pad.inputs[2] if len(pad.inputs) > 2 else None
        value = 0.0
        if value_input is not None:
            constant = const_array(value_input)
            if constant is None or constant.size != 1:
                return Mismatch("Pad value is not a constant scalar")
            value = float(constant.reshape(()))
        axes_input = pad.inputs[3] if len(pad.inputs) > 3 else None
        if axes_input is not None:
            axes = const_array(axes_input)
            if axes is None:
                return Mismatch("Pad axes are not constant")
            full = [0] * (2 * rank)
            for i, axis in enumerate(int(a) % rank for a in axes.reshape(-1)):
                full[axis] = pads[i]
                full[rank + axis] = pads[len(axes.reshape(-1)) + i]
            pads = full
    if len(pads) != 2 * rank:
        return Mismatch(f"Pad has {len(pads)} amounts for a rank-{rank} input")
    return pads, value


def _unsqueezed(value: ir.Value | None) -> tuple[ir.Node, tuple[int, ...]] | None:
    """The Unsqueeze making ``value`` and the axes it inserts, all spatial (>= 2), when only it
    reads a Pad: tf2onnx's Conv1D pads the 1-D input, then unsqueezes it for a 2-D Conv."""
    unsqueeze = None if value is None else value.producer()
    if value is None or unsqueeze is None or not is_op(unsqueeze, "Unsqueeze") or users(value) != 1:
        return None
    inner = unsqueeze.inputs[0]
    pad = None if inner is None else inner.producer()
    if not is_op(pad, "Pad") or value is None or value.shape is None:
        return None
    axes = axes_param(unsqueeze, len(value.shape))
    if axes is None or isinstance(axes, Mismatch) or min(axes) < 2:
        return None
    return unsqueeze, axes


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    unsqueezed = _unsqueezed(node.inputs[0])
    source = unsqueezed[0].inputs[0] if unsqueezed is not None else node.inputs[0]
    pad = None if source is None else source.producer()
    if not is_op(pad, "Pad") or pad is None or pad.inputs[0] is None:
        return Mismatch("input is not a Pad", candidate=False)
    if users(pad.outputs[0]) != 1:
        return Mismatch(f"Pad output has {users(pad.outputs[0])} consumers")
    data = pad.inputs[0]
    rank = len(data.shape) if data.shape is not None else None
    if rank is None and is_op(node, "Conv") and unsqueezed is None:
        weight = node.inputs[1].shape if node.inputs[1] is not None else None
        rank = len(weight) if weight is not None else None
    if rank is None or rank + (len(unsqueezed[1]) if unsqueezed else 0) < 3:
        return Mismatch("input rank is unknown")
    amounts = _pad_amounts(pad, rank)
    if isinstance(amounts, Mismatch):
        return amounts
    pads, value = amounts
    if unsqueezed is not None:  # no padding on the inserted axes
        inserted = unsqueezed[1]
        rank += len(inserted)
        begins, ends = iter(pads[: len(pads) // 2]), iter(pads[len(pads) // 2 :])
        pads = [0 if a in inserted else next(begins) for a in range(rank)] + [
            0 if a in inserted else next(ends) for a in range(rank)
        ]
    spatial = rank - 2
    if any(pads[i] != 0 for i in (0, 1, rank, rank + 1)):
        return Mismatch("Pad pads the batch or channel axis")
    if any(p < 0 for p in pads):
        return Mismatch("Pad has negative amounts (a crop)")
    if node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
        return Mismatch(f"{node.op_type} uses auto_pad")
    if is_op(node, "MaxPool"):
        if not (math.isinf(value) and value < 0):
            return Mismatch(f"Pad value {value} is not -inf, which MaxPool's padding means")
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return Mismatch("MaxPool indices output is used")
    elif value != 0.0:
        return Mismatch(f"Pad value {value} is not 0")
    old = list(node.attributes.get_ints("pads", [0] * (2 * spatial)))
    if is_op(node, "AveragePool"):
        if node.attributes.get_int("ceil_mode", 0) != 0:
            return Mismatch("AveragePool uses ceil_mode")
        if node.attributes.get_int("count_include_pad", 0) == 0 and any(old):
            return Mismatch(
                "AveragePool excludes its own padding from the average but would include the Pad's"
            )
    if is_op(node, "MaxPool") and node.attributes.get_int("ceil_mode", 0) != 0:
        return Mismatch("MaxPool uses ceil_mode")
    merged = [old[i] + pads[2 + i] for i in range(spatial)] + [
        old[spatial + i] + pads[rank + 2 + i] for i in range(spatial)
    ]
    if unsqueezed is not None:
        return Match([pad, unsqueezed[0], node], {"pads": merged, "data": data})
    return Match([pad, node], {"pads": merged, "data": data})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    node = match.root
    attributes = {a.name: a for a in node.attributes.values()}
    attributes["pads"] = ir.AttrInt64s("pads", match.bindings["pads"])
    if is_op(node, "AveragePool"):
        attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 1)
    data = match.bindings["data"]
    nodes = []
    if len(match.nodes) == 3:  # the Unsqueeze now reads the unpadded input
        unsqueeze = match.nodes[1]
        nodes.append(
            ir.Node("", "Unsqueeze", [data, *unsqueeze.inputs[1:]], unsqueeze.attributes.values())
        )
        data = nodes[0].outputs[0]
    inputs = [data, *node.inputs[1:]]
    new = ir.Node("", node.op_type, inputs, attributes.values(), num_outputs=1, name=node.name)
    return Replacement([*nodes, new], [(node.outputs[0], new.outputs[0])])


RULES = (
    Rule("pad+conv->conv", "Conv", _match, _rewrite),
    Rule("pad+averagepool->averagepool", "AveragePool", _match, _rewrite),
    Rule("pad+maxpool->maxpool", "MaxPool", _match, _rewrite),
)


class FusePadPass(RulePass):
    """Fold constant spatial Pad into Conv/AveragePool (value 0) and MaxPool (value -inf)."""

    name = "fuse-pad"
    summary = "fold constant spatial Pad into the following Conv / AveragePool / MaxPool"
    rules = RULES
