"""Fold the Q/K/V projections into the attention op: one com.microsoft.Attention per layer.

After ``fuse-attention`` a self-attention layer reads, with x a [B, S, D_in] tensor::

    q = x @ Wq (+ bq) (* c),  k = x @ Wk (+ bk),  v = x @ Wv (+ bv)      W* constant 2-D matrices
    y = MultiHeadAttention(q, k, v, attention_bias=mask, num_heads=N, scale=s)

or, after ``merge-qkv-projections`` (and in GPT-2, whose c_attn is one Gemm), the three products
as one ``x @ [Wq | Wk | Wv] (+ b)`` and a Split along the last axis, or (BLOOM) one product whose
columns interleave Q, K and V per head, viewed as [B, S, H, 3, d] and taken apart by Gathers (its
weight's columns are reordered to [Q | K | V]), or (ViTs, hand-written attention) one product
viewed as [B, S, 3, H, d], permuted to [3, B, H, S, d] and unbound along axis 0 (its columns are
[Q | K | V] already). For ``--target ort`` this becomes
``y = Attention(x, [Wq | Wk | Wv], [bq | bk | bv], attention_bias=mask, num_heads=N, scale=s*c)``
(a missing bias is zeros; no biases at all, a zero bias: ORT before 1.32 crashes without one). ONNX Runtime prepacks the weight and
writes Q, K and V straight into its [B, N, S, d] working layout, so MultiHeadAttention's own head
transposes (and the Split copy) go away. The mask stays the exact additive bias. Attention's
constraints (ORT's ``AttentionBase::CheckInputs``): x of rank 3, one x for Q, K and V (self
attention), Q and K of equal width, V's width passed as ``qkv_hidden_sizes`` when it differs, every
width a multiple of num_heads.

When it pays (``benchmarks/attention_layouts_micro.py``, ORT 1.32 CPU): with a mask, Attention was
faster at every measured length; without one, MultiHeadAttention takes a faster path at long
sequences, so an unmasked layer is fused only when its sequence length is static and at most
``MAX_UNMASKED_SEQUENCE`` (ViT-B's 197 yes, Whisper's 1500 no).

The Expand that spells the mask out to [., ., S, T] reads S and T as ``Shape(q)[1:2]`` and
``Shape(k)[1:2]`` (``Shape(k)[2:3]`` for an interleaved [B, H, T, d] key); a companion rule reads
those dims off x instead (the projections keep the leading dims), so that q and k have no other
consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, is_unread, single_consumer
from onnxopt.passes._attention_shapes import (
    ATTENTION_DTYPES,
    peel_scale,
    same_symbol,
    static_dim,
    target_entries,
    transpose_perm,
)
from onnxopt.passes._shape_facts import slice_params
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.fuse_group_query_attention import causal_gqa_match
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules
from onnxopt.rewrite.patterns import new_constant

# MultiHeadAttention inputs: query, key, value, bias, key_padding_mask, attention_bias, past_key,
# past_value (, past_sequence_length, cache_indirection). Only Q, K, V and attention_bias map 1:1.
_ATTENTION_BIAS = 5
_PASSED_ATTRIBUTES = frozenset({"num_heads", "scale"})
# Without a mask, MultiHeadAttention was faster than Attention from sequence ~512 on, level at
# ViT-B's 197 (0.96-1.03 per layer) and Attention faster at 64-128 (benchmarks/
# attention_layouts_micro.py --no-mask). Whole ViT-B/16 profiles (benchmarks/profile_kernels.py,
# 10 runs) put packed and unpacked within their run-to-run noise (150.1 vs 144.4 ms, then 146.8
# vs 151.0): at break-even the packed form is kept for its 3 fewer nodes per layer.
MAX_UNMASKED_SEQUENCE = 256


def value_rank(value: ir.Value | None, depth: int = 0) -> int | None:
    """The value's rank; for fresh MatMul/Add outputs (no shape inferred yet) read off the inputs."""
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    node = value.producer()
    if depth < 4 and (is_op(node, "MatMul") or is_op(node, "Add")):
        assert node is not None
        ranks = [value_rank(v, depth + 1) for v in node.inputs]
        if any(r is None for r in ranks):
            return None
        known = [r for r in ranks if r is not None]
        if is_op(node, "MatMul") and known[1] == 2:
            return known[0]
        if is_op(node, "Add"):
            return max(known)
    if is_op(node, "Reshape"):
        assert node is not None
        entries = target_entries(node.inputs[1])
        return None if entries is None else len(entries)
    return None


def _packed_rank(split: ir.Node) -> int | None:
    """The split tensor's rank; without shapes, 3 when its first slice is a MultiHeadAttention query
    next to a separate key (the op then requires [B, S, D])."""
    rank = value_rank(split.inputs[0])
    if rank is not None:
        return rank
    for use in split.outputs[0].uses():
        user = use.node
        while is_op(user, "Mul") or is_op(user, "Div"):
            nxt = single_consumer(user.outputs[0])
            if nxt is None:
                break
            user = nxt
        if (
            is_op(user, "MultiHeadAttention", MS_DOMAIN)
            and len(user.inputs) > 1
            and user.inputs[1] is not None
            and user.inputs[0] is not None
            and peel_scale(user.inputs[0])[0] is split.outputs[0]
        ):
            return 3
    return None


def _split_axis(split: ir.Node) -> int | None:
    axis = split.attributes.get_int("axis", 0)
    rank = _packed_rank(split)
    if axis < 0:
        return None if rank is None else axis + rank
    return axis


def _split_sizes(split: ir.Node) -> list[int] | None:
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        sizes = const_array(split.inputs[1])
        return None if sizes is None else [int(s) for s in sizes.reshape(-1)]
    attribute = split.attributes.get_ints("split", None)
    if attribute is not None:
        return [int(s) for s in attribute]
    return None  # equal parts: checked against the weight's width by the caller


