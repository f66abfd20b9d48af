"""Rotate Q and K in their [B, S, N*d] layout instead of round-tripping through [B, N, S, d].

transformers applies rotary embeddings after splitting the heads and moving them ahead of the
sequence, so fuse-rotary-embedding's RotaryEmbedding reads ``Transpose(Reshape(x, [B, S, N, d]),
[0, 2, 1, 3])``. The fused attention ops read [B, S, N*d], so fuse-attention and
fuse-group-query-attention move the rotated tensor back with ``Reshape(Transpose(r, [0, 2, 1, 3]),
[B, S, N*d])``. Both RotaryEmbedding ops (com.microsoft, and ONNX's from opset 23) also take the
3-D [B, S, N*d] input given ``num_heads``, and rotate each head's d values exactly as in the 4-D
form (the same position ids and caches), so the chain is one op on ``x``:

    Reshape(Transpose(RotaryEmbedding(Transpose(Reshape(x, [B, S, N, d])))), [B, S, N*d])
        -> RotaryEmbedding(x, num_heads=N)

Two Transposes (each a copy of Q or K) and two Reshapes go per rotated tensor per layer. The
rotary's own output must feed only that way back (else the 4-D rotation would still run).

GPT-NeoX projects Q, K and V as one [B, S, N*3d] tensor, splits the heads, moves them ahead of
the sequence and only then cuts each head into its q, k and v parts (dynamo: one Split,
TorchScript: three Slices, along the last axis), so its rotaries read parts of a moved tensor.
Cutting along the last axis commutes with the move (it leaves that axis where it is):

    Split(Transpose(h, [0, 2, 1, 3]), axis=3) -> Transpose(p, [0, 2, 1, 3]) for p in Split(h, axis=3)

which the first rule makes where some part is rotated and moved back; the rotated parts' moves
then go as above, and V's meets the attention's move back (the two merge in the cleanup).

A decoder with a KV cache appends the rotated key to the past (``Concat(past, k, axis=2)``, the
present output [B, N, T, d]): that key keeps its layout, the reason says so (only the query moves).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op
from onnxopt.passes._attention_shapes import (
    merges_heads,
    producer_of,
    reshape_to_heads,
    static_dim,
    transpose_perm,
    value_rank,
)
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user

_SWAP = [0, 2, 1, 3]


def _readers(
    rotated: ir.Value, context: RewriteContext
) -> tuple[ir.Node | None, list[tuple[ir.Node, range]] | Mismatch]:
    """The one non-Shape user of the rotated [B, N, S, d] tensor, and its Shape reads (the
    attention fusions read B and S there), as (Shape node, dims read)."""
    back = None
    reads: list[tuple[ir.Node, range]] = []
    if rotated.is_graph_output():
        return None, Mismatch("the rotated heads are a graph output")
    for use in rotated.uses():
        node = use.node
        if not is_op(node, "Shape"):
            if back is not None:
                return None, Mismatch("the rotated heads have more than one reader")
            back = node
            continue
        if context.opset() < 15:
            return None, Mismatch("the rotated heads' shape is read, and Shape has no start/end")
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", 4)
        start = max(start + 4, 0) if start < 0 else min(start, 4)
        end = max(end + 4, 0) if end < 0 else min(end, 4)
        reads.append((node, range(start, end)))
    return back, reads


def _moved_back(
    rotary: ir.Node, context: RewriteContext
) -> tuple[ir.Node, ir.Node, list[tuple[ir.Node, range]]] | Mismatch:
    """The rotary's output read back as ``Reshape(Transpose(r, [0, 2, 1, 3]), [B, S, N*d])`` (and
    by Shape reads): (the Transpose back, the merging Reshape, the Shape reads)."""
    if rotary.attributes.get_int("is_packed_batching", 0):
        return Mismatch("packed batching reads its input as tokens, not [B, S, N*d]")
    back, reads = _readers(rotary.outputs[0], context)
    if isinstance(reads, Mismatch):
        return reads
    if back is not None and is_op(back, "Concat") and back.attributes.get_int("axis", 0) in (2, -2):
        # A KV cache: the rotated key is appended to the past, and the present output must stay
        # [B, N, T, d]. Rotating [B, S, N*d] would only move the one Transpose after the rotary.
        return Mismatch(
            "the rotated heads are appended to a KV cache (Concat on the sequence axis): the "
            "present stays [B, N, T, d], no Transpose to drop"
        )
    if back is None or transpose_perm(back) != _SWAP:
        return Mismatch("the rotated heads are read other than through one Transpose back")
    merged = back.outputs[0]
    merge = next(iter(merged.uses())).node if only_user(merged) else None
    if merge is None or not is_op(merge, "Reshape") or not merges_heads(merge):
        return Mismatch("the Transpose back is not merged into [B, S, N*d] by a Reshape")
    return back, merge, reads


def _match(rotary: ir.Node, context: RewriteContext) -> Match | Mismatch:
    heads_first = producer_of(rotary.inputs[0], "Transpose")
    if transpose_perm(heads_first) != _SWAP:
        return Mismatch(
            "the input is not a head split moved ahead of the sequence", candidate=False
        )
    assert heads_first is not None
    split = reshape_to_heads(heads_first.inputs[0])
    heads_last = heads_first.inputs[0]
    reshape: ir.Node | None = None
    if split is not None:
        source, heads, head_size, reshape = split
    elif (
        heads_last is not None
        and value_rank(heads_last) == 4
        and static_dim(heads_last, 2)
        and static_dim(heads_last, 3)
    ):
        # [B, S, N, d] made otherwise (Persimmon: picked out of [B, S, N, 3, d] and normalized
        # per head): its [B, S, N*d] view is a new Reshape
        source = heads_last
        heads, head_size = static_dim(heads_last, 2) or 0, static_dim(heads_last, 3) or 0
    else:
        return Mismatch(
            "the rotated heads are neither a Reshape of a 3-D [B, S, N*d] tensor nor [B, S, N, d] "
            "with static N and d"
        )
    declared = rotary.attributes.get_int("num_heads", 0)
    if declared not in (0, heads):
        return Mismatch(f"num_heads is {declared}, the head split makes {heads}")
    tail = _moved_back(rotary, context)
    if isinstance(tail, Mismatch):
        return tail
    back, merge, reads = tail
    # Producers first: the driver drops matched nodes last to first once nothing reads them.
    nodes = [heads_first, rotary, *(read for read, _ in reads), back, merge]
    if reshape is not None and only_user(reshape.outputs[0]) and only_user(heads_first.outputs[0]):
        nodes.insert(0, reshape)
    bindings = {
        "source": source,
        "heads": heads,
        "head_size": head_size,
        "rotary": rotary,
        "view": reshape is None,  # the source is [B, S, N, d]: viewed as [B, S, N*d] first
    }
    # The new nodes go where the rotary was: the Shape reads' users may come before the merge.
    return Match(nodes, {**bindings, "reads": reads}, anchor=rotary)


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    rotary: ir.Node = match.bindings["rotary"]
    attributes = {name: attr.value for name, attr in rotary.attributes.items()}
    heads, head_size = match.bindings["heads"], match.bindings["head_size"]
    attributes["num_heads"] = heads
    source: ir.Value = match.bindings["source"]
    nodes: list[ir.Node] = []
    constants: list[ir.Value] = []
    if match.bindings["view"]:
        target = new_constant(np.array([0, 0, heads * head_size], dtype=np.int64), "rotary_view")
        constants.append(target)
        nodes.append(ir.node("Reshape", [source, target]))
        view = nodes[-1].outputs[0]
        view.type = source.type
        if source.shape is not None:
            view.shape = ir.Shape([source.shape[0], source.shape[1], heads * head_size])
        source = view
    inputs = [source, *rotary.inputs[1:]]
    flat = ir.node("RotaryEmbedding", inputs, attributes, domain=rotary.domain, name=rotary.name)
    # The same shape as its input: recorded, since shape inference does not know the contrib op,
    # and the attention fusions' sequence-length reads of it are shared across layers through it.
    flat.outputs[0].type = source.type
    flat.outputs[0].shape = source.shape
    nodes.append(flat)
    moved = [(match.root.outputs[0], flat.outputs[0])]
    fixed = {1: heads, 3: head_size}
    for read, dims in match.bindings["reads"]:  # [B, N, S, d]: B, S read off [B, S, N*d]
        pieces = []
        for dim in dims:
            if dim in fixed:
                constant = new_constant(np.array([fixed[dim]], dtype=np.int64), "rotary_dim")
                constants.append(constant)
                pieces.append(constant)
            else:
                at = 0 if dim == 0 else 1
                nodes.append(ir.node("Shape", [source], {"start": at, "end": at + 1}))
                pieces.append(nodes[-1].outputs[0])
        if not pieces:  # an empty read
            constants.append(new_constant(np.zeros(0, dtype=np.int64), "rotary_dims"))
            pieces.append(constants[-1])
        elif len(pieces) > 1:
            nodes.append(ir.node("Concat", pieces, {"axis": 0}))
            pieces = [nodes[-1].outputs[0]]
        moved.append((read.outputs[0], pieces[0]))
    return Replacement(nodes, moved, constants)


def _rotated_back(part: ir.Value, context: RewriteContext) -> bool:
    """Whether ``part`` [B, N, S, d] is read only by a RotaryEmbedding whose output the rule above
    takes back to [B, S, N*d]."""
    readers = [use.node for use in part.uses()]
    if len(readers) != 1 or part.is_graph_output():
        return False
    rotary = readers[0]
    return (
        (is_op(rotary, "RotaryEmbedding", MS_DOMAIN) or is_op(rotary, "RotaryEmbedding"))
        and rotary.inputs[0] is part
        and not isinstance(_moved_back(rotary, context), Mismatch)
    )


def _part_of_head(reader: ir.Node, moved: ir.Value) -> bool:
    """Whether ``reader`` takes parts of each head of ``moved`` [B, N, S, D]: a Split or a Slice
    along axis 3 alone, reading ``moved`` as its data and initializers otherwise (the parts are
    then made where ``moved`` was)."""
    if reader.inputs[0] is not moved or any(
        value is moved or (value is not None and value.producer() is not None)
        for value in reader.inputs[1:]
    ):
        return False
    if is_op(reader, "Split"):
        return reader.attributes.get_int("axis", 0) in (3, -1)
    if is_op(reader, "Slice") and len(reader.inputs) >= 4:
        axes = const_array(reader.inputs[3])
        return axes is not None and axes.size == 1 and int(axes.reshape(-1)[0]) in (3, -1)
    return False


def _match_parts(heads_first: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if transpose_perm(heads_first) != _SWAP:
        return Mismatch("not heads moved ahead of the sequence", candidate=False)
    moved = heads_first.outputs[0]
    readers = list(dict.fromkeys(use.node for use in moved.uses()))
    parts = [part for reader in readers for part in reader.outputs]
    if not any(_rotated_back(part, context) for part in parts):
        return Mismatch("no part of these heads is rotated and moved back", candidate=False)
    if moved.is_graph_output() or not all(_part_of_head(reader, moved) for reader in readers):
        return Mismatch(
            "the heads moved ahead of the sequence are read other than as parts of each head "
            "(a Split or Slice along the last axis with constant sizes)"
        )
    if any(part.is_graph_output() for part in parts):
        return Mismatch("a part of the heads is a graph output")
    if any(static_dim(part, 1) is None or static_dim(part, 3) is None for part in parts):
        return Mismatch("a part's head count or size is not static")  # the rule below needs both
    bindings = {"source": heads_first.inputs[0], "readers": readers}
    return Match([heads_first, *readers], bindings, anchor=heads_first)


def _rewrite_parts(match: Match, context: RewriteContext) -> Replacement:
    """Each Split / Slice of the last axis reads the [B, S, N, D] heads (the axis is 3 either
    way), and each part it makes is moved ahead of the sequence on its own."""
    source: ir.Value = match.bindings["source"]
    nodes: list[ir.Node] = []
    moved: list[tuple[ir.Value, ir.Value]] = []
    for reader in match.bindings["readers"]:
        attributes = {name: attr.value for name, attr in reader.attributes.items()}
        new = ir.node(
            reader.op_type,
            [source, *reader.inputs[1:]],
            attributes,
            num_outputs=len(reader.outputs),
            name=reader.name,
        )
        nodes.append(new)
        for old, part in zip(reader.outputs, new.outputs, strict=True):
            part.type = old.type
            if old.shape is not None:  # [B, N, S, d] -> [B, S, N, d]
                part.shape = ir.Shape([old.shape[i] for i in _SWAP])
            if old.uses():
                nodes.append(ir.node("Transpose", [part], {"perm": _SWAP}))
                nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = old.type, old.shape
                moved.append((old, nodes[-1].outputs[0]))
    return Replacement(nodes, moved)


RULES = (
    # GPT-NeoX: Q, K and V are cut out of each head after the heads moved ahead of the sequence
    # (one Split with dynamo, three Slices with TorchScript), so the rotaries read those parts.
    # Cutting the [B, S, N, 3d] heads first and moving each part lets the rule below drop the
    # rotated parts' Transposes; V's meets the attention's Transpose back (merged in the cleanup).
    Rule("parts of moved heads -> moved parts", "Transpose", _match_parts, _rewrite_parts),
    Rule("RotaryEmbedding on [B, S, N*d]", "RotaryEmbedding", _match, _rewrite, MS_DOMAIN),
    Rule("RotaryEmbedding on [B, S, N*d]", "RotaryEmbedding", _match, _rewrite),
)


class FuseRotaryTransposesPass(RulePass):
    """RotaryEmbedding between a head split's Transposes reads and writes [B, S, N*d] instead."""

    name = "fuse-rotary-transposes"
    summary = "rotate Q/K as [B, S, N*d] (num_heads set), dropping the Transposes around the rotary"
    rules = RULES
