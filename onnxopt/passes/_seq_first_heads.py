"""torch's ``F.multi_head_attention_forward`` bmm path, respelled for fuse-attention while it matches.

``nn.MultiheadAttention`` returns the averaged attention weights by default (``need_weights=True``,
which ``y, _ = attn(q, k, v)`` leaves on), and then computes attention with bmm on heads flattened
into the batch, sequence-first::

    q3 = Transpose(Reshape(q [S, B, H*d], [S, B*H, d]), [1, 0, 2])     [B*H, S, d]
    kT = Transpose(Reshape(k [T, B, H*d], [T, B*H, d]), [1, 2, 0])     [B*H, d, T]
    v3 = Transpose(Reshape(v [T, B, H*d], [T, B*H, d]), [1, 0, 2])     [B*H, T, d]

(HF's WavLM calls it the same way.) Row-major, index b*H + h of the [S, B*H, d] view is (b, h) of
[S, B, H, d], so ``q3 = Reshape(Transpose(Reshape(q, [0, 0, H, d]), [1, 2, 0, 3]), [-1, S, d])``:
the spelling fuse-attention proves for BLOOM's bmm form, with the [B, H, S, d] tensor the fused op
reads. :func:`unfold` puts that spelling in place of each such operand (the same values, the same
shape) before the attention rule runs; :func:`restore` takes it back wherever no block was fused,
so an unfused graph is exactly the graph that came in. The SDPA path (``need_weights=False``)
views q3 as [B, H, S, d] for its attention: that view is stood in for by the heads themselves.

:func:`packed_projection` recognises Q, K and V as the three parts of torch's packed
self-attention in-projection, ``x @ W + b`` cut by ``unflatten(-1, (3, D)).unsqueeze(0)
.transpose(0, -2).squeeze(-2)``, which fuse-attention then computes batch-first and splits along
the columns, the form fuse-packed-attention folds into one Attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes._attention_shapes import (
    Entry,
    annotate,
    int64_const,
    last_dim,
    producer_of,
    same_dim,
    same_symbol,
    seq_len,
    static_dim,
    transpose_perm,
    value_rank,
    view_entries,
)
from onnxopt.passes._shape_facts import int_param

# The flattened operand's layout after the Transpose: rows [B*H, L, d], or the key's [B*H, d, L].
_ROWS, _KEY_T = [1, 0, 2], [1, 2, 0]


@dataclass(frozen=True)
class Unfolded:
    """One respelled operand: the original value, its stand-in and the nodes making it."""

    original: ir.Value
    stand_in: ir.Value
    nodes: tuple[ir.Node, ...]


def _flattened_seq_first(transpose: ir.Node) -> tuple[ir.Value, int, int] | None:
    """(x, H, d) when ``transpose`` is ``Transpose(Reshape(x [L, B, H*d], [L, B*H, d]), perm)``
    with perm [1, 0, 2] or [1, 2, 0], L proved x's dim 0 (the element count then fixes B*H)."""
    if transpose_perm(transpose) not in (_ROWS, _KEY_T):
        return None
    reshape = producer_of(transpose.inputs[0], "Reshape")
    if reshape is None or len(reshape.inputs) < 2:
        return None
    source = reshape.inputs[0]
    width = last_dim(source)
    if source is None or value_rank(source) != 3 or width is None:
        return None
    entries = view_entries(reshape.outputs[0])
    if entries is None or len(entries) != 3:
        return None
    length, rows, size = entries
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    if not isinstance(size, int) or size <= 0 or width % size:
        return None
    length_kept = (length == 0 and not allowzero) or _is_length(
        reshape.outputs[0], 0, length, source
    )
    # [L, rows, d] of [L, B, H*d]: the element count makes rows B*H (a literal 0 would copy B)
    if not length_kept or rows == 0:
        return None
    return source, width // size, size


def _is_length(view: ir.Value, axis: int, entry: Entry | None, source: ir.Value) -> bool:
    """Dim ``axis`` of ``view`` (a Reshape's output, ``entry`` its target's entry there) is L,
    dim 0 of the sequence-first ``source``: read off it, or computed elsewhere (wav2vec2-style
    audio lengths) where the recorded shapes give the view's dim the source's symbol."""
    return (entry is not None and entry not in (0, -1) and same_dim(entry, source, 0)) or (
        same_symbol(view, axis, source, 0)
    )


def _heads(tape: ir.tape.Tape, source: ir.Value, heads: int, size: int) -> ir.Value:
    """``Transpose(Reshape(source, [0, 0, H, d]), [1, 2, 0, 3])``: the [B, H, L, d] heads of the
    sequence-first [L, B, H*d] source."""
    split = tape.op("Reshape", [source, int64_const(tape, [0, 0, heads, size])])
    heads4 = tape.op("Transpose", [split], {"perm": [1, 2, 0, 3]})
    dims = list(source.shape) if source.shape is not None else [None, None, None]
    length, batch = dims[0], dims[1]
    annotate(split, source, [length, batch, heads, size])
    annotate(heads4, source, [batch, heads, length, size])
    return heads4


