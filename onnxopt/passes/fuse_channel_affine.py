"""Run a per-channel affine between convolutions as a depthwise 1x1 Conv (target ort).

``h * a + b`` with a and b constant scalars or per-channel ``[C, 1, 1]`` vectors, on a 4-D NCHW
activation that a Conv reads, is a depthwise 1x1 convolution: weight ``a`` per channel, bias
``b``. PaddlePaddle's PP-LCNetV3 (the backbone of PP-OCRv4's detector and recogniser) puts such a
"learnable affine block" after every activation, and a BatchNormalization after an activation
exports as the same Mul and Add. ONNX Runtime's CPU provider runs its convolutions in the NCHWc
layout and leaves it around every element-wise Mul or Add by a constant (a reorder each way), but
keeps it through a depthwise Conv: on RapidOCR's PP-OCRv4 detector (24 such blocks) the rewrite
measured 1.60x over the export at ORT_ENABLE_ALL against 1.34x without it.

The Conv computes ``h * a + b`` per element like the Mul and the Add (its one product and its bias;
the sum may round once where the two ops round twice: within an ulp). Only for float32, a known
static channel count, a Mul read by the Add alone, and where some reader of the result is a Conv
(the layout the rewrite keeps); not for ``--target onnx``, where a runtime without that layout
would run a convolution for two element-wise ops.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import per_channel
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, other_input

_OWN_FOLDS = frozenset({"Conv", "ConvTranspose", "FusedConv", "Gemm", "MatMul", "Pad"})


def _per_channel(value: ir.Value | None, channels: int) -> np.ndarray | None:
    """A float32 constant of one number per channel of a 4-D NCHW tensor (one element, or
    [C, 1, 1] / [1, C, 1, 1]), as its [C] values."""
    array = const_array(value)
    if array is None or array.dtype != np.float32:
        return None
    found = per_channel(value, 4, channels, 1)
    return None if isinstance(found, Mismatch) else found.astype(np.float32)


def _match_affine(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch(
            "a depthwise Conv pays for ORT's NCHWc layout (target ort)", candidate=False
        )
    if len(add.inputs) != 2:
        return Mismatch("not a binary Add", candidate=False)
    for scaled, shift in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mul = None if scaled is None else scaled.producer()
        if mul is None or not is_op(mul, "Mul") or len(mul.inputs) != 2:
            continue
        for h in mul.inputs:
            factor = other_input(mul, h)
            if h is None or factor is None or const_array(h) is not None:
                continue
            shape = h.shape
            if h.dtype != ir.DataType.FLOAT or shape is None or len(shape) != 4:
                continue
            source = h.producer()
            if source is None:
                return Mismatch(
                    "the affine reads a graph input (input normalization: not measured)"
                )
            if source.op_type in _OWN_FOLDS:
                # (fuse-conv-bn folds an affine after these into their weights; fuse-pad a Pad
                # into the Conv after it: the depthwise Conv would be that Conv on a second run)
                return Mismatch(f"the affine follows a {source.op_type}")
            channels = shape[1]
            if not isinstance(channels, int):
                return Mismatch("the channel count is not static")
            weight = _per_channel(factor, channels)
            bias = _per_channel(shift, channels)
            if weight is None or bias is None:
                continue
            assert scaled is not None
            if not only_user(scaled):
                return Mismatch("the scaled activation has other users")
            if not any(is_op(use.node, "Conv") for use in add.outputs[0].uses()):
                return Mismatch("no Conv reads the result (no NCHWc layout to keep)")
            return Match([mul, add], {"h": h, "weight": weight, "bias": bias})
    return Mismatch("not h * a + b with per-channel constants on a 4-D float32 h", candidate=False)


def _rewrite_affine(match: Match, context: RewriteContext) -> Replacement:
    h, weight, bias = match.bindings["h"], match.bindings["weight"], match.bindings["bias"]
    channels = weight.shape[0]
    hint = match.root.name or "affine"
    w = new_constant(weight.reshape(channels, 1, 1, 1), f"{hint}_depthwise_weight")
    b = new_constant(bias, f"{hint}_depthwise_bias")
    conv = ir.node("Conv", [h, w, b], {"group": channels, "kernel_shape": [1, 1]})
    return Replacement([conv], [(match.root.outputs[0], conv.outputs[0])], constants=[w, b])


RULES = (Rule("h*a+b->depthwise Conv", "Add", _match_affine, _rewrite_affine),)


class FuseChannelAffinePass(RulePass):
    """``h * a + b`` (scalar or per-channel constants) on a 4-D activation a Conv reads -> a
    depthwise 1x1 Conv (target ort, float32): ORT keeps its NCHWc layout through it."""

    name = "fuse-channel-affine"
    summary = (
        "run a per-channel h * a + b between convolutions as a depthwise 1x1 Conv (ort; keeps "
        "ORT's NCHWc layout: PP-LCNet's learnable affine blocks)"
    )
    rules = RULES
