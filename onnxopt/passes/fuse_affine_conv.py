"""Fold a per-channel affine that a Conv reads into the Conv's weights and bias.

``Conv(h * a + b)`` with a and b constant per input channel is ``Conv'(h)`` with
``W'[m, c, k] = W[m, c, k] * a[c]`` and ``bias'[m] = bias[m] + sum over c, k of W[m, c, k] * b[c]``:
every output reads a whole window of ``h * a + b``. Not where the Conv pads with zeros, whose
padded entries would have been zeros of the affine's output and would now be zeros of h (their
shift ``b`` is missing): there only a pure scale folds (``0 * a`` is still 0), the shift stays.

fuse-conv-bn folds an affine *after* a Conv into that Conv; this folds one *before* a Conv, where
fuse-conv-bn cannot reach: after an activation (PaddlePaddle's PP-LCNetV3 puts a learnable affine
block after every activation; the ones read by its unpadded pointwise Convs fold here, the ones
read by its padded depthwise Convs become depthwise Convs in fuse-channel-affine), a
pre-activation BatchNormalization, or an input normalization ``(x - mean) / std`` written into the
graph. Any chain of Mul, Div, Add, Sub by per-channel constants and inference-mode
BatchNormalization folds; the ops are removed for every runtime (standard ONNX, both targets).

Arithmetic runs in float64 and is rounded once to the weight's dtype, as in fuse-conv-bn: the
result differs from the unfused graph by the rounding of the folded weights (the affine's own
rounding is gone). A fold whose weights overflow their dtype is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import bn_affine, narrowed, per_channel, weight_to_fold
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, other_input

_ELEMENTWISE = ("Mul", "Div", "Add", "Sub")


@dataclass
class _Affine:
    """The Conv's input as ``h * scale + shift`` of ``h``, through the ``nodes`` walked so far."""

    h: ir.Value
    scale: np.ndarray
    shift: np.ndarray
    nodes: list[ir.Node]


def _operation(
    node: ir.Node, rank: int, channels: int
) -> tuple[ir.Value | None, np.ndarray, np.ndarray] | Mismatch:
    """``node`` as ``(h, s, t)``: its output is ``h * s + t`` per channel."""
    if is_op(node, "BatchNormalization"):
        found = bn_affine(node)
        if isinstance(found, Mismatch):
            return found
        if found[0].shape != (channels,):
            return Mismatch(
                f"the BatchNormalization has {found[0].shape[0]} channels, the Conv {channels}"
            )
        return node.inputs[0], *found
    if not any(is_op(node, op) for op in _ELEMENTWISE) or len(node.inputs) != 2:
        return Mismatch("not a per-channel affine", candidate=False)
    source = next((x for x in node.inputs if x is not None and const_array(x) is None), None)
    if source is None:
        return Mismatch(f"the {node.op_type} has no non-constant operand", candidate=False)
    c = per_channel(other_input(node, source), rank, channels, 1)
    if isinstance(c, Mismatch):
        return Mismatch(f"the {node.op_type}: {c.reason}", candidate=c.candidate)
    ones, zeros = np.ones(channels), np.zeros(channels)
    first = node.inputs[0] is source
    if node.op_type == "Mul":
        return source, c, zeros
    if node.op_type == "Add":
        return source, ones, c
    if node.op_type == "Sub":
        return (source, ones, -c) if first else (source, -ones, c)
    if not first:
        return Mismatch("a Div by the activation is not an affine", candidate=False)
    if not np.all(c):
        return Mismatch("the Div's divisor has a zero")
    return source, 1.0 / c, zeros


def _step(node: ir.Node, affine: _Affine, rank: int, channels: int) -> _Affine | Mismatch:
    """``affine`` extended back over ``node`` (the producer of ``affine.h``)."""
    found = _operation(node, rank, channels)
    if isinstance(found, Mismatch):
        return found
    source, s, t = found
    if source is None or source.dtype != affine.h.dtype:
        return Mismatch("the affine changes the dtype", candidate=False)
    shape = source.shape
    if shape is None or len(shape) != rank or shape[1] != channels:
        # A constant with C channels would broadcast a one-channel h up to the Conv's C.
        return Mismatch(
            f"the affine's input is not known to be rank {rank} with {channels} channels"
        )
    # conv input = (h_prev * s + t) * scale + shift
    return _Affine(source, affine.scale * s, affine.shift + t * affine.scale, [node, *affine.nodes])