def _stand_in(
    transpose: ir.Node, source: ir.Value, heads: int, size: int, opset: int
) -> tuple[ir.Value, list[ir.Node]]:
    """The [B*H, L, d] (or [B*H, d, L]) operand as a view of its [B, H, L, d] heads."""
    tape = ir.tape.Tape()
    heads4 = _heads(tape, source, heads, size)
    target = tape.op(
        "Concat",
        [int64_const(tape, [-1]), seq_len(tape, heads4, 2, opset), int64_const(tape, [size])],
        {"axis": 0},
    )
    flat = tape.op("Reshape", [heads4, target])
    length = heads4.shape[2] if heads4.shape is not None else None
    annotate(flat, source, [None, length, size])
    result = flat
    if transpose_perm(transpose) == _KEY_T:
        result = tape.op("Transpose", [flat], {"perm": [0, 2, 1]})
        annotate(result, source, [None, size, length])
    return result, list(tape.nodes)


def _heads_view(reshape: ir.Node, source: ir.Value, heads: int, size: int) -> bool:
    """``reshape`` views the [B*H, L, d] rows as [B, H, L, d] (torch's SDPA path of
    multi_head_attention_forward): H and d as constants, L proved the source's dim 0 (the
    element count then fixes B)."""
    if len(reshape.inputs) < 2 or reshape.inputs[0] is None:
        return False
    entries = view_entries(reshape.outputs[0])
    if entries is None or len(entries) != 4 or entries[1] != heads or entries[3] != size:
        return False
    return _is_length(reshape.outputs[0], 2, entries[2], source)


def _feeds_matmul(value: ir.Value) -> bool:
    """``value`` reaches a MatMul directly or through one scalar Mul/Div (torch scales q3)."""
    for use in value.uses():
        node = use.node
        if is_op(node, "MatMul"):
            return True
        if (is_op(node, "Mul") or is_op(node, "Div")) and any(
            is_op(later.node, "MatMul") for later in node.outputs[0].uses()
        ):
            return True
    return False


def unfold(model: ir.Model) -> list[Unfolded]:
    """Respell every flattened sequence-first operand of a MatMul (see the module docstring), and
    every [B, H, L, d] view of one (torch's SDPA path views q3 so before its attention), whose
    stand-in is then the heads themselves."""
    opset = model.opset_imports.get("", 0)
    done: list[Unfolded] = []
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if not is_op(node, "Transpose") or node.outputs[0].is_graph_output():
            continue
        found = _flattened_seq_first(node)
        if found is None:
            continue
        source, heads, size = found
        graph = node.graph
        assert graph is not None
        original = node.outputs[0]
        if _feeds_matmul(original):
            stand_in, nodes = _stand_in(node, source, heads, size, opset)
            graph.insert_after(node, nodes)
            original.replace_all_uses_with(stand_in)
            done.append(Unfolded(original, stand_in, tuple(nodes)))
            continue
        if transpose_perm(node) != _ROWS:
            continue
        for use in list(original.uses()):
            view = use.node
            if not is_op(view, "Reshape") or use.idx != 0 or view.outputs[0].is_graph_output():
                continue
            if not _heads_view(view, source, heads, size):
                continue
            tape = ir.tape.Tape()
            heads4 = _heads(tape, source, heads, size)
            graph.insert_after(view, tape.nodes)
            view.outputs[0].replace_all_uses_with(heads4)
            done.append(Unfolded(view.outputs[0], heads4, tuple(tape.nodes)))
    return done


def restore(unfolded: Sequence[Unfolded]) -> None:
    """Undo :func:`unfold` where no fusion took the stand-in: its readers read the original again.
    The nodes nothing reads any more go: the stand-in's where the block was not fused, the
    original Transpose and its Reshape where it was (the fused op reads the [B, H, L, d] heads)."""
    for item in unfolded:
        if item.stand_in.uses():
            item.stand_in.replace_all_uses_with(item.original)
        drop_unread(item.nodes[::-1])
        # the original spelling: its view (if the 4-D one was stood in for), Transpose, Reshape
        drop_unread_upward(item.original, steps=3)


def drop_unread_upward(value: ir.Value, steps: int | None = None) -> None:
    """Remove ``value``'s producer when nothing reads it, then its data input's, and so on (at
    most ``steps`` nodes): a respelling's original chain, once its readers have gone."""
    node = value.producer()
    while node is not None and (steps is None or steps > 0):
        above = node.inputs[0].producer() if node.inputs and node.inputs[0] else None
        if not drop_unread([node]):
            return
        node = above
        steps = None if steps is None else steps - 1


