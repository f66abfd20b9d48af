"""Fold per-channel affine ops into the producing Conv / ConvTranspose / Gemm / MatMul.

BatchNormalization in inference mode is ``y = x * s + t`` with ``s = gamma / sqrt(var + eps)`` and
``t = beta - mean * s``. After a Conv this folds into the weights: ``W' = W * s`` (per output channel)
and ``b' = b * s + t``. A constant per-channel ``Add`` (``b' = b + c``) or ``Mul`` (``W' = W * c``,
``b' = b * c``) folds the same way, also after a Squeeze of the Conv's spatial axes of size 1
(tf2onnx's Conv1D: a 2-D Conv of height 1, its bias added to the squeezed result). A per-column
scale after a projection by a constant matrix, ``(x @ W + b) * g [+ c]``, folds into W and b at any
rank of x (LayerScale, MobileBERT's NoNorm); the MatMul stays a MatMul. Arithmetic runs in float64 and is rounded once to the weight
dtype (a float16 model's folded weights are not computed in float16); a result that overflows
that dtype (float16's 65504) is refused.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes._shape_facts import axes_param
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, other_input, producer_op, users
from onnxopt.rewrite.rule import MatchFn

_FOLDABLE = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def bn_affine(bn: ir.Node) -> tuple[np.ndarray, np.ndarray] | Mismatch:
    """(s, t) of an inference-mode BatchNormalization with constant statistics."""
    if bn.attributes.get_int("training_mode", 0) != 0:
        return Mismatch("BatchNormalization is in training mode")
    if bn.attributes.get_int("spatial", 1) != 1:
        return Mismatch("BatchNormalization has spatial=0 (per-element statistics)")
    if len(bn.outputs) > 1:
        # Before opset 14 listing the statistics outputs is what selects training mode, used or
        # not (ONNX Runtime then normalizes with the batch's own mean and variance); from 14 on
        # they are allowed only with training_mode=1.
        return Mismatch(
            "BatchNormalization lists its running-statistics outputs: it is in training mode "
            "(normalizes with the batch's statistics)"
        )
    arrays = []
    for label, value in zip(("scale", "B", "mean", "var"), bn.inputs[1:5], strict=False):
        array = const_array(value)
        if array is None:
            return Mismatch(f"BatchNormalization {label} is not a constant")
        if array.ndim != 1:
            return Mismatch(f"BatchNormalization {label} has rank {array.ndim}, expected 1")
        arrays.append(array.astype(np.float64))
    if len({a.shape for a in arrays}) != 1:
        return Mismatch("BatchNormalization statistics differ in length")
    scale, bias, mean, var = arrays
    eps = bn.attributes.get_float("epsilon", 1e-5)
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def per_channel(
    value: ir.Value | None, out_rank: int, channels: int, channel_axis: int
) -> np.ndarray | Mismatch:
    """A constant broadcastable as one number per channel along ``channel_axis`` of the output."""
    array = const_array(value)
    if array is None:
        return Mismatch("the other operand is not a constant", candidate=False)
    if array.ndim > out_rank:
        return Mismatch(f"the constant has rank {array.ndim}, more than the output's {out_rank}")
    shape = (1,) * (out_rank - array.ndim) + array.shape
    for axis, dim in enumerate(shape):
        if axis != channel_axis and dim != 1:
            return Mismatch(
                f"the constant of shape {list(array.shape)} is not per-channel (axis {axis} has {dim})"
            )
    if shape[channel_axis] not in (1, channels):
        return Mismatch(f"the constant has {shape[channel_axis]} channels, the output {channels}")
    return np.broadcast_to(array.reshape(shape[channel_axis]).astype(np.float64), (channels,))


def _producer(value: ir.Value | None) -> ir.Node | Mismatch:
    node = None if value is None else value.producer()
    if node is None or not any(is_op(node, op) for op in _FOLDABLE):
        return Mismatch(
            "input is not produced by Conv, ConvTranspose, Gemm or MatMul", candidate=False
        )
    if users(node.outputs[0]) != 1:
        return Mismatch(f"{node.op_type} output has {users(node.outputs[0])} consumers")
    return node


def weight_to_fold(node: ir.Node, index: int, may_copy: bool) -> np.ndarray | Mismatch:
    value = node.inputs[index] if index < len(node.inputs) else None
    array = const_array(value)
    if value is None or array is None:
        return Mismatch(f"{node.op_type} weight is not a constant")
    if not np.issubdtype(array.dtype, np.floating):
        return Mismatch(f"{node.op_type} weight has dtype {array.dtype}, not floating point")
    sharers = len({use.node for use in value.uses()}) - 1
    # The fused weight is a new tensor; a shared one stays for its other users (the file grows).
    if sharers > 0 and not may_copy:
        return Mismatch(
            f"{node.op_type} weight '{value.name}' is shared with {sharers} other node(s)"
        )
    return array


def _optional_bias(node: ir.Node, index: int, channels: int) -> np.ndarray | Mismatch:
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        return np.zeros(channels)
    array = const_array(value)
    if array is None:
        return Mismatch(f"{node.op_type} bias is not a constant")
    return array.astype(np.float64)


def _scale_layer(node: ir.Node, weight: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The weight with output channel c multiplied by s[c]."""
    w = weight.astype(np.float64)
    if is_op(node, "Conv"):
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    if is_op(node, "ConvTranspose"):
        group = node.attributes.get_int("group", 1)
        c_in, c_out_g = w.shape[0], w.shape[1]
        grouped = w.reshape((group, c_in // group, c_out_g, *w.shape[2:]))
        grouped = grouped * s.reshape((group, 1, c_out_g) + (1,) * (w.ndim - 2))
        return grouped.reshape(w.shape)
    trans_b = is_op(node, "Gemm") and node.attributes.get_int("transB", 0) == 1
    return w * (s[:, None] if trans_b else s[None, :])


def _channels(node: ir.Node, weight: np.ndarray) -> int:
    if is_op(node, "Conv"):
        return int(weight.shape[0])
    if is_op(node, "ConvTranspose"):
        return int(weight.shape[1]) * node.attributes.get_int("group", 1)
    trans_b = is_op(node, "Gemm") and node.attributes.get_int("transB", 0) == 1
    return int(weight.shape[0] if trans_b else weight.shape[1])


def _layer_checks(node: ir.Node, weight: np.ndarray) -> Mismatch | None:
    if is_op(node, "Conv") or is_op(node, "ConvTranspose"):
        if weight.ndim < 3:
            return Mismatch(f"{node.op_type} weight has rank {weight.ndim}")
        return None
    if weight.ndim != 2:
        return Mismatch(f"{node.op_type} weight has rank {weight.ndim}, expected 2")
    a = node.inputs[0]
    if a is None or a.shape is None or len(a.shape) != 2:
        return Mismatch(f"{node.op_type} input rank is not known to be 2")
    return None


def _fold(
    node: ir.Node, root: ir.Node, s: np.ndarray, t: np.ndarray, what: str, may_copy: bool
) -> Match | Mismatch:
    """Match ``root`` (y = x*s + t per channel) onto ``node`` and precompute the new weights."""
    weight_index = 1
    weight = weight_to_fold(node, weight_index, may_copy)
    if isinstance(weight, Mismatch):
        return weight
    problem = _layer_checks(node, weight)
    if problem is not None:
        return problem
    channels = _channels(node, weight)
    if s.shape != (channels,):
        return Mismatch(f"{what} has {s.shape[0]} channels, {node.op_type} produces {channels}")
    if is_op(node, "Gemm"):
        bias = (
            const_array(node.inputs[2])
            if len(node.inputs) > 2 and node.inputs[2] is not None
            else np.zeros(1)
        )
        if bias is None:
            return Mismatch("Gemm C is not a constant")
        beta = node.attributes.get_float("beta", 1.0)
        new_bias = beta * bias.astype(np.float64) * s + t
    else:
        old_bias = _optional_bias(node, 2, channels)
        if isinstance(old_bias, Mismatch):
            return old_bias
        new_bias = old_bias * s + t
    narrow = narrowed((_scale_layer(node, weight, s), new_bias), weight.dtype)
    if isinstance(narrow, Mismatch):
        return narrow
    return Match([node, root], {"weight": narrow[0], "bias": narrow[1]})


def narrowed(
    wide: tuple[np.ndarray, np.ndarray], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray] | Mismatch:
    """Folded (weight, bias), computed in float64, rounded once to the layer's weight dtype; a
    Mismatch where a finite result overflows that dtype (float16's 65504)."""
    with np.errstate(over="ignore"):  # an overflow is refused just below
        weight, bias = (array.astype(dtype) for array in wide)
    for before, after in zip(wide, (weight, bias), strict=True):
        if np.isfinite(before).all() and not np.isfinite(after).all():
            return Mismatch(f"the folded weights overflow {dtype} (the layer's weight type)")
    return weight, bias


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    node, root = match.nodes[0], match.root
    weight = new_constant(match.bindings["weight"], node.inputs[1].name if node.inputs[1] else None)
    bias = new_constant(match.bindings["bias"], f"{node.name or node.op_type}_bias")
    if is_op(node, "MatMul") or is_op(node, "Gemm"):
        attrs = {a.name: a for a in node.attributes.values()} if is_op(node, "Gemm") else {}
        attrs["beta"] = ir.AttrFloat32("beta", 1.0)
        new = ir.Node("", "Gemm", [node.inputs[0], weight, bias], attrs.values(), name=node.name)
    else:
        new = ir.Node(
            "",
            node.op_type,
            [node.inputs[0], weight, bias],
            node.attributes.values(),
            name=node.name,
        )
    squeeze = match.bindings.get("squeeze")
    if squeeze is None:
        return Replacement([new], [(root.outputs[0], new.outputs[0])], constants=[weight, bias])
    after = ir.Node(
        "", "Squeeze", [new.outputs[0], *squeeze.inputs[1:]], squeeze.attributes.values()
    )
    return Replacement(
        [new, after], [(root.outputs[0], after.outputs[0])], constants=[weight, bias]
    )


def _match_bn(op: str) -> MatchFn:
    def match(bn: ir.Node, context: RewriteContext) -> Match | Mismatch:
        if bn.inputs[0] is None or not is_op(bn.inputs[0].producer(), op):
            return Mismatch(f"input is not produced by {op}", candidate=False)
        node = _producer(bn.inputs[0])
        if isinstance(node, Mismatch):
            return node
        affine = bn_affine(bn)
        if isinstance(affine, Mismatch):
            return affine
        return _fold(node, bn, *affine, "BatchNormalization", context.options.fold_may_grow)

    return match


def _match_affine(op: str) -> MatchFn:
    def match(root: ir.Node, context: RewriteContext) -> Match | Mismatch:
        node: ir.Node | Mismatch = Mismatch(
            "no input is produced by Conv or ConvTranspose", candidate=False
        )
        squeeze = operand = None
        for candidate in root.inputs[:2]:
            producer = None if candidate is None else candidate.producer()
            squeezed = _squeezed_conv(producer)
            if squeezed is not None:
                squeeze, producer, candidate = producer, squeezed, squeezed.outputs[0]
            if is_op(producer, "Conv") or is_op(producer, "ConvTranspose"):
                node, operand = _producer(candidate), candidate
                break
        if isinstance(node, Mismatch):
            return node
        weight = const_array(node.inputs[1])
        if weight is None:
            return Mismatch(f"{node.op_type} weight is not a constant")
        channels = _channels(node, weight)
        # Squeezed spatial axes of size 1 leave the channels at axis 1.
        rank = weight.ndim - (len(_squeeze_axes(squeeze, weight.ndim) or ()) if squeeze else 0)
        seen = squeeze.outputs[0] if squeeze is not None else operand
        factor = per_channel(other_input(root, seen), rank, channels, 1)
        if isinstance(factor, Mismatch):
            return factor
        s, t = (np.ones(channels), factor) if op == "Add" else (factor, np.zeros(channels))
        found = _fold(node, root, s, t, op, context.options.fold_may_grow)
        if isinstance(found, Match) and squeeze is not None:
            found.bindings["squeeze"] = squeeze
            found.nodes = [node, squeeze, root]
        return found

    return match


def _match_scaled_linear(root: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``(x @ W [+ b]) * g`` with g one number per output column -> ``x @ (W*g) [+ b*g]``: a
    LayerScale (DINOv2, CaiT, BEiT, ConvNeXt's gamma) or MobileBERT's NoNorm after a projection,
    at any rank of x. The MatMul stays a MatMul (a Gemm would need a 2-D x). A Div by g is a Mul
    by 1/g (the average of twin classifier heads once fuse-parallel-matmuls merged them)."""
    divides = is_op(root, "Div")
    for scaled in root.inputs[:1] if divides else root.inputs[:2]:
        if scaled is None or users(scaled) != 1 or scaled.is_graph_output():
            continue
        bias_add = producer_op(scaled, "Add")
        product: ir.Value | None = scaled
        bias = None
        if bias_add is not None:
            for term in bias_add.inputs[:2]:
                if is_op(term.producer() if term is not None else None, "MatMul"):
                    product, bias = term, other_input(bias_add, term)
                    break
        matmul = producer_op(product, "MatMul")
        if matmul is None or product is None or users(product) != 1 or matmul.inputs[1] is None:
            continue
        weight = weight_to_fold(matmul, 1, context.options.fold_may_grow)
        if isinstance(weight, Mismatch):
            return weight
        if weight.ndim != 2:
            return Mismatch(f"MatMul weight has rank {weight.ndim}, expected 2")
        rank = None if scaled.shape is None else len(scaled.shape)
        if rank is None or rank < 2:
            return Mismatch("the projection's rank is unknown")
        channels = int(weight.shape[1])
        factor = per_channel(other_input(root, scaled), rank, channels, rank - 1)
        if isinstance(factor, Mismatch):
            return factor
        if divides:
            if not np.all(factor != 0):
                return Mismatch("a Div by a constant holding 0")
            factor = 1.0 / factor
        shift = np.zeros(channels)
        if bias is not None:
            found = per_channel(bias, rank, channels, rank - 1)
            if isinstance(found, Mismatch):
                return Mismatch(f"the bias: {found.reason}")
            shift = found
        nodes = [matmul, *([bias_add] if bias_add is not None and bias is not None else []), root]
        shift = shift * factor
        # A per-column shift after the scale (MobileBERT's NoNorm beta) joins the bias.
        after = _single_user(root.outputs[0])
        beta = (
            per_channel(other_input(after, root.outputs[0]), rank, channels, rank - 1)
            if is_op(after, "Add") and after is not None
            else None
        )
        if after is not None and isinstance(beta, np.ndarray):
            nodes.append(after)
            shift = shift + beta
        wide = (weight.astype(np.float64) * factor[None, :], shift)
        with np.errstate(over="ignore"):
            narrow = tuple(array.astype(weight.dtype) for array in wide)
        if not all(np.isfinite(n).all() for n in narrow):
            return Mismatch(f"the folded weights overflow {weight.dtype} (the layer's weight type)")
        has_bias = bias is not None or nodes[-1] is after
        return Match(nodes, {"weight": narrow[0], "bias": narrow[1] if has_bias else None})
    return Mismatch("no operand is a projection by a constant matrix", candidate=False)


def _rewrite_scaled_linear(match: Match, context: RewriteContext) -> Replacement:
    matmul, root = match.nodes[0], match.root
    weight = new_constant(
        match.bindings["weight"], matmul.inputs[1].name if matmul.inputs[1] else None
    )
    product = ir.Node("", "MatMul", [matmul.inputs[0], weight], name=matmul.name)
    nodes, constants = [product], [weight]
    if match.bindings["bias"] is not None:
        bias = new_constant(match.bindings["bias"], f"{matmul.name or 'MatMul'}_bias")
        nodes.append(ir.Node("", "Add", [product.outputs[0], bias]))
        constants.append(bias)
    return Replacement(nodes, [(root.outputs[0], nodes[-1].outputs[0])], constants=constants)


def _single_user(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _squeeze_axes(squeeze: ir.Node | None, rank: int) -> tuple[int, ...] | None:
    axes = axes_param(squeeze, rank) if squeeze is not None else None
    return None if axes is None or isinstance(axes, Mismatch) else axes


def _squeezed_conv(squeeze: ir.Node | None) -> ir.Node | None:
    """The Conv whose spatial axes of size 1 ``squeeze`` alone removes (tf2onnx's Conv1D, a 2-D
    Conv between an Unsqueeze and a Squeeze): a per-channel constant after the Squeeze is one on
    the Conv's channel axis too."""
    if squeeze is None or not is_op(squeeze, "Squeeze") or squeeze.inputs[0] is None:
        return None
    conv = squeeze.inputs[0].producer()
    if conv is None or not (is_op(conv, "Conv") or is_op(conv, "ConvTranspose")):
        return None
    rank = None if conv.outputs[0].shape is None else len(conv.outputs[0].shape)
    axes = _squeeze_axes(squeeze, rank) if rank is not None else None
    if not axes or min(axes) < 2 or users(squeeze.outputs[0]) != 1:
        return None
    return conv


RULES = (
    Rule("conv+bn->conv", "BatchNormalization", _match_bn("Conv"), _rewrite),
    Rule(
        "convtranspose+bn->convtranspose",
        "BatchNormalization",
        _match_bn("ConvTranspose"),
        _rewrite,
    ),
    Rule("gemm+bn->gemm", "BatchNormalization", _match_bn("Gemm"), _rewrite),
    Rule("matmul+bn->gemm", "BatchNormalization", _match_bn("MatMul"), _rewrite),
    Rule("conv+add->conv", "Add", _match_affine("Add"), _rewrite),
    Rule("conv+mul->conv", "Mul", _match_affine("Mul"), _rewrite),
    Rule("matmul+mul->matmul", "Mul", _match_scaled_linear, _rewrite_scaled_linear),
    Rule("matmul+div->matmul", "Div", _match_scaled_linear, _rewrite_scaled_linear),
)


class FuseConvBnPass(RulePass):
    """Fold BatchNormalization (after Conv, ConvTranspose, Gemm, 2-D MatMul) and constant per-channel
    Add/Mul (after Conv, ConvTranspose) into the layer's weights and bias."""

    name = "fuse-conv-bn"
    summary = "fold BatchNormalization and per-channel Add/Mul into the preceding Conv/Gemm weights"
    rules = RULES
