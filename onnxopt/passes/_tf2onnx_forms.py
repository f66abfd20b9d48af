"""Rules that undo tf2onnx's einsum lowering and select arithmetic, for merge-consecutive-ops.

tf2onnx (and Keras 3's ``model.export(format="onnx")``, which calls it) lowers every einsum, as
Keras' MultiHeadAttention and EinsumDense write their projections and scores, without an Einsum
op: each operand is unsqueezed to one axis per letter and transposed to the letters' order, the
batch letters are flattened into one dim for a 3-D MatMul (their product read off the shape with
ReduceProd), and the product is viewed back as 5-D and squeezed. tf2onnx's own transpose
optimizer then turns the scores around: ``K @ Q^T`` with the Softmax over axis 2. The attention
fusions read none of that. Each rule here is one exact step back to the 4-D form they know:

- ``Reshape(MatMul(view(a), view(b)), t)`` with batch-flattening views: the same MatMul with the
  batch dims kept (``_match_batched_matmul_views``);
- ``Squeeze(Reshape(x, t), axes)``: one Reshape to ``t`` without the squeezed 1s;
- ``Transpose(Unsqueeze(x))``: the Unsqueeze moved after the Transpose, where the Reshape that
  reads it absorbs it;
- ``Transpose(Softmax(K @ Q^T + m, axis=-2))``: ``Softmax(Q @ K^T + m^T, axis=-1)``, and
  ``Transpose(MatMul(a, b))`` of two Transposes: ``MatMul(b', a')`` (KerasHub's ``(K @ Q^T)^T``);
- ``Reshape(y, [..., H, d]) + b[H, d]``: the bias added before the view, as a [H*d] vector;
- ``Transpose(Reshape(x, t))`` that moves only 1s: one Reshape;
- ``x + b`` with b a constant [1, ..., 1, N] no wider than x (jax2tf's Dense and LayerNorm
  biases): b as the [N] vector, which broadcasts the same, as the fusions read a bias.

TensorFlow's ``where`` (Keras 3's masks) becomes ``Cast(c) * x + Cast(Not(c)) * k`` in tf2onnx,
and transformers' TF GPT-2 writes its causal mask as ``x * b - 1e4 * (1 - b)``: both are
``Where(c, x, ±k)`` wherever x is finite.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes._shape_facts import axes_param, const_array, const_ints, dims_of, producer_op
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import int64_constant, new_constant, rank_of


def _made_by(value: ir.Value | None) -> ir.Node | None:
    return value.producer() if value is not None else None


def _only_user(value: ir.Value, node: ir.Node) -> bool:
    return not value.is_graph_output() and all(use.node is node for use in value.uses())


def _copy(node: ir.Node, inputs: Sequence[ir.Value | None]) -> ir.Node:
    """``node`` (same op and attributes) on other inputs."""
    return ir.Node(node.domain, node.op_type, list(inputs), list(node.attributes.values()))


def _with_axes(
    node: ir.Node, source: ir.Value, axes: Sequence[int], context: RewriteContext
) -> tuple[ir.Node, list[ir.Value]]:
    """An Unsqueeze/Squeeze like ``node`` on ``source`` with ``axes`` (an attribute where ``node``
    has one or the opset is below 13), and the constants it reads."""
    if "axes" in node.attributes or context.opset() < 13:
        return ir.Node(node.domain, node.op_type, [source], [ir.AttrInt64s("axes", list(axes))]), []
    constant = int64_constant(axes)
    return ir.Node(node.domain, node.op_type, [source, constant]), [constant]


# Batched MatMul on views that flatten the batch -------------------------------------------------


def _batch_flattened(value: ir.Value | None) -> tuple[ir.Node, ir.Value] | None:
    """``Reshape(x, Concat(ReduceProd(g), [-1], k))``: x viewed as [prod(g), M, K] (the Reshape, g)."""
    reshape = value.producer() if value is not None else None
    if reshape is None or not is_op(reshape, "Reshape") or "shape" in reshape.attributes:
        return None
    target = reshape.inputs[1] if len(reshape.inputs) > 1 else None
    concat = target.producer() if target is not None else None
    if concat is None or not is_op(concat, "Concat") or len(concat.inputs) != 3:
        return None
    if concat.attributes.get_int("axis", 0) != 0 or const_ints(concat.inputs[1]) != (-1,):
        return None
    product = _made_by(concat.inputs[0])
    if (
        product is None
        or not is_op(product, "ReduceProd")
        or len(product.inputs) != 1
        or "axes" in product.attributes
        or product.attributes.get_int("keepdims", 1) != 1
    ):
        return None
    batch = product.inputs[0]
    if batch is None or batch.shape is None or len(batch.shape) != 1:
        return None
    count = batch.shape[0]
    if not isinstance(count, int) or count < 2 or not _one_element(concat.inputs[2]):
        return None
    return reshape, batch


def _one_element(value: ir.Value | None) -> bool:
    return value is not None and value.shape is not None and tuple(value.shape) == (1,)


def _batch_operand(value: ir.Value | None) -> tuple[ir.Node | None, ir.Node, ir.Value] | None:
    """A flattened-batch view, or one with its last two axes swapped: (Transpose or None, Reshape, g)."""
    node = value.producer() if value is not None else None
    if node is not None and is_op(node, "Transpose"):
        if tuple(node.attributes.get_ints("perm", ())) != (0, 2, 1):
            return None
        viewed = _batch_flattened(node.inputs[0])
        return None if viewed is None else (node, *viewed)
    viewed = _batch_flattened(value)
    return None if viewed is None else (None, *viewed)


def _match_batched_matmul_views(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Reshape(MatMul(view(a), view(b)), t)`` -> ``Reshape(MatMul(a', b'), t)``, batch dims kept.

    Both operands are [prod(g), M, K] views (one maybe with its last two axes swapped), viewed as
    [*g, M, K] instead. Where their batches ``g`` are one value the (n+2)-D MatMul broadcasts
    nothing over them and its product holds the [prod(g), M, N] one's elements in the same
    order, so ``t`` views the same tensor (see ``_fixed_count_view`` for two values).
    """
    matmul = producer_op(node, "MatMul")
    if isinstance(matmul, Mismatch) or len(matmul.inputs) != 2:
        return Mismatch("not a MatMul between views", candidate=False)
    first, second = (_batch_operand(v) for v in matmul.inputs)
    if first is None or second is None:
        return Mismatch("not a MatMul between views", candidate=False)
    if first[2] is not second[2] and not _fixed_count_view(node):
        return Mismatch(
            "the operands' batch dims are two values and the product's view may take a -1 or 0"
        )
    if not _only_user(matmul.outputs[0], node):
        return Mismatch("the 3-D product has other users")
    return Match([matmul, node], {"views": (first, second)})