def drop_unread(nodes: Sequence[ir.Node]) -> bool:
    """Remove each node (in order: readers first) whose outputs nothing reads; whether the last
    one went."""
    gone = False
    for node in nodes:
        graph = node.graph
        gone = graph is not None and not any(
            out.uses() or out.is_graph_output() for out in node.outputs
        )
        if gone:
            assert graph is not None
            graph.remove(node, safe=True)
    return gone


def source_of(four_d: ir.Value) -> ir.Value | None:
    """x when ``four_d`` is the stand-in's ``Transpose(Reshape(x, [0, 0, H, d]), [1, 2, 0, 3])``:
    [B, H, L, d] heads of the sequence-first [L, B, H*d] x, which ``Transpose(x, [1, 0, 2])``
    holds batch-first with head h at columns h*d..(h+1)*d."""
    transpose = four_d.producer()
    if transpose_perm(transpose) != [1, 2, 0, 3]:
        return None
    assert transpose is not None
    split = producer_of(transpose.inputs[0], "Reshape")
    if split is None or len(split.inputs) < 2 or split.attributes.get_int("allowzero", 0) != 0:
        return None
    source = split.inputs[0]
    target = const_array(split.inputs[1])
    if source is None or value_rank(source) != 3 or target is None:
        return None
    width = last_dim(source)
    kept = target.tolist()
    if width is None or len(kept) != 4 or kept[:2] != [0, 0] or kept[2] * kept[3] != width:
        return None
    return source


@dataclass(frozen=True)
class PackedProjection:
    """torch's packed self-attention in-projection: ``inputs @ weight (+ bias)``, [L, B, 3*D]."""

    inputs: ir.Value  # [L, B, D_in], sequence-first
    weight: ir.Value  # [D_in, 3*D]
    bias: ir.Value | None  # [3*D]
    width: int  # D


def _part_of_packed(value: ir.Value) -> tuple[int, ir.Node] | None:
    """(i, the Squeeze) when ``value`` is part i of torch's ``_in_projection_packed`` split:
    ``Gather(Squeeze(Transpose(Unsqueeze(Reshape(p, [L, B, 3, D]), [0]), [3, 1, 2, 0, 4]), [-2]), i)``,
    which is ``p[..., i*D:(i+1)*D]``."""
    gather = value.producer()
    if not is_op(gather, "Gather") or gather is None or gather.attributes.get_int("axis", 0) != 0:
        return None
    index = const_array(gather.inputs[1])
    squeeze = producer_of(gather.inputs[0], "Squeeze")
    if index is None or index.ndim != 0 or squeeze is None:
        return None
    return int(index), squeeze


def packed_projection(parts: Sequence[ir.Value]) -> PackedProjection | None:
    """The projection when ``parts`` (the sequence-first Q, K and V) are parts 0, 1 and 2 of one
    packed in-projection as torch splits it (see :func:`_part_of_packed`)."""
    found = [_part_of_packed(part) for part in parts]
    if any(item is None for item in found) or [item[0] for item in found if item] != [0, 1, 2]:
        return None
    squeeze = found[0][1] if found[0] else None
    if squeeze is None or any(item is None or item[1] is not squeeze for item in found):
        return None
    axes = int_param(squeeze, "axes", 1)
    transpose = squeeze.inputs[0].producer() if squeeze.inputs[0] is not None else None
    if axes not in ((3,), (-2,)) or transpose_perm(transpose) != [3, 1, 2, 0, 4]:
        return None
    assert transpose is not None
    unsqueeze = producer_of(transpose.inputs[0], "Unsqueeze")
    if unsqueeze is None or int_param(unsqueeze, "axes", 1) != (0,):
        return None
    reshape = producer_of(unsqueeze.inputs[0], "Reshape")
    width = last_dim(parts[0])
    entries = view_entries(reshape.outputs[0]) if reshape is not None else None
    if reshape is None or width is None or entries is None or entries[2:] != [3, width]:
        return None
    return _projection(reshape.inputs[0], width)


def _projection(packed: ir.Value | None, width: int) -> PackedProjection | None:
    """``packed`` = MatMul(x, W) or its sum with a [3*D] bias (either order), W a 2-D constant."""
    node = packed.producer() if packed is not None else None
    bias = None
    if is_op(node, "Add") and node is not None:
        for product, term in (node.inputs, node.inputs[::-1]):
            if is_op(product.producer() if product is not None else None, "MatMul"):
                bias, node = term, product.producer() if product is not None else None
                break
    if not is_op(node, "MatMul") or node is None:
        return None
    inputs, weight = node.inputs
    if inputs is None or weight is None or const_array(weight) is None:
        return None
    if value_rank(inputs) != 3 or static_dim(weight, 1) != 3 * width:
        return None
    if bias is not None and (bias.shape is None or list(bias.shape) != [3 * width]):
        return None
    return PackedProjection(inputs, weight, bias, width)
