"""Multi-query attention on query heads folded into the rows, respelled for fuse-attention.

GPT-BigCode as transformers 4.x wrote it (SantaCoder, StarCoder: most of its ONNX exports) attends
with one K/V head by folding the H query heads into the rows of a batched matmul::

    q3 = Reshape(q [B, S, H*d], [B, S*H, d])               row s*H + h: head h of position s
    s3 = q3 @ Transpose(k [B, T, d], [0, 2, 1]) * c         [B, S*H, T]  (baddbmm)
    s4 = Reshape(s3, [B, S, H, T]), its mask steps (Where, Add), Softmax over T
    y  = Reshape(Reshape(p4, [B, S*H, T]) @ v [B, T, d], [B, S, H*d])

(TorchScript adds baddbmm's ``beta * input`` as a tensor of zeros the size of s3.) Row-major,
[B, S*H, d] is [B, S, H, d] with S and H merged, so the same values are::

    q4 = Transpose(Reshape(q, [0, 0, H, d]), [0, 2, 1, 3])          [B, H, S, d]
    s  = q4 @ Transpose(Unsqueeze(k, 1), [0, 1, 3, 2]) * c          [B, H, S, T], k broadcast
    the mask steps on s, each operand moved from [B, S, H, T] to [B, H, S, T]
    y  = Reshape(Transpose(Softmax(...) @ Unsqueeze(v, 1), [0, 2, 1, 3]), [0, 0, -1])

the multi-query form fuse-attention reads from Falcon (one K/V head that both products broadcast).
The Softmax is over T either way; moving S and H commutes with it and with element-wise steps,
and adding zeros changes no score (x + 0 == x, -0 aside, which exp does not see). A mask given
its head axis by ``Unsqueeze(m, 2)`` ([B, S, 1, T]) is unsqueezed on axis 1 instead, which keeps
the cut of a causal buffer readable for fuse-group-query-attention. :func:`unfold` puts that
spelling in place of y before the attention rule runs (the original block, left unread, is then
no candidate: :func:`respelled`); :func:`restore` takes it back where no block was fused, so an
unfused graph is exactly the graph that came in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, constant_of_shape_fill, is_op, opset_version
from onnxopt.passes._attention_shapes import (
    Entry,
    annotate,
    int64_const,
    last_dim,
    piece_entries,
    producer_of,
    same_dim,
    softmax_axis,
    static_dim,
    transpose_perm,
    value_rank,
    view_entries,
    with_axes,
)
from onnxopt.passes._seq_first_heads import drop_unread
from onnxopt.passes._shape_facts import axes_param

_MOVE = [0, 2, 1, 3]  # [B, S, H, T] <-> [B, H, S, T]
# Element-wise steps between the scores' view and the Softmax (a mask added or filled in).
_STEPS = ("Add", "Where")


@dataclass(frozen=True)
class _Block:
    """One multi-query block on query rows, as found (the module docstring's names)."""

    q: ir.Value
    k: ir.Value
    v: ir.Value
    heads: int
    size: int
    scales: tuple[tuple[ir.Node, int], ...]  # Mul/Div of s3 by a constant (s3's input), in order
    steps: tuple[tuple[ir.Node, int], ...]  # mask steps on s4 and the input the scores enter at
    softmax: ir.Node
    merge: ir.Node  # the final Reshape to [B, S, H*d]
    nodes: tuple[ir.Node, ...]  # every node of the block, in order


@dataclass(frozen=True)
class Unfolded:
    """One respelled block: y and its stand-in, the stand-in's Softmax, and the nodes of each
    spelling (in order)."""

    original: ir.Value
    stand_in: ir.Value
    softmax: ir.Node  # the stand-in's Softmax: gone once the block is fused
    old: tuple[ir.Node, ...]
    new: tuple[ir.Node, ...]


def _kept(entry: Entry | None, source: ir.Value, index: int, allowzero: bool) -> bool:
    """A view's entry copies or reads dim ``index`` of ``source`` (a literal 0 copies it)."""
    if entry == 0 and not allowzero:
        return True
    return entry is not None and entry != -1 and same_dim(entry, source, index)


def _ends_in(
    view: ir.Node, source: ir.Value, batch: ir.Value, last: int | tuple[ir.Value, int]
) -> bool:
    """``view`` (a Reshape of ``source`` to rank 3) keeps the batch (``source``'s dim 0, or proved
    ``batch``'s) and ends in ``last`` (a size, or a dim of a tensor): the element count then fixes
    the dim between."""
    entries = view_entries(view.outputs[0])
    if entries is None or len(entries) != 3:
        return False
    allowzero = bool(view.attributes.get_int("allowzero", 0))
    if not (_kept(entries[0], source, 0, allowzero) or _kept(entries[0], batch, 0, allowzero)):
        return False
    if isinstance(last, int):
        read = entries[2]  # the size, or a read of a dim of that static size
        return read == last or (isinstance(read, tuple) and static_dim(read[1], read[2]) == last)
    return _kept(entries[2], last[0], last[1], allowzero=True)


def _one_entry(piece: ir.Value | None) -> Entry | None:
    entries = piece_entries(piece)
    return entries[0] if entries is not None and len(entries) == 1 else None


def _zeros_of_scores(value: ir.Value | None, rows_view: ir.Node, k: ir.Value) -> bool:
    """``value`` is baddbmm's zeros of the scores' shape, ``ConstantOfShape([B, S*H, T])`` (or of
    ``Shape(ConstantOfShape(...))``, the exported ``empty``): B and T proved, S*H the very piece the
    query rows were viewed with, so adding it broadcasts nothing."""
    node = producer_of(value, "ConstantOfShape")
    if node is None or node.inputs[0] is None:
        return False
    if not bool(np.all(constant_of_shape_fill(node) == 0)):
        return False
    shape: ir.Value | None = node.inputs[0]
    reader = producer_of(shape, "Shape")
    if reader is not None:
        inner = producer_of(reader.inputs[0], "ConstantOfShape")
        plain = not reader.attributes.get("start") and reader.attributes.get("end") is None
        shape = inner.inputs[0] if inner is not None and plain else None
    pieces, rows = producer_of(shape, "Concat"), producer_of(rows_view.inputs[1], "Concat")
    query = rows_view.inputs[0]
    if pieces is None or rows is None or query is None or len(pieces.inputs) != 3:
        return False
    if len(rows.inputs) != 3 or pieces.inputs[1] is not rows.inputs[1]:
        return False
    batch, length = _one_entry(pieces.inputs[0]), _one_entry(pieces.inputs[2])
    return (
        pieces.inputs[0] is rows.inputs[0]
        or (batch is not None and batch not in (0, -1) and same_dim(batch, query, 0))
    ) and (length is not None and length not in (0, -1) and same_dim(length, k, 1))


def _constant_factor(node: ir.Node) -> int | None:
    """The input of a Mul (either side) or Div (divisor) that is a float scalar constant."""
    for index in (1, 0) if node.op_type == "Mul" else (1,):
        array = const_array(node.inputs[index])
        if array is not None and array.size == 1 and np.issubdtype(array.dtype, np.floating):
            return index
    return None


def _scores_view(value: ir.Value | None) -> bool:
    node = producer_of(value, "Reshape")
    return node is not None and value_rank(value) == 4 and value_rank(node.inputs[0]) == 3


def _leads_to_view(value: ir.Value | None, depth: int = 0) -> bool:
    """``value`` is the scores' [B, S, H, T] view, or a mask step over it."""
    if _scores_view(value):
        return True
    node = value.producer() if value is not None else None
    if node is None or node.op_type not in _STEPS or node.domain != "" or depth > 8:
        return False
    return any(_leads_to_view(operand, depth + 1) for operand in node.inputs)


def _mask_steps(softmax: ir.Node) -> tuple[list[tuple[ir.Node, int]], ir.Node] | None:
    """The mask steps from the scores' [B, S, H, T] view up to ``softmax`` (each with the input
    the scores enter at), in order, and the view."""
    steps: list[tuple[ir.Node, int]] = []
    value = softmax.inputs[0]
    while not _scores_view(value):
        node = value.producer() if value is not None else None
        if node is None or node.op_type not in _STEPS or node.domain != "":
            return None
        ranks = [value_rank(x) for x in node.inputs]
        along = [i for i, operand in enumerate(node.inputs) if _leads_to_view(operand)]
        if len(along) != 1 or any(rank is None or rank > 4 for rank in ranks):
            return None
        steps.append((node, along[0]))
        value = node.inputs[along[0]]
    view = value.producer() if value is not None else None
    return (steps[::-1], view) if view is not None else None


def _scaled_product(
    scores: ir.Value | None,
) -> tuple[ir.Node, list[tuple[ir.Node, int]], tuple[ir.Node, int] | None] | None:
    """``scores`` = MatMul(rows, key^T) times or over constants, with at most one Add of zeros
    (baddbmm's): (the MatMul, the scalings in order with the scores' input, the Add and its
    zeros' input)."""
    scales: list[tuple[ir.Node, int]] = []
    zeros: tuple[ir.Node, int] | None = None
    node = scores.producer() if scores is not None else None
    while node is not None and not is_op(node, "MatMul"):
        factor = _constant_factor(node) if node.op_type in ("Mul", "Div") else None
        if factor is not None:
            scales.append((node, 1 - factor))
            scores = node.inputs[1 - factor]
        elif is_op(node, "Add") and zeros is None and len(node.inputs) == 2:
            side = 0 if producer_of(node.inputs[0], "ConstantOfShape") is not None else 1
            zeros = (node, side)
            scores = node.inputs[1 - side]
        else:
            return None
        if scores is None or len(scores.uses()) != 1 or scores.is_graph_output():
            return None
        node = scores.producer()
    return (node, scales[::-1], zeros) if node is not None else None


def _find(softmax: ir.Node) -> _Block | None:
    """The block around ``softmax`` (the module docstring), or None."""
    probs = softmax.outputs[0]
    graph = softmax.graph
    opset = (opset_version(graph) if graph is not None else None) or 13
    if softmax_axis(softmax, opset) not in (-1, 3) or value_rank(probs) != 4:
        return None
    # down: Reshape(p4, [B, S*H, T]) @ v, viewed as [B, S, H*d]
    flat = _only_reader(probs, "Reshape")
    product = _only_reader(flat.outputs[0], "MatMul") if flat is not None else None
    if flat is None or product is None or product.inputs[0] is not flat.outputs[0]:
        return None
    v, context = product.inputs[1], product.outputs[0]
    merge = _only_reader(context, "Reshape")
    if v is None or merge is None or value_rank(v) != 3 or merge.outputs[0].is_graph_output():
        return None  # (a graph output keeps its name: not moved to a stand-in)
    # up: the mask steps, the [B, S, H, T] view, the scaled product of the rows and key^T
    found = _mask_steps(softmax)
    if found is None:
        return None
    steps, view = found
    entries = view_entries(view.outputs[0])
    heads = entries[2] if entries is not None and len(entries) == 4 else None
    product_found = _scaled_product(view.inputs[0])
    if entries is None or not isinstance(heads, int) or heads <= 1 or product_found is None:
        return None
    matmul, scales, zeros = product_found
    rows, key_t = matmul.inputs
    rows_view, transposed = producer_of(rows, "Reshape"), producer_of(key_t, "Transpose")
    if rows_view is None or transposed is None or transpose_perm(transposed) != [0, 2, 1]:
        return None
    q, k = rows_view.inputs[0], transposed.inputs[0]
    size, width = last_dim(rows), last_dim(q)
    if q is None or k is None or size is None or width is None or width != heads * size:
        return None
    if last_dim(k) != size or last_dim(v) != size or value_rank(k) != 3:
        return None
    if zeros is not None and not _zeros_of_scores(zeros[0].inputs[zeros[1]], rows_view, k):
        return None
    # every intermediate is read only inside the block
    inner = [rows, matmul.outputs[0], view.outputs[0], probs, flat.outputs[0], context]
    inner += [step.outputs[0] for step, _ in steps]
    if any(x is None or len(x.uses()) != 1 or x.is_graph_output() for x in inner):
        return None
    # the views: q as rows [B, S*H, d], s3 as [B, S, H, T], p4 back as rows, y as [B, S, H*d]
    allowzero = bool(view.attributes.get_int("allowzero", 0))
    if not (_kept(entries[0], q, 0, allowzero) and _kept(entries[3], k, 1, allowzero)):
        return None
    if not (_ends_in(rows_view, q, q, size) and _ends_in(flat, probs, q, (k, 1))):
        return None
    if not _ends_in(merge, context, q, width):
        return None
    nodes = [rows_view, transposed, matmul, *(n for n, _ in scales)]
    nodes += [*([zeros[0]] if zeros else []), view]
    nodes += [*(step for step, _ in steps), softmax, flat, product, merge]
    return _Block(q, k, v, heads, size, tuple(scales), tuple(steps), softmax, merge, tuple(nodes))


def _only_reader(value: ir.Value, op_type: str) -> ir.Node | None:
    users = list(value.uses())
    node = users[0].node if len(users) == 1 and not value.is_graph_output() else None
    return node if is_op(node, op_type) else None


def _head_axis_added(value: ir.Value) -> ir.Value | None:
    """x when ``value`` (rank 4) is ``Unsqueeze(x, [2])``: a [B, S, T] mask given its head axis."""
    node = producer_of(value, "Unsqueeze")
    if node is None or node.inputs[0] is None or value_rank(node.inputs[0]) != 3:
        return None
    return node.inputs[0] if axes_param(node, 4) == (2,) else None


def _moved(shape: ir.Shape | None) -> list[int | ir.SymbolicDim | None]:
    """A [B, S, H, T] shape's dims in [B, H, S, T] order."""
    if shape is None or len(shape) != 4:
        return [None] * 4
    dims = list(shape)
    return [dims[axis] for axis in _MOVE]


def _operand(tape: ir.tape.Tape, value: ir.Value, opset: int) -> ir.Value:
    """A mask step's operand of the [B, S, H, T] scores, made an operand of the [B, H, S, T] ones:
    ranks 0 and 1 broadcast along T alone and stay; others are brought to rank 4, then moved."""
    rank = value_rank(value)
    if rank is not None and rank <= 1:
        return value
    assert rank is not None  # _find checks every operand's rank
    dims: list[int | ir.SymbolicDim | None] = [None] * rank
    if value.shape is not None:
        dims = list(value.shape)
    inner = _head_axis_added(value)
    if inner is not None:
        # [B, S, 1, T] made by an Unsqueeze on the head axis: unsqueezed on the other one
        moved = with_axes(tape, "Unsqueeze", inner, [1], opset)
        annotate(moved, value, _moved(ir.Shape(dims)))
        return moved
    four = value
    if rank < 4:
        four = with_axes(tape, "Unsqueeze", value, list(range(4 - rank)), opset)
        dims = [*([1] * (4 - rank)), *dims]
        annotate(four, value, dims)
    moved = tape.op("Transpose", [four], {"perm": _MOVE})
    annotate(moved, value, _moved(ir.Shape(dims)))
    return moved


def _stand_in(block: _Block, opset: int) -> tuple[ir.Value, ir.Node, list[ir.Node]]:
    """y respelled on [B, H, S, d] heads (the module docstring): (y's stand-in, its Softmax, the
    nodes in order)."""
    tape = ir.tape.Tape()
    q, k, v, heads, size = block.q, block.k, block.v, block.heads, block.size
    qd = list(q.shape) if q.shape is not None else [None] * 3
    kd = list(k.shape) if k.shape is not None else [None] * 3
    vd = list(v.shape) if v.shape is not None else [None] * 3
    split = tape.op("Reshape", [q, int64_const(tape, [0, 0, heads, size])])
    annotate(split, q, [qd[0], qd[1], heads, size])
    query = tape.op("Transpose", [split], {"perm": _MOVE})
    annotate(query, q, [qd[0], heads, qd[1], size])
    key = with_axes(tape, "Unsqueeze", k, [1], opset)
    annotate(key, k, [kd[0], 1, kd[1], size])
    key_t = tape.op("Transpose", [key], {"perm": [0, 1, 3, 2]})
    annotate(key_t, k, [kd[0], 1, size, kd[1]])
    scores = tape.op("MatMul", [query, key_t])
    annotate(scores, q, [qd[0], heads, qd[1], kd[1]])
    for scale, at in block.scales:
        inputs = [scores if i == at else x for i, x in enumerate(scale.inputs)]
        scores = tape.op(scale.op_type, inputs)
        annotate(scores, q, [qd[0], heads, qd[1], kd[1]])
    for step, at in block.steps:
        inputs = [
            scores if i == at else None if x is None else _operand(tape, x, opset)
            for i, x in enumerate(step.inputs)
        ]
        scores = tape.op(step.op_type, inputs)
        annotate(scores, step.outputs[0], _moved(step.outputs[0].shape))
    softmax = tape.op("Softmax", [scores], {"axis": -1})
    annotate(softmax, scores, list(scores.shape or [None] * 4))
    value = with_axes(tape, "Unsqueeze", v, [1], opset)
    annotate(value, v, [vd[0], 1, vd[1], size])
    context = tape.op("MatMul", [softmax, value])
    annotate(context, v, [qd[0], heads, qd[1], size])
    rows = tape.op("Transpose", [context], {"perm": _MOVE})
    annotate(rows, v, [qd[0], qd[1], heads, size])
    merged = tape.op("Reshape", [rows, int64_const(tape, [0, 0, -1])])
    original = block.merge.outputs[0]
    annotate(merged, original, list(original.shape or [None] * 3))
    softmax_node = softmax.producer()
    assert softmax_node is not None
    return merged, softmax_node, list(tape.nodes)


def respelled(softmax: ir.Node) -> bool:
    """``softmax`` is in a block :func:`unfold` stood in for: nothing reads its result now."""
    block = _find(softmax)
    return block is not None and not block.merge.outputs[0].uses()


def unfold(model: ir.Model) -> list[Unfolded]:
    """Respell every multi-query block on query rows (the module docstring) in the main graph."""
    opset = model.opset_imports.get("", 0)
    done: list[Unfolded] = []
    for softmax in [n for n in model.graph if is_op(n, "Softmax")]:
        block = _find(softmax)
        if block is None:
            continue
        stand_in, new_softmax, nodes = _stand_in(block, opset)
        model.graph.insert_before(block.merge, nodes)
        original = block.merge.outputs[0]
        original.replace_all_uses_with(stand_in)
        done.append(Unfolded(original, stand_in, new_softmax, block.nodes, tuple(nodes)))
    return done


def restore(unfolded: Sequence[Unfolded]) -> None:
    """Undo :func:`unfold` where no block was fused (its stand-in's Softmax is still there): y's
    readers read the original again and the stand-in goes. Where one was, the original block goes
    (what of it nothing else reads), and so does whatever of the stand-in the fused op left."""
    for item in unfolded:
        if item.softmax.graph is not None:
            item.stand_in.replace_all_uses_with(item.original)
        else:
            drop_unread(item.old[::-1])
        drop_unread(item.new[::-1])