def _fixed_count_view(outer: ir.Node) -> bool:
    """The product's view has no -1 and no constant 0: it accepts one element count, whatever
    tensor it is given (dims read at run time are 0 only for an empty tensor).

    Two batched MatMuls of the same operands, 3-D on [P_a, M, K] x [P_b, K, N] and (n+2)-D on
    [*g_a, M, K] x [*g_b, K, N], pair the same rows where g_a == g_b, or where either batch is
    all 1s (both broadcast it). Otherwise, with P_a == P_b (else the 3-D one fails), some g_b
    dim is 1 where g_a's is larger and the other way around, so the (n+2)-D product is larger,
    or the operands do not broadcast: at most one of the two products fits the view.
    """
    target = outer.inputs[1] if len(outer.inputs) > 1 else None
    pieces = _target_pieces(target)
    return pieces is not None and all(
        ints is None or all(i > 0 for i in ints) for _, ints, _ in pieces
    )


def _rewrite_batched_matmul_views(match: Match, context: RewriteContext) -> Replacement:
    matmul, outer = match.nodes
    nodes: list[ir.Node] = []
    minus_one = int64_constant([-1])
    operands = []
    for transpose, reshape, batch in match.bindings["views"]:
        rank = batch.shape[0] + 2
        concat = reshape.inputs[1].producer()
        target = ir.node("Concat", [batch, minus_one, concat.inputs[2]], {"axis": 0})
        view = ir.node("Reshape", [reshape.inputs[0], target.outputs[0]], name=reshape.name)
        nodes += [target, view]
        if transpose is not None:
            perm = [*range(rank - 2), rank - 1, rank - 2]
            nodes.append(
                ir.node("Transpose", [view.outputs[0]], {"perm": perm}, name=transpose.name)
            )
        operands.append(nodes[-1].outputs[0])
    product = ir.node("MatMul", operands, name=matmul.name)
    result = _copy(outer, [product.outputs[0], *outer.inputs[1:]])
    nodes += [product, result]
    return Replacement(nodes, ((outer.outputs[0], result.outputs[0]),), (minus_one,))


