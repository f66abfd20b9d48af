"""Fold a per-channel affine that a Conv, Gemm or MatMul reads into that layer's weights and bias.

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

fuse-affine-matmul (a second pass: it runs after the norm fusions, which own the scale and shift
that end a decomposed LayerNorm) does the same for a product by a constant 2-D weight:
``(h * a + b) @ W`` is ``h @ (a * W) + b @ W``, the affine per feature (the product's last axis).
A Reshape between the affine and the product that only merges or splits leading dims (the last dim
the same static size on both sides: TorchScript's ``addmm`` on a flattened view) keeps every
element's feature index, so the affine folds through it; the Reshape stays, reading ``h``.
fuse-matmul turns that Reshape + Gemm into a MatMul later; without this, optimizing the result a
second time would fold what the first run left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import bn_affine, narrowed, per_channel, weight_to_fold
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, other_input, rank_of

_ELEMENTWISE = ("Mul", "Div", "Add", "Sub")


@dataclass
class _Affine:
    """The layer's input as ``h * scale + shift`` of ``h``, through the ``nodes`` walked so far."""

    h: ir.Value
    scale: np.ndarray
    shift: np.ndarray
    nodes: list[ir.Node]


def _operation(
    node: ir.Node, rank: int, channels: int, axis: int
) -> tuple[ir.Value | None, np.ndarray, np.ndarray] | Mismatch:
    """``node`` as ``(h, s, t)``: its output is ``h * s + t`` per channel along ``axis``."""
    if is_op(node, "BatchNormalization"):
        if axis != 1:
            return Mismatch(
                f"the BatchNormalization normalizes axis 1, the product reads axis {axis}"
            )
        found = bn_affine(node)
        if isinstance(found, Mismatch):
            return found
        if found[0].shape != (channels,):
            return Mismatch(
                f"the BatchNormalization has {found[0].shape[0]} channels, the layer {channels}"
            )
        return node.inputs[0], *found
    if not any(is_op(node, op) for op in _ELEMENTWISE) or len(node.inputs) != 2:
        return Mismatch("not a per-channel affine", candidate=False)
    source = next((x for x in node.inputs if x is not None and const_array(x) is None), None)
    if source is None:
        return Mismatch(f"the {node.op_type} has no non-constant operand", candidate=False)
    c = per_channel(other_input(node, source), rank, channels, axis)
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


def _step(
    node: ir.Node, affine: _Affine, rank: int, channels: int, axis: int
) -> _Affine | Mismatch:
    """``affine`` extended back over ``node`` (the producer of ``affine.h``)."""
    found = _operation(node, rank, channels, axis)
    if isinstance(found, Mismatch):
        return found
    source, s, t = found
    if source is None or source.dtype != affine.h.dtype:
        return Mismatch("the affine changes the dtype", candidate=False)
    shape = source.shape
    if shape is None or len(shape) != rank or shape[axis] != channels:
        # A constant with C channels would broadcast a one-channel h up to the layer's C.
        return Mismatch(
            f"the affine's input is not known to be rank {rank} with {channels} channels"
        )
    # the layer's input = (h_prev * s + t) * scale + shift
    return _Affine(source, affine.scale * s, affine.shift + t * affine.scale, [node, *affine.nodes])


