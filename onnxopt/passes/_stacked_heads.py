"""Heads flattened into the batch out of one stacked Q/K/V tensor, respelled for fuse-attention.

SAM's and ViTDet's image encoders (and Meta's segment-anything) compute their attention on heads
flattened into the batch, cut out of the packed projection by one permute and one view::

    X5 = Reshape(qkv, [B, T, 3, H, d])
    P  = Transpose(X5, [2, 0, 3, 1, 4])                       [3, B, H, T, d]
    q, k, v = unbind(Reshape(P, [3, B*H, T, d]), 0)           each [B*H, T, d]

(``unbind`` is ``Split`` + ``Squeeze`` from TorchScript, ``Squeeze(Slice)`` from dynamo.)
Row-major, part i of that view is the [B, H, T, d] slice ``P[i]``, which is
``Transpose(Gather(X5, i, axis=2), [0, 2, 1, 3])``: so each part is the same tensor as

    Reshape(Transpose(Gather(X5, i, axis=2), [0, 2, 1, 3]), [-1, T, d])

the spelling fuse-attention proves for BLOOM's bmm form, with the [B, H, T, d] heads the fused op
reads and the [B, T, H, d] rows the query is passed as (``Reshape(rows, [0, 0, -1])``, no copy).
:func:`unfold` puts that spelling in place of every part (the same values, the same recorded shape)
before the attention rule runs; :func:`restore` takes it back wherever no block was fused, so an
unfused graph is exactly the graph that came in. Where a block was fused the parts' stand-ins stay
for whatever else reads them (SAM's relative positions are computed from q), and the stacked
Transpose that moved all of Q, K and V goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes._attention_shapes import (
    int64_const,
    producer_of,
    same_dim,
    same_symbol,
    scaled_dim_reads,
    seq_len,
    static_dim,
    transpose_perm,
    value_rank,
    view_entries,
)
from onnxopt.passes._seq_first_heads import drop_unread, drop_unread_upward
from onnxopt.passes._shape_facts import int_param, slice_params
from onnxopt.rewrite import Mismatch

_STACKED = [2, 0, 3, 1, 4]  # [B, T, n, H, d] -> [n, B, H, T, d]


@dataclass(frozen=True)
class Unfolded:
    """One respelled part: the original value, its [B*H, T, d] stand-in and [B, H, T, d] heads, the
    nodes making them (in order), the part's [B, H, T, d] views stood in for by the heads (each with
    its readers), and every reader of the part and of those views as found."""

    original: ir.Value
    stand_in: ir.Value
    heads: ir.Value
    nodes: tuple[ir.Node, ...]
    views: tuple[tuple[ir.Value, tuple[ir.Node, ...]], ...]
    readers: tuple[ir.Node, ...]


def _flat_view(reshape: ir.Node, stacked: ir.Value) -> bool:
    """``reshape`` views the [n, B, H, T, d] ``stacked`` as [n, B*H, T, d]: n, T and d proved
    (entries, or the recorded shapes), so the element count makes the remaining dim B*H. A -1 for
    d with an unproven B*H is not enough (the two could trade a factor)."""
    view = reshape.outputs[0]
    entries = view_entries(view)
    if value_rank(view) != 4 or entries is None or len(entries) != 4:
        return False
    copies = not reshape.attributes.get_int("allowzero", 0)

    def proved(axis: int, index: int) -> bool:
        entry = entries[axis]
        if copies and entry == 0:
            return axis == index
        return (entry is not None and entry != -1 and same_dim(entry, stacked, index)) or (
            same_symbol(view, axis, stacked, index)
        )

    if not (proved(0, 0) and proved(2, 3)):
        return False
    return proved(3, 4) or (entries[3] == -1 and _batch_times_heads(reshape, stacked))


def _batch_times_heads(reshape: ir.Node, stacked: ir.Value) -> bool:
    """Dim 1 of the view is B*H of the [n, B, H, T, d] ``stacked``: TorchScript's target piece
    ``batch_size * num_heads``, a read of a dim carrying B times the constant H."""
    heads = static_dim(stacked, 2)
    concat = producer_of(reshape.inputs[1], "Concat")
    if heads is None or concat is None:
        return False
    axis = 0
    for piece in concat.inputs:
        length = static_dim(piece, 0) if value_rank(piece) == 1 else None
        if length is None:
            return False
        if axis == 1 and length == 1:
            return any(
                factor == heads and same_dim(read, stacked, 1)
                for read, factor in scaled_dim_reads(piece)
            )
        axis += length
        if axis > 1:
            return False
    return False


def _parts(view: ir.Value, count: int) -> list[tuple[int, ir.Value]] | None:
    """(i, part i) for every reader of the [n, B*H, T, d] ``view``: ``Squeeze(Split(view, axis 0)[i],
    [0])``, ``Squeeze(Slice(view, [i], [i + 1], [0]), [0])`` or ``Gather(view, i, axis 0)``; None when
    anything else reads it (the stacked tensor then stays, and respelling gains nothing)."""
    found: list[tuple[int, ir.Value]] = []
    for use in view.uses():
        node = use.node
        if use.idx != 0:
            return None
        pieces: list[tuple[int, ir.Value]]
        if is_op(node, "Gather"):
            array = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            if node.attributes.get_int("axis", 0) != 0 or array is None or array.ndim != 0:
                return None
            found.append((int(array) % count, node.outputs[0]))
            continue
        if is_op(node, "Split") and node.attributes.get_int("axis", 0) == 0:
            pieces = list(enumerate(node.outputs))
            sizes = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            if len(pieces) != count or (sizes is not None and sizes.tolist() != [1] * count):
                return None
        elif is_op(node, "Slice"):
            start = _unit_slice(node)
            if start is None:
                return None
            pieces = [(start % count, node.outputs[0])]
        else:
            return None
        for index, piece in pieces:
            for later in piece.uses():
                squeeze = later.node
                if not is_op(squeeze, "Squeeze") or int_param(squeeze, "axes", 1) != (0,):
                    return None
                found.append((index, squeeze.outputs[0]))
    return found


def _unit_slice(node: ir.Node) -> int | None:
    """i when ``node`` is ``Slice(x, [i], [i + 1], [0])`` (step 1)."""
    params = slice_params(node)
    if isinstance(params, Mismatch) or len(params.starts) != 1 or params.axes != (0,):
        return None
    start, end = params.starts[0], params.ends[0]
    if params.steps != (1,) or start < 0 or end != start + 1:
        return None
    return start


def _stand_in(
    source: ir.Value, index: int, original: ir.Value, opset: int
) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
    """Part ``index`` of the [B, T, n, H, d] ``source`` as [B*H, T, d] and its [B, H, T, d] heads (see the module docstring),
    with the original part's recorded shape; T and d in the view's target are constants where
    static, else read off the heads."""
    tape = ir.tape.Tape()
    position = tape.op("Constant", [], {"value": ir.tensor(np.array(index, dtype=np.int64))})
    rows = tape.op("Gather", [source, position], {"axis": 2})
    heads = tape.op("Transpose", [rows], {"perm": [0, 2, 1, 3]})
    dims = list(source.shape) if source.shape is not None else [None] * 5
    for value, order in ((rows, (0, 1, 3, 4)), (heads, (0, 3, 1, 4))):
        value.shape = ir.Shape([dims[axis] for axis in order])
        if source.dtype is not None:
            value.dtype = source.dtype
    pieces = [int64_const(tape, [-1])]
    for axis in (2, 3):
        size = static_dim(heads, axis)
        pieces.append(int64_const(tape, [size]) if size else seq_len(tape, heads, axis, opset))
    flat = tape.op("Reshape", [heads, tape.op("Concat", pieces, {"axis": 0})])
    flat.shape = original.shape
    if original.dtype is not None:
        flat.dtype = original.dtype
    return flat, heads, list(tape.nodes)


def _heads_view(view: ir.Node, heads: ir.Value) -> bool:
    """``view`` (a Reshape of the part) is the part as [B, H, T, d] (the SDPA path views q, k and
    v so before its attention): H, T and d the heads' (a -1 for d where B is proved, read off a dim
    carrying it), so the element count fixes the rest."""
    out = view.outputs[0]
    entries = view_entries(out)
    if value_rank(out) != 4 or entries is None or len(entries) != 4 or out.is_graph_output():
        return False
    if view.attributes.get_int("allowzero", 0) == 0 and 0 in entries:
        return False  # a copy of a dim of the [B*H, T, d] part
    proved = [
        entry is not None and entry != -1 and same_dim(entry, heads, axis)
        for axis, entry in enumerate(entries)
    ]
    return proved[1] and proved[2] and (proved[3] or (entries[3] == -1 and proved[0]))


def unfold(model: ir.Model) -> list[Unfolded]:
    """Respell every part of a stacked, batch-and-heads flattened Q/K/V (the module docstring), and
    every [B, H, T, d] view of one, whose stand-in is then the heads themselves."""
    opset = model.opset_imports.get("", 0)
    done: list[Unfolded] = []
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if transpose_perm(node) != _STACKED or node.inputs[0] is None:
            continue
        source, stacked = node.inputs[0], node.outputs[0]
        count = static_dim(source, 2)
        users = list(stacked.uses())
        if count is None or count < 2 or stacked.is_graph_output() or len(users) != 1:
            continue
        reshape = users[0].node
        if not is_op(reshape, "Reshape") or users[0].idx != 0 or not _flat_view(reshape, stacked):
            continue
        parts = _parts(reshape.outputs[0], count)
        if not parts or any(part.is_graph_output() for _, part in parts):
            continue
        graph = node.graph
        assert graph is not None
        for index, part in parts:
            stand_in, heads, nodes = _stand_in(source, index, part, opset)
            producer = part.producer()
            assert producer is not None  # a Squeeze or Gather, found above
            graph.insert_before(producer, nodes)
            readers = [use.node for use in part.uses()]
            views = []
            for view in readers:
                if is_op(view, "Reshape") and view.inputs[0] is part and _heads_view(view, heads):
                    out = view.outputs[0]
                    views.append((out, tuple(use.node for use in out.uses())))
            part.replace_all_uses_with(stand_in)
            for out, _ in views:
                out.replace_all_uses_with(heads)
            readers += [reader for _, view_readers in views for reader in view_readers]
            done.append(Unfolded(part, stand_in, heads, tuple(nodes), tuple(views), tuple(readers)))
    return done


def restore(unfolded: Sequence[Unfolded]) -> None:
    """Undo :func:`unfold` for every part whose readers are all still there (no fusion took
    one): its readers, and its views', read the original again and the stand-in goes. Where a
    fusion took a reader, the stand-in stays for the others (SAM's relative positions read q),
    and the original part and its views go with whatever of the stacked spelling nothing reads
    any more (the dim reads left go with eliminate-dead-code)."""
    for item in unfolded:
        fused = any(reader.graph is None for reader in item.readers)
        if not fused:
            for original, readers in item.views:
                for reader in readers:
                    for index, value in enumerate(reader.inputs):
                        if value is item.heads:
                            reader.replace_input_with(index, original)
            item.stand_in.replace_all_uses_with(item.original)
        for original, _ in item.views:
            drop_unread_upward(original)
        drop_unread(item.nodes[::-1])
        if fused:
            drop_unread_upward(item.original)