def _pads(conv: ir.Node, kernel: tuple[int, ...]) -> bool:
    """Whether some output of ``conv`` may read a padded entry."""
    auto_pad = conv.attributes.get_string("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return any(k != 1 for k in kernel)  # a 1-wide window never reaches past the input
    if auto_pad == "VALID":
        return False
    return any(p != 0 for p in conv.attributes.get_ints("pads", ()))


def _match(conv: ir.Node, context: RewriteContext) -> Match | Mismatch:
    x = conv.inputs[0]
    producer = None if x is None else x.producer()
    if producer is None or not any(
        is_op(producer, op) for op in (*_ELEMENTWISE, "BatchNormalization")
    ):
        return Mismatch("the Conv's input is not a Mul, Div, Add, Sub or BatchNormalization", False)
    assert x is not None
    weight = weight_to_fold(conv, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim < 3:
        return Mismatch(f"Conv weight has rank {weight.ndim}")
    group = conv.attributes.get_int("group", 1)
    rank, channels = weight.ndim, int(weight.shape[1]) * group
    padded = _pads(conv, tuple(weight.shape[2:]))
    affine = _Affine(x, np.ones(channels), np.zeros(channels), [])
    best: _Affine | None = None
    reason = Mismatch("not a per-channel affine", candidate=False)
    while True:
        node = affine.h.producer()
        if node is None:
            break
        if not only_user(affine.h):
            reason = Mismatch(f"the {node.op_type}'s output has other users")
            break
        extended = _step(node, affine, rank, channels)
        if isinstance(extended, Mismatch):
            reason = extended
            break
        affine = extended
        if padded and np.any(affine.shift):
            reason = Mismatch(
                "the Conv pads with zeros: the affine's shift would move into the padding"
            )
            break
        best = affine
    if best is None:
        return reason
    folded = _fold(conv, weight, best, group)
    if isinstance(folded, Mismatch):
        return folded
    return Match([*best.nodes, conv], {"h": best.h, "weight": folded[0], "bias": folded[1]})


def _fold(
    conv: ir.Node, weight: np.ndarray, affine: _Affine, group: int
) -> tuple[np.ndarray, np.ndarray] | Mismatch:
    out_channels, per_group = weight.shape[0], weight.shape[1]
    # the input channel each weight entry reads: [M, C/group]
    first = (np.arange(out_channels) // (out_channels // group)) * per_group
    channel = first[:, None] + np.arange(per_group)[None, :]
    spatial = (1,) * (weight.ndim - 2)
    wide = weight.astype(np.float64)
    scaled = wide * affine.scale[channel].reshape(*channel.shape, *spatial)
    bias_value = conv.inputs[2] if len(conv.inputs) > 2 else None
    bias = np.zeros(out_channels) if bias_value is None else const_array(bias_value)
    if bias is None:
        return Mismatch("Conv bias is not a constant")
    shift = (wide * affine.shift[channel].reshape(*channel.shape, *spatial)).reshape(
        out_channels, -1
    )
    return narrowed((scaled, bias.astype(np.float64) + shift.sum(axis=1)), weight.dtype)


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    conv = match.root
    weight = new_constant(match.bindings["weight"], conv.inputs[1].name if conv.inputs[1] else None)
    bias = new_constant(match.bindings["bias"], f"{conv.name or 'Conv'}_bias")
    new = ir.Node(
        "", "Conv", [match.bindings["h"], weight, bias], conv.attributes.values(), name=conv.name
    )
    return Replacement([new], [(conv.outputs[0], new.outputs[0])], constants=[weight, bias])


RULES = (Rule("affine+conv->conv", "Conv", _match, _rewrite),)


class FuseAffineConvPass(RulePass):
    """A per-channel Mul/Div/Add/Sub/BatchNormalization chain read by a Conv -> the Conv's weights
    and bias (a pure scale only, where the Conv pads)."""

    name = "fuse-affine-conv"
    summary = (
        "fold a per-channel affine (Mul/Div/Add/Sub, BatchNormalization) that a Conv reads into "
        "the Conv's weights and bias"
    )
    rules = RULES