def _pads(conv: ir.Node, kernel: tuple[int, ...]) -> bool:
    """Whether some output of ``conv`` may read a padded entry."""
    auto_pad = conv.attributes.get_string("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return any(k != 1 for k in kernel)  # a 1-wide window never reaches past the input
    if auto_pad == "VALID":
        return False
    return any(p != 0 for p in conv.attributes.get_ints("pads", ()))


def _walk(x: ir.Value, rank: int, channels: int, axis: int, padded: bool) -> _Affine | Mismatch:
    """The longest chain of per-channel affine ops ending in ``x`` (a layer's input), each
    result read only by the next; where the layer pads, the longest that is a pure scale."""
    affine = _Affine(x, np.ones(channels), np.zeros(channels), [])
    best: _Affine | None = None
    reason = Mismatch("not a per-channel affine", candidate=False)
    while (node := affine.h.producer()) is not None:
        if not only_user(affine.h):
            reason = Mismatch(f"the {node.op_type}'s output has other users")
            break
        extended = _step(node, affine, rank, channels, axis)
        if isinstance(extended, Mismatch):
            reason = extended
            break
        if padded and np.any(extended.shift):
            reason = Mismatch(
                "the Conv pads with zeros: the affine's shift would move into the padding"
            )
            break
        affine = best = extended
    return reason if best is None else best


def _layer_input(x: ir.Value | None, op_type: str) -> ir.Value | Mismatch:
    producer = None if x is None else x.producer()
    if x is None or not any(is_op(producer, op) for op in (*_ELEMENTWISE, "BatchNormalization")):
        return Mismatch(
            f"the {op_type}'s input is not a Mul, Div, Add, Sub or BatchNormalization",
            candidate=False,
        )
    return x


def _match(conv: ir.Node, context: RewriteContext) -> Match | Mismatch:
    x = _layer_input(conv.inputs[0] if conv.inputs else None, conv.op_type)
    if isinstance(x, Mismatch):
        return x
    weight = weight_to_fold(conv, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim < 3:
        return Mismatch(f"Conv weight has rank {weight.ndim}")
    group = conv.attributes.get_int("group", 1)
    rank, channels = weight.ndim, int(weight.shape[1]) * group
    padded = _pads(conv, tuple(weight.shape[2:]))
    best = _walk(x, rank, channels, 1, padded)
    if isinstance(best, Mismatch):
        return best
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


def _product_weight(node: ir.Node, context: RewriteContext) -> np.ndarray | Mismatch:
    """A Gemm's or MatMul's constant weight as [K, N] (the rows the affine's channels scale)."""
    weight = weight_to_fold(node, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim != 2:
        return Mismatch(f"{node.op_type} weight has rank {weight.ndim}, expected 2")
    if weight.nbytes > context.options.fold_limit_bytes:
        return Mismatch(
            f"{node.op_type} weight is {weight.nbytes} bytes, over the fold limit "
            f"({context.options.fold_limit_bytes})"
        )
    return weight.T if _transposed_weight(node) else weight


def _transposed_weight(node: ir.Node) -> bool:
    """A Gemm that reads its weight as [N, K] (transB=1)."""
    return is_op(node, "Gemm") and node.attributes.get_int("transB", 0) == 1


def _leading_reshape(x: ir.Value | None, features: int) -> ir.Node | None:
    """The Reshape that alone feeds ``x`` and keeps the last dim, ``features`` wide on both sides."""
    reshape = None if x is None else x.producer()
    if not is_op(reshape, "Reshape") or reshape is None or x is None or not only_user(x):
        return None
    data = reshape.inputs[0]
    shapes = (None if data is None else data.shape, x.shape)
    if any(shape is None or len(shape) == 0 or shape[-1] != features for shape in shapes):
        return None
    return reshape


def _match_product(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``(h * a + b) @ W`` -> ``h @ (a * W) + b @ W``: a per-feature affine (a BatchNorm1d after
    an activation in a tabular MLP, an input standardization) folded into the product's weight;
    its shift into a Gemm's C, or the bias Add after a MatMul."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    features = None if weight is None or weight.shape is None else weight.shape
    if features is not None and len(features) == 2:
        k = features[1] if _transposed_weight(node) else features[0]
        reshape = _leading_reshape(node.inputs[0], k) if isinstance(k, int) else None
        if reshape is not None:
            inner = _match_product_input(node, reshape.inputs[0], context)
            if isinstance(inner, Match):
                inner.bindings["reshape"] = reshape
                at = list(inner.nodes).index(node)
                return Match([*inner.nodes[:at], reshape, *inner.nodes[at:]], inner.bindings)
            if inner.candidate:
                return inner
    return _match_product_input(node, node.inputs[0], context)


def _match_product_input(
    node: ir.Node, layer_input: ir.Value | None, context: RewriteContext
) -> Match | Mismatch:
    """_match_product for the affine that produces ``layer_input``."""
    x = _layer_input(layer_input, node.op_type)
    if isinstance(x, Mismatch):
        return x
    if is_op(node, "Gemm") and node.attributes.get_int("transA", 0) == 1:
        return Mismatch("the Gemm reads A transposed (transA=1)")
    kn = _product_weight(node, context)
    if isinstance(kn, Mismatch):
        return kn
    rank = rank_of(x)
    if rank is None:
        return Mismatch("the product's input rank is unknown")
    best = _walk(x, rank, int(kn.shape[0]), rank - 1, False)
    if isinstance(best, Mismatch):
        return best
    wide = kn.astype(np.float64)
    scaled = wide * best.scale[:, None]
    if _transposed_weight(node):
        scaled = scaled.T
    shift = best.shift @ wide  # [N]
    bindings: dict[str, Any] = {"h": best.h}
    nodes = [*best.nodes, node]
    if is_op(node, "Gemm"):
        c = node.inputs[2] if len(node.inputs) > 2 else None
        c_array = np.zeros(1) if c is None else const_array(c)
        if np.any(shift) and c_array is None:
            return Mismatch("the Gemm's C is not a constant (the shift cannot join it)")
        if np.any(shift) and c_array is not None:
            alpha = node.attributes.get_float("alpha", 1.0)
            beta = node.attributes.get_float("beta", 1.0)
            bindings["bias"] = beta * c_array.astype(np.float64) + alpha * shift
    elif np.any(shift):
        add = _bias_add(node, int(kn.shape[1]))
        if add is not None:
            bindings["bias"], bindings["add"] = add[1] + shift, add[0]
            nodes.append(add[0])
        elif len(best.nodes) < 2:
            return Mismatch("the shift would need an Add of its own (nothing saved)")
        else:
            bindings["bias"] = shift
    narrow = narrowed((scaled, bindings.get("bias", np.zeros(1))), kn.dtype)
    if isinstance(narrow, Mismatch):
        return narrow
    bindings["weight"] = narrow[0]
    if "bias" in bindings:
        bindings["bias"] = narrow[1]
    return Match(nodes, bindings)


def _bias_add(matmul: ir.Node, columns: int) -> tuple[ir.Node, np.ndarray] | None:
    """The Add of a constant per-column bias that alone reads ``matmul``'s product."""
    product = matmul.outputs[0]
    if not only_user(product):
        return None
    add = next(iter(product.uses())).node
    rank = rank_of(product)
    if not is_op(add, "Add") or rank is None:
        return None
    bias = per_channel(other_input(add, product), rank, columns, rank - 1)
    return None if isinstance(bias, Mismatch) else (add, bias)


def _rewrite_product(match: Match, context: RewriteContext) -> Replacement:
    layer = next(node for node in match.nodes if node.op_type in ("Gemm", "MatMul"))
    hint = layer.inputs[1].name if layer.inputs[1] is not None else None
    weight = new_constant(match.bindings["weight"], hint)
    constants = [weight]
    bias = None
    if "bias" in match.bindings:
        bias = new_constant(match.bindings["bias"], f"{layer.name or layer.op_type}_bias")
        constants.append(bias)
    inputs = [match.bindings["h"], weight]
    replaced_reshape = match.bindings.get("reshape")
    new_nodes: list[ir.Node] = []
    if replaced_reshape is not None:  # the same Reshape, now of h
        reshape = ir.Node("", "Reshape", [inputs[0], *replaced_reshape.inputs[1:]],
                          replaced_reshape.attributes.values(), name=replaced_reshape.name)  # fmt: skip
        reshape.outputs[0].type = replaced_reshape.outputs[0].type
        reshape.outputs[0].shape = replaced_reshape.outputs[0].shape
        inputs[0] = reshape.outputs[0]
        new_nodes.append(reshape)
    if is_op(layer, "Gemm"):
        attributes = {a.name: a for a in layer.attributes.values()}
        if bias is not None:
            attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        c = bias if bias is not None else (layer.inputs[2] if len(layer.inputs) > 2 else None)
        new = ir.Node("", "Gemm", [*inputs, *([c] if c is not None else [])], attributes.values(),
                      name=layer.name)  # fmt: skip
        return Replacement(
            [*new_nodes, new], [(layer.outputs[0], new.outputs[0])], constants=constants
        )
    product = ir.Node("", "MatMul", inputs, name=layer.name)
    # the product keeps the old one's type and shape (fuse-bias-gelu reads its last dim)
    product.outputs[0].type, product.outputs[0].shape = (
        layer.outputs[0].type,
        layer.outputs[0].shape,
    )
    if bias is None:
        return Replacement(
            [*new_nodes, product], [(layer.outputs[0], product.outputs[0])], constants=constants
        )
    add = ir.Node("", "Add", [product.outputs[0], bias])
    replaced = match.bindings.get("add", layer)
    return Replacement(
        [*new_nodes, product, add], [(replaced.outputs[0], add.outputs[0])], constants=constants
    )


RULES = (Rule("affine+conv->conv", "Conv", _match, _rewrite),)
PRODUCT_RULES = (
    Rule("affine+gemm->gemm", "Gemm", _match_product, _rewrite_product),
    Rule("affine+matmul->matmul", "MatMul", _match_product, _rewrite_product),
)


class FuseAffineConvPass(RulePass):
    """A per-channel Mul/Div/Add/Sub/BatchNormalization chain read by a Conv -> the Conv's weights
    and bias (a pure scale only, where the Conv pads)."""

    name = "fuse-affine-conv"
    summary = (
        "fold a per-channel affine (Mul/Div/Add/Sub, BatchNormalization) that a Conv reads into "
        "the Conv's weights and bias"
    )
    rules = RULES


class FuseAffineMatMulPass(RulePass):
    """A per-feature Mul/Div/Add/Sub/BatchNormalization chain read by a Gemm or a MatMul with a
    constant 2-D weight -> that weight, and the shift into its bias."""

    name = "fuse-affine-matmul"
    summary = (
        "fold a per-feature affine (Mul/Div/Add/Sub, BatchNormalization) that a Gemm or MatMul "
        "with a constant weight reads into the weight and bias"
    )
    rules = PRODUCT_RULES