# Squeeze∘Reshape --------------------------------------------------------------------------------


def _target_pieces(
    target: ir.Value | None,
) -> list[tuple[ir.Value, tuple[int, ...] | None, int]] | None:
    """A Reshape target as pieces (value, its ints when constant, its length)."""
    if target is None:
        return None
    ints = const_ints(target)
    if ints is not None:
        return [(target, ints, len(ints))]
    concat = target.producer()
    if concat is None or not is_op(concat, "Concat") or concat.attributes.get_int("axis", 0) != 0:
        return None
    pieces = []
    for piece in concat.inputs:
        ints = const_ints(piece) if piece is not None else None
        length = (
            len(ints)
            if ints is not None
            else (
                piece.shape[0]
                if piece is not None and piece.shape is not None and len(piece.shape) == 1
                else None
            )
        )
        if piece is None or not isinstance(length, int):
            return None
        pieces.append((piece, ints, length))
    return pieces


def _match_squeeze_of_reshape(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Squeeze(Reshape(x, t), axes)`` -> ``Reshape(x, t')``: t' is t without the squeezed
    entries, which must be constant 1s (the view's other dims keep their order). No 0 ("copy the
    input's dim") may stand at or after the first squeezed position, where it would copy another."""
    reshape = producer_op(node, "Reshape")
    if isinstance(reshape, Mismatch):
        return Mismatch("not a Squeeze of a Reshape", candidate=False)
    if "shape" in reshape.attributes or reshape.attributes.get_int("allowzero", 0) == 1:
        return Mismatch("the Reshape is a Reshape-1 or allows zeros")
    if not _only_user(reshape.outputs[0], node):
        return Mismatch("the Reshape's view has other users")
    pieces = _target_pieces(reshape.inputs[1] if len(reshape.inputs) > 1 else None)
    if pieces is None:
        return Mismatch(
            "the Reshape target is neither a constant nor a Concat of known-length pieces"
        )
    rank = sum(length for _, _, length in pieces)
    axes = axes_param(node, rank)
    if isinstance(axes, Mismatch) or axes is None:
        return Mismatch("the Squeeze's axes are not known")
    entries: list[int | None] = [x for _, ints, length in pieces for x in (ints or [None] * length)]
    if any(entries[axis] != 1 for axis in axes):
        return Mismatch("a squeezed entry of the target is not a constant 1")
    if 0 in entries[min(axes) :]:
        return Mismatch("a 0 in the target after the squeezed axes would copy another dim")
    return Match([reshape, node], {"pieces": pieces, "axes": set(axes)})


def _rewrite_squeeze_of_reshape(match: Match, context: RewriteContext) -> Replacement:
    reshape, squeeze = match.nodes
    axes, kept, constants, position = match.bindings["axes"], [], [], 0
    for piece, ints, length in match.bindings["pieces"]:
        span = range(position, position + length)
        position += length
        if ints is None or not axes.intersection(span):
            kept.append(piece)
            continue
        left = [x for axis, x in zip(span, ints, strict=True) if axis not in axes]
        if left:
            constants.append(int64_constant(left))
            kept.append(constants[-1])
    if not kept:  # every entry squeezed: a view to a scalar, Reshape(x, [])
        constants.append(int64_constant([]))
        kept.append(constants[-1])
    nodes: list[ir.Node] = []
    if len(kept) > 1:
        nodes.append(ir.node("Concat", kept, {"axis": 0}))
        kept = [nodes[-1].outputs[0]]
    view = _copy(reshape, [reshape.inputs[0], kept[0]])
    nodes.append(view)
    return Replacement(nodes, ((squeeze.outputs[0], view.outputs[0]),), constants)


# Transpose∘Unsqueeze ----------------------------------------------------------------------------


def _match_transpose_of_unsqueeze(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Transpose(Unsqueeze(x, a), p)`` -> ``Unsqueeze(Transpose(x, q), b)``: the new axes are
    of size 1, so where ``p`` puts them (b) is all that moving them decides; q orders x's axes
    as ``p`` orders them. Only where views alone read the result (tf2onnx's einsum operands, which
    the next Reshape absorbs the Unsqueeze into): torch's packed in-projection,
    ``Squeeze(Transpose(Unsqueeze(...)))``, is a spelling fuse-attention reads as it is."""
    unsqueeze = producer_op(node, "Unsqueeze")
    if isinstance(unsqueeze, Mismatch):
        return Mismatch("not a Transpose of an Unsqueeze", candidate=False)
    result = node.outputs[0]
    if result.is_graph_output() or not all(is_op(use.node, "Reshape") for use in result.uses()):
        return Mismatch("the transposed tensor is read by something other than a Reshape")
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        return Mismatch("the Transpose has no perm")
    rank = len(perm)
    axes = axes_param(unsqueeze, rank)
    if isinstance(axes, Mismatch) or axes is None:
        return Mismatch("the Unsqueeze's axes are not known")
    if not _only_user(unsqueeze.outputs[0], node):
        return Mismatch("the Unsqueeze has other users")
    inner = [axis for axis in range(rank) if axis not in axes]
    source_axis = {axis: i for i, axis in enumerate(inner)}
    order = [source_axis[p] for p in perm if p not in axes]
    moved = [i for i, p in enumerate(perm) if p in axes]
    return Match([unsqueeze, node], {"perm": order, "axes": moved})


def _rewrite_transpose_of_unsqueeze(match: Match, context: RewriteContext) -> Replacement:
    unsqueeze, transpose = match.nodes
    source = unsqueeze.inputs[0]
    assert source is not None  # producer_op matched a data input
    nodes: list[ir.Node] = []
    order = match.bindings["perm"]
    if order != sorted(order):
        nodes.append(ir.node("Transpose", [source], {"perm": order}, name=transpose.name))
        source = nodes[-1].outputs[0]
    moved, constants = _with_axes(unsqueeze, source, match.bindings["axes"], context)
    nodes.append(moved)
    return Replacement(nodes, ((transpose.outputs[0], moved.outputs[0]),), constants)


# Transpose∘Softmax over the rows of K @ Q^T ----------------------------------------------------


def _match_transposed_softmax(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Transpose(Softmax(MatMul(a, b) + m, axis=-2), swap)`` -> ``Softmax(MatMul(b', a') + m',
    axis=-1)``, where ' swaps the last two axes: (a b)' = b' a', and the Softmax follows its axis.

    tf2onnx's transpose optimizer computes Keras' attention scores transposed; this turns them
    back to ``Q @ K^T`` (the Transposes it adds cancel against the ones a and b have)."""
    softmax = producer_op(node, "Softmax")
    if isinstance(softmax, Mismatch):
        return Mismatch("not a Transpose of a Softmax", candidate=False)
    rank = rank_of(node.inputs[0])
    perm = node.attributes.get_ints("perm", None)
    if (
        rank is None
        or rank < 3
        or perm is None
        or list(perm) != [*range(rank - 2), rank - 1, rank - 2]
    ):
        return Mismatch(
            "the Transpose does not swap the last two axes of a known rank", candidate=False
        )
    if context.opset() < 13:
        return Mismatch("Softmax before opset 13 normalizes over all axes from its axis on")
    axis = softmax.attributes.get_int("axis", -1)
    if axis + (rank if axis < 0 else 0) != rank - 2:
        return Mismatch("the Softmax is not over the second-to-last axis")
    add = producer_op(softmax, "Add")
    if isinstance(add, Mismatch):
        return Mismatch("the Softmax's input is not an Add")
    for index in (0, 1):
        matmul = _made_by(add.inputs[index])
        mask = add.inputs[1 - index]
        if matmul is not None and is_op(matmul, "MatMul"):
            break
    else:
        return Mismatch("neither Add operand is a MatMul")
    reads = [
        (use.node, value)
        for value, kept in ((add.outputs[0], softmax), (softmax.outputs[0], node))
        for use in value.uses()
        if use.node is not kept
    ]
    if any(v.is_graph_output() for v in (add.outputs[0], softmax.outputs[0])) or any(
        _swapped_read(read, rank) is None for read, _ in reads
    ):
        return Mismatch("the masked scores or the Softmax have users other than dim reads")
    if not _only_user(matmul.outputs[0], add):
        return Mismatch("the scores have other users")
    if any(rank_of(v) != rank for v in (*matmul.inputs, mask)):
        return Mismatch("the MatMul's operands or the mask are not of the Softmax's rank")
    return Match([matmul, add, softmax, node], {"mask": mask, "swap": list(perm), "reads": reads})


def _swapped_read(node: ir.Node, rank: int) -> tuple[int, int] | None:
    """The [start, end) a ``Shape(x, start, end)`` reads off x's transpose (last two axes
    swapped): the same range away from them, the other one of the two alone; None otherwise."""
    if not is_op(node, "Shape"):
        return None
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
    if end <= rank - 2:
        return start, end
    if end - start == 1 and start >= rank - 2:
        other = 2 * rank - 3 - start
        return other, other + 1
    return None


def _rewrite_transposed_softmax(match: Match, context: RewriteContext) -> Replacement:
    matmul, add, softmax, transpose = match.nodes
    swap = match.bindings["swap"]
    a, b = (ir.node("Transpose", [v], {"perm": swap}) for v in matmul.inputs)
    mask = ir.node("Transpose", [match.bindings["mask"]], {"perm": swap})
    product = ir.node("MatMul", [b.outputs[0], a.outputs[0]], name=matmul.name)
    masked = ir.node("Add", [product.outputs[0], mask.outputs[0]], name=add.name)
    normalized = ir.node("Softmax", [masked.outputs[0]], {"axis": len(swap) - 1}, name=softmax.name)
    nodes = [a, b, mask, product, masked, normalized]
    values = [(transpose.outputs[0], normalized.outputs[0])]
    for read, _ in match.bindings["reads"]:  # the dims they read, off the transposed scores
        bounds = _swapped_read(read, len(swap))
        assert bounds is not None
        nodes.append(ir.node("Shape", [masked.outputs[0]], {"start": bounds[0], "end": bounds[1]}))
        values.append((read.outputs[0], nodes[-1].outputs[0]))
    return Replacement(nodes, values)


# Transpose∘MatMul of two Transposes ---------------------------------------------------------------


def _swap(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


def _match_transposed_product(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Transpose(MatMul(a, b), p)`` -> ``Transpose(MatMul(b', a'), swap∘p)``, where ' swaps the
    last two axes: (a b)' = b' a' (the batch dims broadcast as before), so the outer Transpose
    is gone where p is the swap itself. Taken only when a and b are both Transposes, which the
    new ones then merge into, and one Transpose fewer is left: KerasHub's attention computes
    ``(K · Qᵀ)ᵀ``; jax's ``einsum('...hqk,...khd->...qhd')`` through tf2onnx computes
    ``(Vᵀ · Pᵀ)`` moved to [B, S, H, d], which is ``P · V`` with its heads moved back."""
    matmul = producer_op(node, "MatMul")
    if isinstance(matmul, Mismatch) or len(matmul.inputs) != 2:
        return Mismatch("not a Transpose of a MatMul", candidate=False)
    rank = rank_of(node.inputs[0])
    perm = node.attributes.get_ints("perm", None)
    if rank is None or rank < 2 or perm is None or sorted(perm) != list(range(rank)):
        return Mismatch("not a Transpose of known rank", candidate=False)
    operands = [_made_by(v) for v in matmul.inputs]
    ranks = [rank_of(v) for v in matmul.inputs]
    if any(o is None or not is_op(o, "Transpose") for o in operands) or any(
        r is None or r < 2 for r in ranks
    ):
        return Mismatch("the MatMul's operands are not both Transposes of known rank")
    swap = _swap(rank)
    outer = [swap[axis] for axis in perm]
    if list(perm) != swap and not any(
        o is not None and list(o.attributes.get_ints("perm", ())) == _swap(r or 0)
        for o, r in zip(operands, ranks, strict=True)
    ):
        return Mismatch("no Transpose would cancel: the Transposes' count would not drop")
    if not _only_user(matmul.outputs[0], node) or not all(
        _only_user(v, matmul) for v in matmul.inputs if v is not None
    ):
        return Mismatch("the product or its operands have other users")
    return Match([matmul, node], {"ranks": ranks, "outer": outer})


def _rewrite_transposed_product(match: Match, context: RewriteContext) -> Replacement:
    matmul, transpose = match.nodes
    a, b = (
        ir.node("Transpose", [value], {"perm": _swap(rank)})
        for value, rank in zip(matmul.inputs, match.bindings["ranks"], strict=True)
    )
    product = ir.node("MatMul", [b.outputs[0], a.outputs[0]], name=matmul.name)
    outer = match.bindings["outer"]
    if outer == sorted(outer):
        return Replacement((a, b, product), ((transpose.outputs[0], product.outputs[0]),))
    moved = ir.node("Transpose", [product.outputs[0]], {"perm": outer})
    return Replacement((a, b, product, moved), ((transpose.outputs[0], moved.outputs[0]),))


# Add∘Reshape: a bias on split heads ---------------------------------------------------------------


def _match_bias_after_split(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Reshape(y, [..., H, d]) + b`` with a constant b of shape [H, d] (or [d]) and y's last dim
    H*d: ``Reshape(y + b.reshape(H*d), [..., H, d])``, the bias of an EinsumDense added where
    a Dense adds it. Row-major, element i of the view is element i of y, and its index in the
    view's last two dims is i mod H*d, its index in y's last dim: it meets the same bias value."""
    for index in (0, 1):
        view = _made_by(node.inputs[index])
        bias = const_array(node.inputs[1 - index])
        if view is not None and is_op(view, "Reshape") and bias is not None:
            break
    else:
        return Mismatch("not a constant added to a Reshape", candidate=False)
    if bias.ndim < 1 or bias.ndim > 2:
        return Mismatch("the bias is not a vector or a matrix", candidate=False)
    source, out = view.inputs[0], view.outputs[0]
    source_dims, out_dims = dims_of(source), dims_of(out)
    if source_dims is None or out_dims is None or not source_dims or len(out_dims) < bias.ndim:
        return Mismatch("the view's ranks are not known")
    width = source_dims[-1]
    tail = out_dims[len(out_dims) - bias.ndim :]
    if width is None or None in tail or tuple(tail) != bias.shape:
        return Mismatch("the bias is not the shape of the view's last dims")
    heads = out_dims[len(out_dims) - 2 :] if len(out_dims) >= 2 else None
    if heads is None or heads[0] is None or heads[1] is None or heads[0] * heads[1] != width:
        return Mismatch("the view does not split the input's last dim into its last two")
    if not _only_user(out, node):
        return Mismatch("the view has other users")
    full = np.broadcast_to(bias, (heads[0], heads[1])).reshape(width)
    return Match([view, node], {"bias": full, "source": source})


def _rewrite_bias_after_split(match: Match, context: RewriteContext) -> Replacement:
    view, add = match.nodes
    bias = new_constant(match.bindings["bias"], None)
    biased = ir.node("Add", [match.bindings["source"], bias], name=add.name)
    result = _copy(view, [biased.outputs[0], *view.inputs[1:]])
    return Replacement((biased, result), ((add.outputs[0], result.outputs[0]),), (bias,))


# Element-wise op of a [1, ..., 1, N] constant ---------------------------------------------------


def _match_padded_vector(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``op(x, b)`` (Add/Sub/Mul/Div, either side) with b a constant [1, ..., 1, N], N > 1, of
    rank at most x's: b as the [N] vector broadcasts to the same shape and values (the leading
    1s meet dims x already has)."""
    if len(node.inputs) != 2:
        return Mismatch("not a binary op", candidate=False)
    for index in (0, 1):
        array = const_array(node.inputs[index])
        if array is None or array.ndim < 2 or array.shape[-1] < 2 or array.size != array.shape[-1]:
            continue
        rank = rank_of(node.inputs[1 - index])
        if rank is None or array.ndim > rank:
            return Mismatch("the constant's leading 1s raise the other operand's rank")
        return Match([node], {"index": index, "vector": array.reshape(-1)})
    return Mismatch("no operand is a constant [1, ..., 1, N]", candidate=False)


def _rewrite_padded_vector(match: Match, context: RewriteContext) -> Replacement:
    (node,) = match.nodes
    vector = new_constant(match.bindings["vector"], node.inputs[match.bindings["index"]].name)
    inputs = list(node.inputs)
    inputs[match.bindings["index"]] = vector
    result = _copy(node, inputs)
    return Replacement((result,), ((node.outputs[0], result.outputs[0]),), (vector,))


# Transpose∘Reshape that moves no element ----------------------------------------------------------


def _match_transposed_view(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Transpose(Reshape(x, t), p)`` -> ``Reshape(x, t permuted by p)`` when the Transpose only
    moves axes of size 1 past others (the elements keep their order: it is a view too); t is a
    constant whose 0s ("copy the input's dim") stay where they are."""
    view = producer_op(node, "Reshape")
    if isinstance(view, Mismatch):
        return Mismatch("not a Transpose of a Reshape", candidate=False)
    dims = dims_of(view.outputs[0])
    perm = node.attributes.get_ints("perm", None)
    target = const_ints(view.inputs[1]) if len(view.inputs) > 1 else None
    if dims is None or perm is None or target is None or len(target) != len(perm):
        return Mismatch("the Transpose's perm or the Reshape's constant target is not known")
    if [axis for axis in perm if dims[axis] != 1] != sorted(a for a in perm if dims[a] != 1):
        return Mismatch("the Transpose moves axes that are not provably of size 1", candidate=False)
    if any(target[axis] == 0 and perm[axis] != axis for axis in range(len(perm))):
        return Mismatch("a 0 in the target would copy another dim once moved")
    if "shape" in view.attributes or not _only_user(view.outputs[0], node):
        return Mismatch("the Reshape is a Reshape-1 or has other users")
    return Match([view, node], {"target": [target[axis] for axis in perm]})


def _rewrite_transposed_view(match: Match, context: RewriteContext) -> Replacement:
    view, transpose = match.nodes
    target = int64_constant(match.bindings["target"])
    result = _copy(view, [view.inputs[0], target])
    return Replacement((result,), ((transpose.outputs[0], result.outputs[0]),), (target,))


# tf.where lowered to arithmetic ---------------------------------------------------------------------


def _flag(value: ir.Value | None) -> tuple[ir.Value, ir.Node | None] | None:
    """A 0/1 float tensor: ``Cast(c)`` of a boolean c, or a Reshape of one (c, the Reshape)."""
    node = _made_by(value)
    view = None
    if node is not None and is_op(node, "Reshape") and "shape" not in node.attributes:
        view, node = node, _made_by(node.inputs[0])
    if node is None or not is_op(node, "Cast") or not node.inputs:
        return None
    condition = node.inputs[0]
    if condition is None or condition.dtype != ir.DataType.BOOL:
        return None
    return condition, view


def _gated(value: ir.Value | None) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """``f * v`` (either order) with f a 0/1 flag (``_flag``): (the Mul, f, v)."""
    node = _made_by(value)
    if node is None or not is_op(node, "Mul") or len(node.inputs) != 2:
        return None
    for index in (0, 1):
        flag, other = node.inputs[index], node.inputs[1 - index]
        if flag is not None and other is not None and _is_gate(flag):
            return node, flag, other
    return None


def _is_gate(value: ir.Value) -> bool:
    """A 0/1 flag, or ``1 - flag``."""
    if _flag(value) is not None:
        return True
    node = value.producer()
    return (
        node is not None
        and is_op(node, "Sub")
        and node.inputs[1] is not None
        and _flag(node.inputs[1]) is not None
        and _complement(value, node.inputs[1])
    )


def _complement(value: ir.Value, of: ir.Value) -> bool:
    """``value`` is 1 - ``of`` for the flag ``of``: ``Sub(1, of)``, or ``Cast(Not(c))`` where
    ``of`` is ``Cast(c)``."""
    node = value.producer()
    if node is not None and is_op(node, "Sub") and node.inputs[1] is of:
        one = const_array(node.inputs[0])  # no wider than the flag, else it raises the rank
        return (
            one is not None
            and one.size == 1
            and one.ndim <= (rank_of(of) or 0)
            and bool(one.reshape(-1)[0] == 1)
        )
    flag, negated = _flag(of), _flag(value)
    if flag is None or negated is None or flag[1] is not None or negated[1] is not None:
        return False
    inverse = negated[0].producer()
    return inverse is not None and is_op(inverse, "Not") and inverse.inputs[0] is flag[0]


def _match_select(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``f * x ± (1 - f) * k`` -> ``Where(c, x, ±k)`` for a 0/1 flag f = Cast(c) (or a view of
    one) and a one-element constant k: how tf2onnx writes TensorFlow's ``where`` (Keras 3's
    masks, ``Cast(c) * x + Cast(Not(c)) * k``) and transformers' TF GPT-2 writes its causal mask
    (``x * b - 1e4 * (1 - b)``). Where c holds the result is x ± k*0 = x, elsewhere x*0 ± k = ±k:
    the same values wherever x is finite (the product's 0 * inf would be NaN, where a select
    gives k). On integers the other value may be any tensor y: ``f * x + (1 - f) * y`` is x or y
    exactly (Keras 3's ``take``, ``where(ids < 0, ids + n, ids)`` in every embedding)."""
    if len(node.inputs) != 2:
        return Mismatch("not a sum of two flag-gated products", candidate=False)
    one, two = _gated(node.inputs[0]), _gated(node.inputs[1])
    if one is None or two is None:
        return Mismatch("not a sum of two flag-gated products", candidate=False)
    (first, flag_a, a), (second, flag_b, b) = one, two
    if _flag(flag_a) is not None and _complement(flag_b, flag_a):
        flag, chosen, other, kept = flag_a, a, b, first
    elif _flag(flag_b) is not None and _complement(flag_a, flag_b) and node.op_type == "Add":
        flag, chosen, other, kept = flag_b, b, a, second
    else:
        return Mismatch("the two gates are not a flag and its complement", candidate=False)
    constant = const_array(other)
    if constant is None and node.op_type == "Add" and _integers(chosen, other, flag):
        # Keras 3's take(): where(ids < 0, ids + n, ids) on integers, where f*x + (1-f)*y is
        # x or y exactly (no inf, no NaN, 0*y is 0)
        return Match([first, second, node], {"flag": flag, "chosen": chosen, "other": other})
    if constant is None or constant.size != 1 or not np.isfinite(constant).all():
        return Mismatch("the value chosen where the flag is 0 is not one finite constant")
    if constant.ndim > max(rank_of(chosen) or 0, rank_of(flag) or 0):
        return Mismatch("the constant would raise the result's rank")
    # The constant's product does not depend on x: layers may share it (KerasHub's masks).
    if not _only_user(kept.outputs[0], node):
        return Mismatch("the gated product of x has other users")
    sign = -1 if node.op_type == "Sub" else 1
    return Match(
        [first, second, node],
        {"flag": flag, "chosen": chosen, "other": sign * constant.reshape(())},
    )


def _integers(*values: ir.Value) -> bool:
    """Every value is of one integer type (the flag cast to it as well)."""
    dtype = values[0].dtype
    return dtype is not None and dtype.is_integer() and all(v.dtype == dtype for v in values)


def _rewrite_select(match: Match, context: RewriteContext) -> Replacement:
    found = _flag(match.bindings["flag"])
    assert found is not None
    condition, view = found
    nodes: list[ir.Node] = []
    if view is not None:  # the same view of the condition itself
        nodes.append(_copy(view, [condition, *view.inputs[1:]]))
        condition = nodes[-1].outputs[0]
    other = match.bindings["other"]
    constants: tuple[ir.Value, ...] = ()
    if not isinstance(other, ir.Value):
        other = new_constant(np.asarray(other), None)
        constants = (other,)
    nodes.append(
        ir.node("Where", [condition, match.bindings["chosen"], other], name=match.root.name)
    )
    return Replacement(nodes, ((match.root.outputs[0], nodes[-1].outputs[0]),), constants)


TF2ONNX_RULES: tuple[Rule, ...] = (
    *(
        Rule(f"f*x{sign}(1-f)*k->Where", op, _match_select, _rewrite_select)
        for op, sign in (("Add", "+"), ("Sub", "-"))
    ),
    Rule(
        "Transpose∘Reshape->Reshape", "Transpose", _match_transposed_view, _rewrite_transposed_view
    ),
    Rule(
        "Reshape∘MatMul∘batch views",
        "Reshape",
        _match_batched_matmul_views,
        _rewrite_batched_matmul_views,
    ),
    Rule("Squeeze∘Reshape", "Squeeze", _match_squeeze_of_reshape, _rewrite_squeeze_of_reshape),
    Rule(
        "Transpose∘Unsqueeze->Unsqueeze∘Transpose",
        "Transpose",
        _match_transpose_of_unsqueeze,
        _rewrite_transpose_of_unsqueeze,
    ),
    Rule(
        "Transpose∘MatMul(Transposes)->MatMul",
        "Transpose",
        _match_transposed_product,
        _rewrite_transposed_product,
    ),
    Rule(
        "Transpose∘Softmax(K@Q^T)->Softmax(Q@K^T)",
        "Transpose",
        _match_transposed_softmax,
        _rewrite_transposed_softmax,
    ),
    Rule(
        "Add(Reshape, bias)->Reshape(Add)",
        "Add",
        _match_bias_after_split,
        _rewrite_bias_after_split,
    ),
    *(
        Rule(
            f"{op}(x, [1, ..., N])->{op}(x, [N])", op, _match_padded_vector, _rewrite_padded_vector
        )
        for op in ("Add", "Sub", "Mul", "Div")
    ),
)