@dataclass(frozen=True)
class _Projection:
    """``packed = x @ W (+ b)``: as MatMul (+ Add), or GPT-2's Reshape(Gemm(Reshape(x, [-1, K])))."""

    source: ir.Value
    weight: ir.Value
    bias: ir.Value | None
    nodes: tuple[ir.Node, ...]  # in graph order


def _only_feeds(value: ir.Value | None, node: ir.Node) -> bool:
    return value is not None and single_consumer(value) is node


def _projection(packed: ir.Value) -> _Projection | Mismatch:
    producer = packed.producer()
    if is_op(producer, "Reshape"):
        return _gemm_projection(packed)
    nodes: list[ir.Node] = []
    bias: ir.Value | None = None
    if is_op(producer, "Add"):
        assert producer is not None
        candidate = None
        for i in (0, 1):
            operand = producer.inputs[i]
            if operand is not None and is_op(operand.producer(), "MatMul"):
                candidate, bias = operand, producer.inputs[1 - i]
                break
        if candidate is None:
            return Mismatch("the packed Q/K/V is an Add without a MatMul operand")
        if not _only_feeds(candidate, producer):
            return Mismatch("the Q/K/V projection has other consumers")
        nodes.append(producer)
        producer = candidate.producer()
    if not is_op(producer, "MatMul"):
        return Mismatch("the packed Q/K/V is not a MatMul")
    assert producer is not None
    source, weight = producer.inputs[0], producer.inputs[1]
    if source is None or weight is None:
        return Mismatch("the Q/K/V MatMul has a missing input")
    return _Projection(source, weight, bias, (producer, *nodes))


def _projection_read_by(packed: ir.Value, reader: ir.Node) -> _Projection | Mismatch:
    """The projection ``packed`` comes from, when ``reader`` (the Split or view) is its only use."""
    if single_consumer(packed) is not reader or packed.is_graph_output():
        return Mismatch("the packed Q/K/V tensor has other consumers")
    return _projection(packed)


def _gemm_projection(packed: ir.Value) -> _Projection | Mismatch:
    """``Reshape(Gemm(Reshape(x, [-1, K]), W, b), [B, S, N])`` with B, S read off x (or equal dims)."""
    outer = packed.producer()
    assert outer is not None
    flat = outer.inputs[0]
    gemm = flat.producer() if flat is not None else None
    if not is_op(gemm, "Gemm") or gemm is None or not _only_feeds(flat, outer):
        return Mismatch("the packed Q/K/V is a Reshape, but not of a Gemm used only there")
    attrs = gemm.attributes
    if (
        attrs.get_float("alpha", 1.0) != 1.0
        or attrs.get_float("beta", 1.0) != 1.0
        or attrs.get_int("transA", 0) != 0
        or attrs.get_int("transB", 0) != 0
    ):
        return Mismatch("the Q/K/V Gemm scales or transposes its operands")
    inner = gemm.inputs[0].producer() if gemm.inputs[0] is not None else None
    weight, bias = gemm.inputs[1], gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if not is_op(inner, "Reshape") or inner is None or weight is None:
        return Mismatch("the Q/K/V Gemm does not read a flattened [B*S, K] input")
    source = inner.inputs[0]
    flat_target = const_array(inner.inputs[1])
    rows = static_dim(weight, 0)
    if (
        source is None
        or value_rank(source) not in (3, None)  # None: the Reshape back to [B, S, N] reads its dims
        or static_dim(source, 2) not in (None, rows)
        or flat_target is None
        or [int(t) for t in flat_target.reshape(-1)] != [-1, rows]  # no 0: allowzero moot
    ):
        return Mismatch("the Q/K/V Gemm's input is not Reshape(x, [-1, K]) of a rank-3 x")
    entries = target_entries(outer.inputs[1])
    if entries is None or len(entries) != 3 or 0 in entries:
        return Mismatch("the Q/K/V Gemm's output is not reshaped back to [B, S, N]")
    for axis in (0, 1):
        entry = entries[axis]
        if isinstance(entry, tuple):
            _, origin, index = entry
            if index == axis and (origin is source or same_symbol(origin, axis, source, axis)):
                continue
        return Mismatch("the Q/K/V Gemm's output is not reshaped back to x's [B, S]")
    return _Projection(source, weight, bias, (inner, gemm, outer))


def keeps_leading_dims(projection: _Projection) -> bool:
    """``x @ W (+ b)`` keeps every dim of x but the last: W a constant 2-D matrix, b at most 1-D.

    (GPT-2's Gemm form reshapes back to x's [B, S] by construction, see ``_gemm_projection``.)
    """
    if is_op(projection.nodes[-1], "Reshape"):
        return True
    weight = const_array(projection.weight)
    if weight is None or weight.ndim != 2:
        return False
    if projection.bias is None:
        return True
    bias = const_array(projection.bias)
    return bias is not None and bias.ndim <= 1


def _scales_keep_shape(nodes: list[ir.Node]) -> bool:
    """The peeled scale factors are scalars of rank <= 1, so they broadcast without adding dims."""
    for node in nodes:
        arrays = [const_array(v) for v in node.inputs]
        if any(a is not None and a.ndim > 1 for a in arrays):
            return False
    return True


def _feeds_attention(value: ir.Value) -> bool:
    return any(is_op(u.node, "MultiHeadAttention", MS_DOMAIN) and u.idx <= 2 for u in value.uses())


def _match_shape(shape: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Shape(q, start, end)`` -> ``Shape(x, start, end)`` for a MultiHeadAttention query, key or
    value q projected from x (``x @ W (+ b)``, maybe a slice of a merged projection, maybe times a
    scalar), when the Shape reads only leading dims, which the projection keeps (or is the
    whole shape, of which only leading dims are gathered).
    """
    source = shape.inputs[0]
    if source is None or not _feeds_attention(source):
        return Mismatch("not the shape of a MultiHeadAttention input", candidate=False)
    start = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", None)
    interleaved = _interleaved_read(source, start, end)
    if isinstance(interleaved, Mismatch):
        return interleaved
    if interleaved is not None:
        projection = _projection(interleaved[0])
        start, end = interleaved[1], interleaved[2]
        if isinstance(projection, Mismatch):
            return Mismatch(projection.reason, candidate=False)
        if not keeps_leading_dims(projection):
            return Mismatch("the projection may change the leading dims (weight or bias rank)")
        return _shape_match(shape, projection.source, start, end, context)
    base, _, scale_nodes = peel_scale(source)
    if not _scales_keep_shape(scale_nodes):
        return Mismatch("the Q/K/V scale factor may broadcast to a higher rank")
    split = base.producer()
    if is_op(split, "Split"):
        assert split is not None
        packed = split.inputs[0]
        rank = _packed_rank(split)
        if packed is None or rank is None or _split_axis(split) != rank - 1:
            return Mismatch("the Split is not along the last axis of a tensor of known rank")
        limit = rank - 1
    else:
        # A MultiHeadAttention query is [B, S, D]; a separate key or value [B, T, D] or
        # [B, N, T, H]: rank >= 3 either way, so dims 0 and 1 are never the projected one.
        packed, limit = base, 2
    leading = start >= 0 and end is not None and 0 <= end <= limit
    if not leading and not (
        start == 0 and end is None and _reads_leading_dims(shape.outputs[0], limit)
    ):
        return Mismatch("the Shape may read the projected axis")
    projection = _projection(packed)
    if isinstance(projection, Mismatch):
        return Mismatch(projection.reason, candidate=False)
    if not keeps_leading_dims(projection):
        return Mismatch("the projection may change the leading dims (weight or bias rank)")
    return _shape_match(shape, projection.source, start, end, context)


def _shape_match(
    shape: ir.Node, origin: ir.Value, start: int, end: int | None, context: RewriteContext
) -> Match:
    """``shape`` to be replaced by ``Shape(origin, start, end)``, or by an earlier such read."""
    # Q's and K's shapes now read the same dims of x: reuse an earlier read (CSE would, next run).
    existing = None
    for node in context.graph:
        if node is shape:
            break
        if (
            is_op(node, "Shape")
            and node.inputs[0] is origin
            and node.attributes.get_int("start", 0) == start
            and node.attributes.get_int("end", None) == end
        ):
            existing = node.outputs[0]
            break
    return Match([shape], {"source": origin, "existing": existing, "start": start, "end": end})


def _reads_leading_dims(shape: ir.Value, limit: int) -> bool:
    """Every use of ``shape`` (a whole Shape) is a Gather of dims below ``limit`` (GPT-Neo's
    TorchScript export reads S as ``Gather(Shape(q), 1)``) or a Slice of them (a one-dim read
    re-pointed below opset 15, where Shape has no start/end), so another tensor with the same
    leading dims, whatever its rank and last dim, gives the same values."""
    for use in shape.uses():
        if use.idx != 0:
            return False
        if is_op(use.node, "Slice"):
            if not _slices_below(use.node, limit):
                return False
            continue
        index = const_array(use.node.inputs[1]) if len(use.node.inputs) > 1 else None
        if (
            not is_op(use.node, "Gather")
            or index is None
            or index.size == 0
            or not bool(np.all((index >= 0) & (index < limit)))
        ):
            return False
    return not shape.is_graph_output()


def _slices_below(node: ir.Node, limit: int) -> bool:
    """``Slice(v, [start], [end] [, [0] [, [1]]])`` with 0 <= start < end <= ``limit``."""
    params = slice_params(node)
    if isinstance(params, Mismatch) or params.attribute_form or len(params.starts) != 1:
        return False
    (start,), (end,), (axis,), (step,) = params.starts, params.ends, params.axes, params.steps
    return axis == 0 and step == 1 and 0 <= start < end <= limit


def _rewrite_shape(match: Match, context: RewriteContext) -> Replacement:
    shape = match.root
    if match.bindings["existing"] is not None:
        return Replacement([], [(shape.outputs[0], match.bindings["existing"])])
    # A whole Shape stays one (Shape has no start/end before opset 15).
    attributes = {"start": match.bindings["start"]} if match.bindings["start"] else {}
    end = match.bindings["end"]
    if end is not None:
        attributes["end"] = end
    tape = ir.tape.Tape()
    new = tape.op("Shape", [match.bindings["source"]], attributes)
    return Replacement(tape.nodes, [(shape.outputs[0], new)])


@dataclass(frozen=True)
class _Qkv:
    """Where Q, K and V come from: one merged projection and a Split, or three projections of x."""

    source: ir.Value
    weights: tuple[ir.Value, ...]  # the merged [D_in, Dq + Dk + Dv] weight, or Wq, Wk, Wv
    biases: tuple[ir.Value | None, ...]  # one per weight
    sizes: tuple[int, int, int] | None  # the Split's sizes (None: equal parts, or no Split)
    nodes: tuple[ir.Node, ...]
    # The merged weight's columns in [Q | K | V] order, where the projection interleaves them
    # per head (BLOOM); None: already in that order.
    columns: tuple[int, ...] | None = None


def _merged_qkv(split: ir.Node, query: ir.Value, key: ir.Value, value: ir.Value) -> _Qkv | Mismatch:
    if len(split.outputs) != 3 or list(split.outputs) != [query, key, value]:
        return Mismatch("Q, K and V are not the three outputs of one Split")
    packed = split.inputs[0]
    if packed is None or _packed_rank(split) != 3 or _split_axis(split) != 2:
        return Mismatch("the Split is not along the last axis of a [B, S, 3*D] tensor")
    projection = _projection_read_by(packed, split)
    if isinstance(projection, Mismatch):
        return projection
    sizes = _split_sizes(split)
    if sizes is not None and len(sizes) != 3:
        return Mismatch(f"the Split has sizes {sizes}")
    return _Qkv(
        projection.source,
        (projection.weight,),
        (projection.bias,),
        None if sizes is None else (sizes[0], sizes[1], sizes[2]),
        (*projection.nodes, split),
    )


def _separate_qkv(query: ir.Value, key: ir.Value, value: ir.Value) -> _Qkv | Mismatch:
    if query is key or query is value or key is value:
        return Mismatch("Q, K and V are not three different tensors")
    projections: list[_Projection] = []
    for role, part in zip(("query", "key", "value"), (query, key, value), strict=True):
        projection = _projection(part)
        if isinstance(projection, Mismatch):
            # Name the op in the way (CodeGen: a RotaryEmbedding between projection and attention)
            made_by = part.producer()
            what = f"{made_by.op_type}'s output" if made_by is not None else "a graph input"
            return Mismatch(
                f"Q, K and V are neither one Split nor three projections (the {role} is {what}: "
                f"{projection.reason})"
            )
        projections.append(projection)
    source = projections[0].source
    if any(p.source is not source for p in projections[1:]):
        return Mismatch("Q, K and V are projections of different tensors (not self-attention)")
    return _Qkv(
        source,
        tuple(p.weight for p in projections),
        tuple(p.bias for p in projections),
        None,
        tuple(n for p in projections for n in p.nodes),
    )


def _gathered_part(value: ir.Value, part: int) -> tuple[ir.Node, ir.Value] | None:
    """``value = Gather(packed5, part, axis=3)``: (the Gather, packed5)."""
    gather = value.producer()
    if not is_op(gather, "Gather") or gather is None or gather.inputs[0] is None:
        return None
    index = const_array(gather.inputs[1])
    if index is None or index.ndim != 0 or int(index) != part:
        return None
    if gather.attributes.get_int("axis", 0) not in (3, -2):
        return None
    return gather, gather.inputs[0]


def _interleaved_view(packed5: ir.Value) -> tuple[ir.Node, list[int]] | Mismatch:
    """``packed5 = Reshape(packed, [0, 0, H, 3, d])`` (copying B and S): (the Reshape, its dims)."""
    return _packed_view(packed5, 3)


def _packed_view(packed5: ir.Value, parts_axis: int) -> tuple[ir.Node, list[int]] | Mismatch:
    """``packed5 = Reshape(packed, [0, 0, ., ., d])`` (copying B and S) with the 3 of Q/K/V at
    ``parts_axis`` (3: BLOOM's [B, S, H, 3, d], 2: [B, S, 3, H, d]): (the Reshape, its dims)."""
    want = "[0, 0, H, 3, d]" if parts_axis == 3 else "[0, 0, 3, H, d]"
    view = packed5.producer()
    target = const_array(view.inputs[1]) if is_op(view, "Reshape") and view is not None else None
    if view is None or target is None or view.inputs[0] is None:
        return Mismatch(f"the {want} view of the packed Q/K/V has no constant target")
    dims = [int(t) for t in target.reshape(-1)]
    if len(dims) != 5 or min(dims[2:]) <= 0 or dims[parts_axis] != 3:
        return Mismatch(f"the packed Q/K/V is viewed as {dims}, not {want}")
    copies = not view.attributes.get_int("allowzero", 0)
    packed = view.inputs[0]
    # B may also be the -1 (torch.export at a static S): the rest is then all of [S, 3*H*d]
    inferred_batch = (
        dims[0] == -1
        and value_rank(packed) == 3
        and static_dim(packed, 2) == dims[2] * dims[3] * dims[4]
    )
    for axis in (0, 1):  # B and S copied (0), or the packed tensor's static sizes (folded)
        if not (
            (dims[axis] == 0 and copies)
            or dims[axis] == static_dim(packed, axis)
            or (axis == 0 and inferred_batch)
        ):
            return Mismatch(f"the packed Q/K/V is viewed as {dims}: dims 0, 1 are not its [B, S]")
    return view, dims


def _blocked_part(value: ir.Value) -> tuple[int, list[ir.Node], ir.Value] | None:
    """Part j of a [3, B, H, S, d] tensor t, taken along axis 0 as PyTorch's ``unbind(0)`` is
    exported: ``Gather(t, j, axis=0)``, ``Squeeze(Slice(t, [j], [j+1], [0]), [0])`` or
    ``Squeeze(Split(t, axis=0)[j], [0])``: (j, the nodes, t)."""
    node = value.producer()
    if is_op(node, "Gather") and node is not None and node.inputs[0] is not None:
        index = const_array(node.inputs[1])
        if index is None or index.ndim != 0 or node.attributes.get_int("axis", 0) != 0:
            return None
        return int(index), [node], node.inputs[0]
    if not is_op(node, "Squeeze") or node is None or node.inputs[0] is None:
        return None
    axes = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None:
        axes = np.array(node.attributes.get_ints("axes", ()), dtype=np.int64)
    if [int(a) for a in axes.reshape(-1)] != [0]:
        return None
    piece = node.inputs[0]
    taker = piece.producer()
    if is_op(taker, "Slice") and taker is not None and taker.inputs[0] is not None:
        bounds = [const_array(v) if v is not None else None for v in taker.inputs[1:5]]
        starts, ends, slice_axes = bounds[:3] if len(bounds) >= 3 else (None, None, None)
        steps = bounds[3] if len(bounds) > 3 else np.ones(1, np.int64)
        if starts is None or ends is None or slice_axes is None or steps is None:
            return None
        if [int(slice_axes.reshape(-1)[0]), int(steps.reshape(-1)[0])] != [0, 1] or any(
            b.size != 1 for b in (starts, ends, slice_axes, steps)
        ):
            return None
        part = int(starts.reshape(-1)[0])
        if int(ends.reshape(-1)[0]) != part + 1 or part not in (0, 1, 2):
            return None
        return part, [node, taker], taker.inputs[0]
    if is_op(taker, "Split") and taker is not None and taker.inputs[0] is not None:
        sizes = _split_sizes(taker)
        if _split_axis(taker) != 0 or len(taker.outputs) != 3 or sizes not in (None, [1, 1, 1]):
            return None
        return list(taker.outputs).index(piece), [node, taker], taker.inputs[0]
    return None


def _blocked_view(packed5t: ir.Value) -> tuple[ir.Node, ir.Node, list[int]] | Mismatch:
    """``packed5t = Transpose(Reshape(packed, [0, 0, 3, H, d]), [2, 0, 3, 1, 4])``, [3, B, H, S, d]
    (``qkv.reshape(B, S, 3, H, d).permute(2, 0, 3, 1, 4)``): (the Transpose, the Reshape, its dims)."""
    transpose = packed5t.producer()
    if transpose_perm(transpose) != [2, 0, 3, 1, 4] or transpose is None:
        return Mismatch(
            "the Q/K/V parts are not of a [B, S, 3, H, d] view permuted (2, 0, 3, 1, 4)"
        )
    packed5 = transpose.inputs[0]
    found = _packed_view(packed5, 2) if packed5 is not None else None
    if found is None or isinstance(found, Mismatch):
        return found or Mismatch("the [B, S, 3, H, d] view is missing")
    return transpose, found[0], found[1]


def _interleaved_read(
    value: ir.Value, start: int, end: int | None
) -> tuple[ir.Value, int, int] | Mismatch | None:
    """A read ``Shape(value, start, end)`` of an interleaved query ([B, S, H*d]) or K/V
    ([B, H, S, d]) as the same dims of the packed projection (x @ W (+ b) keeps x's [B, S]):
    (packed, start, end) there; None when ``value`` is not such a part."""
    node = value.producer()
    axes: dict[int, int]
    view: ir.Node | None = None
    if is_op(node, "Reshape"):  # the query, [B, S] kept by [0, 0, -1]
        assert node is not None
        merge = const_array(node.inputs[1])
        heads = node.inputs[0]
        if merge is None or [int(t) for t in merge.reshape(-1)] != [0, 0, -1] or heads is None:
            return None
        found = _gathered_part(heads, 0)
        if found is not None and not isinstance(_interleaved_view(found[1]), Mismatch):
            view = found[1].producer()
        mover = heads.producer() if _moved(heads) else None
        moved = mover.inputs[0] if mover is not None else None
        blocked = _blocked_part(moved) if moved is not None else None
        if blocked is not None and blocked[0] == 0:
            found_view = _blocked_view(blocked[2])
            view = None if isinstance(found_view, Mismatch) else found_view[1]
        axes = {0: 0, 1: 1}
    elif transpose_perm(node) == [0, 2, 1, 3]:  # K/V: B stays, S moved to axis 2
        assert node is not None
        gathered = node.inputs[0]
        found = next(
            (f for part in (1, 2) if gathered and (f := _gathered_part(gathered, part))), None
        )
        if found is not None and not isinstance(_interleaved_view(found[1]), Mismatch):
            view = found[1].producer()
        axes = {0: 0, 2: 1}
    else:  # a blocked K/V part, [B, H, S, d] already
        blocked = _blocked_part(value)
        if blocked is not None and blocked[0] in (1, 2):
            found_view = _blocked_view(blocked[2])
            view = None if isinstance(found_view, Mismatch) else found_view[1]
        axes = {0: 0, 2: 1}
    if view is None:
        return None
    if end is None or start < 0 or end <= start or any(a not in axes for a in range(start, end)):
        return Mismatch("the Shape reads dims of the packed Q/K/V that x does not have")
    if any(axes[a] != axes[start] + a - start for a in range(start, end)):
        return Mismatch("the Shape reads dims of the packed Q/K/V in another order than x's")
    assert view.inputs[0] is not None
    return view.inputs[0], axes[start], axes[start] + end - start


def _moved(heads: ir.Value) -> bool:
    """``heads = Transpose(t, [0, 2, 1, 3])`` ([B, H, S, d] to [B, S, H, d])."""
    return transpose_perm(heads.producer()) == [0, 2, 1, 3]


def _interleaved_qkv(
    query: ir.Value, key: ir.Value, value: ir.Value, heads: int
) -> _Qkv | Mismatch:
    """BLOOM's packed projection, Q/K/V interleaved per head::

        packed5 = Reshape(x @ W + b, [0, 0, H, 3, d])                  ([B, S, H, 3, d])
        q = Reshape(Gather(packed5, 0, axis=3), [0, 0, -1])            ([B, S, H*d])
        k = Transpose(Gather(packed5, 1, axis=3), [0, 2, 1, 3])        ([B, H, S, d]), v with 2

    Column h*3d + j*d + e of W is element e of head h of part j (Q, K, V), so W with its columns
    reordered to [Q | K | V] (j, h, e) is the merged weight of the three projections."""
    reshape = query.producer()
    if not is_op(reshape, "Reshape") or reshape is None or reshape.inputs[0] is None:
        return Mismatch("the query is not a Reshape", candidate=False)
    found = _gathered_part(reshape.inputs[0], 0)
    if found is None:
        return Mismatch("the query is not part 0 of a [B, S, H, 3, d] view", candidate=False)
    merge = const_array(reshape.inputs[1])
    if merge is None or [int(t) for t in merge.reshape(-1)] != [0, 0, -1]:
        return Mismatch("the interleaved query is not merged by Reshape([0, 0, -1])")
    nodes = [reshape, found[0]]
    packed5 = found[1]
    for part, side in ((1, key), (2, value)):
        transpose = side.producer()
        if transpose is None or list(transpose.attributes.get_ints("perm", ())) != [0, 2, 1, 3]:
            return Mismatch("the interleaved K/V are not moved to [B, H, T, d] by one Transpose")
        gathered = transpose.inputs[0]
        found = _gathered_part(gathered, part) if gathered is not None else None
        if not is_op(transpose, "Transpose") or found is None or found[1] is not packed5:
            return Mismatch("K and V are not parts 1 and 2 of the query's [B, S, H, 3, d] view")
        nodes += [transpose, found[0]]
    found_view = _interleaved_view(packed5)
    if isinstance(found_view, Mismatch):
        return found_view
    view, dims = found_view
    if dims[2] != heads:
        return Mismatch(f"the packed Q/K/V is viewed as {dims}, not [0, 0, {heads}, 3, d]")
    packed = view.inputs[0]
    assert packed is not None
    users = [u.node for u in packed5.uses()]
    if packed5.is_graph_output() or len(users) != 3 or any(u not in nodes for u in users):
        return Mismatch("the [B, S, H, 3, d] view has other consumers")
    projection = _projection_read_by(packed, view)
    if isinstance(projection, Mismatch):
        return projection
    size = dims[4]
    columns = tuple(
        h * 3 * size + j * size + e for j in range(3) for h in range(heads) for e in range(size)
    )
    return _Qkv(
        projection.source,
        (projection.weight,),
        (projection.bias,),
        None,
        (*projection.nodes, view, *nodes),
        columns,
    )


def _blocked_qkv(query: ir.Value, key: ir.Value, value: ir.Value, heads: int) -> _Qkv | Mismatch:
    """One projection viewed as [B, S, 3, H, d] and permuted to [3, B, H, S, d], as ViTs and
    hand-written attention take Q, K and V apart (``qkv.reshape(B, S, 3, H, d).permute(2, 0, 3, 1,
    4).unbind(0)``)::

        parts = Transpose(Reshape(x @ W + b, [0, 0, 3, H, d]), [2, 0, 3, 1, 4])
        q = Reshape(Transpose(part 0, [0, 2, 1, 3]), [0, 0, -1])         ([B, S, H*d])
        k, v = parts 1 and 2                                            ([B, H, S, d])

    Column j*H*d + h*d + e of W is element e of head h of part j: W is already [Wq | Wk | Wv]."""
    reshape = query.producer()
    moved = reshape.inputs[0] if is_op(reshape, "Reshape") and reshape is not None else None
    if moved is None or not _moved(moved):
        return Mismatch("the query is not a Reshape of heads moved by a Transpose", candidate=False)
    transpose = moved.producer()
    assert transpose is not None and reshape is not None and transpose.inputs[0] is not None
    found = _blocked_part(transpose.inputs[0])
    if found is None or found[0] != 0:
        return Mismatch("the query is not part 0 of a [3, B, H, S, d] tensor", candidate=False)
    merge = const_array(reshape.inputs[1])
    if merge is None or [int(t) for t in merge.reshape(-1)] != [0, 0, -1]:
        return Mismatch("the packed query is not merged by Reshape([0, 0, -1])")
    parts = found[2]
    nodes = [reshape, transpose, *found[1]]
    for part, side in ((1, key), (2, value)):
        other = _blocked_part(side)
        if other is None or other[0] != part or other[2] is not parts:
            return Mismatch("K and V are not parts 1 and 2 of the query's [3, B, H, S, d] tensor")
        nodes += [n for n in other[1] if all(n is not m for m in nodes)]
    found_view = _blocked_view(parts)
    if isinstance(found_view, Mismatch):
        return found_view
    permute, view, dims = found_view
    if dims[3] != heads:
        return Mismatch(f"the packed Q/K/V is viewed as {dims}, not [0, 0, 3, {heads}, d]")
    for tensor in (parts, permute.inputs[0]):
        assert tensor is not None
        if tensor.is_graph_output() or any(
            all(u.node is not n for n in [*nodes, permute]) for u in tensor.uses()
        ):
            return Mismatch("the [B, S, 3, H, d] view has other consumers")
    packed = view.inputs[0]
    assert packed is not None
    projection = _projection_read_by(packed, view)
    if isinstance(projection, Mismatch):
        return projection
    return _Qkv(
        projection.source,
        (projection.weight,),
        (projection.bias,),
        None,
        (*projection.nodes, view, permute, *nodes),
    )


def _check_weights(qkv: _Qkv) -> tuple[int, int, int] | Mismatch:
    """The Q/K/V widths, once every weight is a constant [D_in, .] of the input's float type and
    every bias fits."""
    rows = set()
    widths = []
    wanted = qkv.source.dtype.numpy() if qkv.source.dtype is not None else np.dtype(np.float32)
    for weight_value, bias_value in zip(qkv.weights, qkv.biases, strict=True):
        weight = const_array(weight_value)
        if weight is None or weight.ndim != 2:
            return Mismatch("the Q/K/V projection's weight is not a constant 2-D matrix")
        if weight.dtype != wanted:
            return Mismatch(f"a Q/K/V weight is {weight.dtype}, the projected input {wanted}")
        rows.add(int(weight.shape[0]))
        widths.append(int(weight.shape[1]))
        if bias_value is not None:
            bias = const_array(bias_value)
            if bias is None or bias.shape != (weight.shape[1],) or bias.dtype != wanted:
                return Mismatch(
                    f"a Q/K/V bias is not a constant {wanted} vector of the weight's width"
                )
    if len(rows) != 1:
        return Mismatch(f"the Q/K/V weights have different row counts {sorted(rows)}")
    if qkv.columns is not None and len(qkv.columns) != widths[0]:
        return Mismatch(f"the [B, S, H, 3, d] view does not split the {widths[0]} columns")
    if len(widths) == 3:
        return widths[0], widths[1], widths[2]
    if qkv.sizes is not None:
        if sum(qkv.sizes) != sum(widths):
            return Mismatch(f"the Split sizes {list(qkv.sizes)} do not add up to {sum(widths)}")
        return qkv.sizes
    if widths[0] % 3:
        return Mismatch(f"the Split makes three equal parts of {widths[0]} columns")
    return (widths[0] // 3,) * 3


def _match_attention(
    mha: ir.Node, context: RewriteContext, kind: str, defer_causal: bool = False
) -> Match | Mismatch:
    """``kind``: where Q, K and V come from, "split" (one projection and a Split), "separate"
    (three projections), "interleaved" (one projection viewed as [B, S, H, 3, d]) or "blocked"
    (one viewed as [B, S, 3, H, d] and permuted to [3, B, H, S, d]). With ``defer_causal`` a
    block fuse-group-query-attention would make GroupQueryAttention(causal=1) is left to it."""
    inputs = list(mha.inputs)
    if len(inputs) < 3 or any(v is None for v in inputs[:3]):
        return Mismatch("MultiHeadAttention has no separate Q, K and V")
    extra = [i for i, v in enumerate(inputs) if v is not None and i > 2 and i != _ATTENTION_BIAS]
    if extra:
        return Mismatch(f"MultiHeadAttention has inputs Attention does not take (index {extra})")
    unknown = sorted(set(mha.attributes) - _PASSED_ATTRIBUTES)
    if unknown:
        return Mismatch(f"MultiHeadAttention has attributes {unknown}")
    if any(out.uses() or out.is_graph_output() for out in mha.outputs[1:]):
        return Mismatch("MultiHeadAttention's present key/value outputs are used")
    scaled_query, key, value = inputs[:3]
    assert scaled_query is not None and key is not None and value is not None
    # Whisper scales the projected query: MHA(q * c, k, v, scale=s) = MHA(q, k, v, scale=s * c)
    query, factor, scale_nodes = peel_scale(scaled_query)
    for node in scale_nodes:
        if node.outputs[0].is_graph_output() or len(node.outputs[0].uses()) != 1:
            return Mismatch("the query's scale factor has other consumers")
    split = query.producer()
    heads = mha.attributes.get_int("num_heads", 0)
    viewed = {
        "interleaved": _interleaved_qkv(query, key, value, heads),
        "blocked": _blocked_qkv(query, key, value, heads),
    }
    chosen = next((k for k, v in viewed.items() if not isinstance(v, Mismatch) or v.candidate), "")
    if kind != chosen and (chosen or kind in viewed):
        return Mismatch("left to another packed-attention rule", candidate=False)
    if kind not in viewed and is_op(split, "Split") != (kind == "split"):
        return Mismatch("left to the other packed-attention rule", candidate=False)
    # Only the one rule of this block's kind gets here: the proof runs once per block.
    if defer_causal and isinstance(causal_gqa_match(mha, context), Match):
        return Mismatch(
            "a causal mask: left to fuse-group-query-attention (GroupQueryAttention, causal=1)",
            candidate=False,
        )
    if kind in viewed:
        qkv = viewed[kind]
    elif split is not None and kind == "split":
        qkv = _merged_qkv(split, query, key, value)
    else:
        qkv = _separate_qkv(query, key, value)
    if isinstance(qkv, Mismatch):
        return qkv
    dead: list[ir.Node] = []  # leftovers of fuse-attention that dead-code elimination drops later
    for part in (query, key, value):
        others = [u.node for u in part.uses() if u.node is not mha and u.node not in scale_nodes]
        if part.is_graph_output() or not all(is_unread(n) for n in others):
            return Mismatch("a Q/K/V projection has other consumers than the attention")
        dead += [n for n in others if all(n is not d for d in dead)]
    source = qkv.source
    if source.dtype is not None and source.dtype not in ATTENTION_DTYPES:
        return Mismatch(
            f"projections in {source.dtype.name}: only float32 and float16 are fused "
            "(Attention's CPU coverage)"
        )
    if value_rank(source) not in (3, None):  # None: MatMul with a 2-D weight keeps the rank, 3
        return Mismatch("the projection's input is not [B, S, D_in] (Attention takes rank 3)")
    # Before reading the weights: the cheap refusal first (Whisper's encoder, every layer).
    has_mask = len(inputs) > _ATTENTION_BIAS and inputs[_ATTENTION_BIAS] is not None
    if not has_mask:
        length = static_dim(source, 1)
        if length is None or length > MAX_UNMASKED_SEQUENCE:
            said = "a dynamic sequence length" if length is None else f"sequence length {length}"
            return Mismatch(f"no mask and {said}: MultiHeadAttention is faster")
    sizes = _check_weights(qkv)
    if isinstance(sizes, Mismatch):
        return sizes
    if sizes[0] != sizes[1]:
        return Mismatch(
            f"Q and K widths differ ({sizes[0]} vs {sizes[1]}); Attention needs them equal"
        )
    if heads <= 0 or any(size % heads for size in sizes):
        return Mismatch(f"the widths {list(sizes)} are not multiples of num_heads {heads}")
    position = {id(n): i for i, n in enumerate(context.graph)}
    nodes = sorted([*qkv.nodes, *dead, *scale_nodes], key=lambda n: position.get(id(n), -1))
    scale = mha.attributes.get_float("scale", 0.0) or float(1.0 / np.sqrt(sizes[0] // heads))
    return Match(
        [*nodes, mha],
        {"qkv": qkv, "sizes": sizes, "heads": heads, "scale": scale * factor},
    )


def _rewrite_attention(match: Match, context: RewriteContext) -> Replacement:
    mha = match.root
    qkv: _Qkv = match.bindings["qkv"]
    sizes: tuple[int, int, int] = match.bindings["sizes"]
    constants: list[ir.Value] = []
    if len(qkv.weights) == 1 and qkv.columns is not None:
        order = np.array(qkv.columns)
        hint = qkv.weights[0].name
        array = const_array(qkv.weights[0])
        assert array is not None
        weight = new_constant(array[:, order], hint)
        constants.append(weight)
        bias = None
        bias_array = const_array(qkv.biases[0]) if qkv.biases[0] is not None else None
        if bias_array is not None:
            bias = new_constant(bias_array[order], hint)
            constants.append(bias)
    elif len(qkv.weights) == 1:
        weight, bias = qkv.weights[0], qkv.biases[0]
    else:
        hint = qkv.weights[0].name
        arrays = [a for a in (const_array(w) for w in qkv.weights) if a is not None]
        weight = new_constant(np.concatenate(arrays, axis=1), hint)
        constants.append(weight)
        bias = None
        if any(b is not None for b in qkv.biases):
            parts = [
                const_array(b) if b is not None else np.zeros(size, arrays[0].dtype)
                for b, size in zip(qkv.biases, sizes, strict=True)
            ]
            bias = new_constant(np.concatenate([p for p in parts if p is not None]), hint)
            constants.append(bias)
    if bias is None:
        bias = _zero_bias(weight, sum(sizes))
        constants.append(bias)
    attention_bias = mha.inputs[_ATTENTION_BIAS] if len(mha.inputs) > _ATTENTION_BIAS else None
    inputs: list[ir.Value | None] = [qkv.source, weight, bias]
    if attention_bias is not None:
        inputs += [None, None, attention_bias]
    attributes: dict[str, int | float | list[int]] = {
        "num_heads": match.bindings["heads"],
        "scale": match.bindings["scale"],
    }
    if sizes[2] != sizes[0]:
        attributes["qkv_hidden_sizes"] = list(sizes)
    tape = ir.tape.Tape()
    attention = tape.op("Attention", inputs, attributes, domain=MS_DOMAIN)
    return Replacement(tape.nodes, [(mha.outputs[0], attention)], constants=constants)


SHAPE_RULE = Rule("shape-of-qkv-slice->shape-of-input", "Shape", _match_shape, _rewrite_shape)


def _zero_bias(weight: ir.Value, width: int) -> ir.Value:
    """Attention's bias where the model has none: ORT before 1.32 reads the input unchecked and
    crashes (SIGSEGV) without one."""
    assert weight.dtype is not None
    return new_constant(np.zeros(width, weight.dtype.numpy()), f"{weight.name}_bias")


def _match_missing_bias(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """An Attention already in the model (an older onnxopt's output) without its bias input."""
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        return Mismatch("Attention has its bias", False)
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    width = static_dim(weight, 1) if weight is not None and weight.dtype is not None else None
    if weight is None or width is None or len(node.outputs) != 1:
        return Mismatch("Attention's weight width is unknown, or it has a present output")
    return Match([node], {"width": width})


def _rewrite_missing_bias(match: Match, context: RewriteContext) -> Replacement:
    node = match.root
    weight = node.inputs[1]
    assert weight is not None
    bias = _zero_bias(weight, match.bindings["width"])
    inputs = [*node.inputs, *[None] * (3 - len(node.inputs))]
    inputs[2] = bias
    tape = ir.tape.Tape()
    attention = tape.op("Attention", inputs, dict(node.attributes), domain=MS_DOMAIN)
    return Replacement(tape.nodes, [(node.outputs[0], attention)], constants=[bias])


# ORT before 1.32 reads Attention's bias input unchecked and crashes without one: an Attention
# this pass wrote before it always gave one is given a zero bias.
BIAS_RULE = Rule(
    "attention-without-bias->zero-bias",
    "Attention",
    _match_missing_bias,
    _rewrite_missing_bias,
    domain=MS_DOMAIN,
)


def _attention_rule(name: str, kind: str, defer_causal: bool = False) -> Rule:
    """The MultiHeadAttention -> Attention rule for Q/K/V of ``kind`` (see _match_attention)."""
    return Rule(
        name,
        "MultiHeadAttention",
        lambda node, context: _match_attention(node, context, kind, defer_causal),
        _rewrite_attention,
        domain=MS_DOMAIN,
    )


_KINDS = {
    "qkv-matmul+split+mha->attention": "split",
    "q,k,v-matmuls+mha->attention": "separate",
    "interleaved-qkv-matmul+mha->attention": "interleaved",
    "blocked-qkv-matmul+mha->attention": "blocked",
}


class FusePackedAttentionPass(Pass):
    """Fold the Q/K/V projections of x (three MatMuls, or one and a Split) and the
    MultiHeadAttention reading them into com.microsoft.Attention (ort)."""

    name = "fuse-packed-attention"
    summary = (
        "fold Q/K/V projections + MultiHeadAttention into one Attention op (ort; masked or short)"
    )

    # Set when fuse-group-query-attention runs later in the same pipeline (levels.build_steps):
    # causal self-attention is then left to it, measured faster as GroupQueryAttention(causal=1)
    # (see fuse_group_query_attention.py); run alone, this pass fuses it as before.
    defer_causal: bool = False

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        rules = [SHAPE_RULE, BIAS_RULE]
        rules += [_attention_rule(name, kind, self.defer_causal) for name, kind in _KINDS.items()]
        stats, notes = apply_rules(model, rules, self.options)
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
