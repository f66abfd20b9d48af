"""Fold the merged Q/K/V projection into the attention op: one com.microsoft.Attention per layer.

After ``fuse-attention`` and ``merge-qkv-projections`` a self-attention layer reads::

    qkv     = MatMul(x, W) (+ b)              W a constant [D_in, 3*D], b a constant [3*D]
    q, k, v = Split(qkv, [D, D, D], axis=-1)
    y       = MultiHeadAttention(q, k, v, attention_bias=mask, num_heads=N, scale=s)

For ``--target ort`` this becomes ``y = Attention(x, W, b, attention_bias=mask, num_heads=N,
scale=s)``: the same products, but ONNX Runtime prepacks W per head and writes Q, K and V straight
into its [B, N, S, d] working layout, so the Split copy and MultiHeadAttention's own head
transposes go away (``benchmarks/attention_layouts_micro.py``). The mask stays the exact additive
bias; the output is bit-identical on ORT's CPU kernels.

The Expand that spells the mask out to [., ., S, T] reads S and T as ``Shape(q)[1:2]`` and
``Shape(k)[1:2]``; a companion rule reads those dims off the Split's input instead (a Split along
the last axis keeps the leading dims), so that the slices have no other consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, single_consumer
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.fuse_attention import _dim, _peel_scale, _same_symbol, _target_entries
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules

# MultiHeadAttention inputs: query, key, value, bias, key_padding_mask, attention_bias, past_key,
# past_value (, past_sequence_length, cache_indirection). Only Q, K, V and attention_bias map 1:1.
_ATTENTION_BIAS = 5
_PASSED_ATTRIBUTES = frozenset({"num_heads", "scale"})


def _rank(value: ir.Value | None, depth: int = 0) -> int | None:
    """The value's rank; for fresh MatMul/Add outputs (no shape inferred yet) read off the inputs."""
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    node = value.producer()
    if depth < 4 and (is_op(node, "MatMul") or is_op(node, "Add")):
        assert node is not None
        ranks = [_rank(v, depth + 1) for v in node.inputs]
        if any(r is None for r in ranks):
            return None
        known = [r for r in ranks if r is not None]
        if is_op(node, "MatMul") and known[1] == 2:
            return known[0]
        if is_op(node, "Add"):
            return max(known)
    if is_op(node, "Reshape"):
        assert node is not None
        entries = _target_entries(node.inputs[1])
        return None if entries is None else len(entries)
    return None


def _packed_rank(split: ir.Node) -> int | None:
    """The split tensor's rank; without shapes, 3 when its first slice is a MultiHeadAttention query
    next to a separate key (the op then requires [B, S, D])."""
    rank = _rank(split.inputs[0])
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
            and _peel_scale(user.inputs[0])[0] is split.outputs[0]
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
    rows = _dim(weight, 0)
    if (
        source is None
        or _rank(source) not in (3, None)  # None: the Reshape back to [B, S, N] reads its dims
        or _dim(source, 2) not in (None, rows)
        or flat_target is None
        or [int(t) for t in flat_target.reshape(-1)] != [-1, rows]  # no 0: allowzero moot
    ):
        return Mismatch("the Q/K/V Gemm's input is not Reshape(x, [-1, K]) of a rank-3 x")
    entries = _target_entries(outer.inputs[1])
    if entries is None or len(entries) != 3 or 0 in entries:
        return Mismatch("the Q/K/V Gemm's output is not reshaped back to [B, S, N]")
    for axis in (0, 1):
        entry = entries[axis]
        if isinstance(entry, tuple):
            _, origin, index = entry
            if index == axis and (origin is source or _same_symbol(origin, axis, source, axis)):
                continue
        return Mismatch("the Q/K/V Gemm's output is not reshaped back to x's [B, S]")
    return _Projection(source, weight, bias, (inner, gemm, outer))


def _match_shape(shape: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Shape(Split(p)[i], start, end)`` -> ``Shape(x, start, end)``: x the tensor p was projected from.

    The Split is along the last axis and the Shape reads only leading dims, which the projection
    ``p = x @ W (+ b)`` keeps.
    """
    source = shape.inputs[0]
    split = source.producer() if source is not None else None
    if not is_op(split, "Split"):
        return Mismatch("not the shape of a Split output", candidate=False)
    assert split is not None and source is not None
    if not any(is_op(u.node, "MultiHeadAttention", MS_DOMAIN) for u in source.uses()):
        return Mismatch("the Split output does not feed MultiHeadAttention", candidate=False)
    packed = split.inputs[0]
    rank = _packed_rank(split)
    start = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", None)
    if packed is None or rank is None or _split_axis(split) != rank - 1:
        return Mismatch("the Split is not along the last axis of a tensor of known rank")
    if start < 0 or end is None or not 0 <= end < rank:
        return Mismatch("the Shape may read the split axis")
    projection = _projection(packed)
    if isinstance(projection, Mismatch):
        return projection
    origin = projection.source
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
    return Match([shape], {"source": origin, "existing": existing})


def _rewrite_shape(match: Match, context: RewriteContext) -> Replacement:
    shape = match.root
    if match.bindings["existing"] is not None:
        return Replacement([], [(shape.outputs[0], match.bindings["existing"])])
    attributes = {"start": shape.attributes.get_int("start", 0)}
    end = shape.attributes.get_int("end", None)
    if end is not None:
        attributes["end"] = end
    tape = ir.tape.Tape()
    new = tape.op("Shape", [match.bindings["source"]], attributes)
    return Replacement(tape.nodes, [(shape.outputs[0], new)])


def _is_dead(node: ir.Node) -> bool:
    return all(not out.uses() and not out.is_graph_output() for out in node.outputs)


def _match_attention(mha: ir.Node, context: RewriteContext) -> Match | Mismatch:
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
    query, factor, scale_nodes = _peel_scale(scaled_query)
    for node in scale_nodes:
        if node.outputs[0].is_graph_output() or len(node.outputs[0].uses()) != 1:
            return Mismatch("the query's scale factor has other consumers")
    split = query.producer()
    if (
        not is_op(split, "Split")
        or split is None
        or len(split.outputs) != 3
        or list(split.outputs) != [query, key, value]
    ):
        return Mismatch("Q, K and V are not the three outputs of one Split")
    dead: list[ir.Node] = []  # leftovers of fuse-attention that dead-code elimination drops later
    for part in split.outputs:
        others = [u.node for u in part.uses() if u.node is not mha and u.node not in scale_nodes]
        if part.is_graph_output() or not all(_is_dead(n) for n in others):
            return Mismatch("a Q/K/V slice has other consumers than the attention")
        dead += [n for n in others if all(n is not d for d in dead)]
    packed = split.inputs[0]
    if packed is None or _packed_rank(split) != 3 or _split_axis(split) != 2:
        return Mismatch("the Split is not along the last axis of a [B, S, 3*D] tensor")
    if single_consumer(packed) is not split or packed.is_graph_output():
        return Mismatch("the packed Q/K/V tensor has other consumers")
    projection = _projection(packed)
    if isinstance(projection, Mismatch):
        return projection
    source, weight_value, bias = projection.source, projection.weight, projection.bias
    weight = const_array(weight_value)
    if source is None or weight is None or weight.ndim != 2:
        return Mismatch("the Q/K/V projection's weight is not a constant 2-D matrix")
    if weight.dtype != np.float32 or (
        source.dtype is not None and source.dtype != ir.DataType.FLOAT
    ):
        return Mismatch("only float32 projections are fused (Attention's CPU kernel)")
    if _rank(source) not in (3, None):  # None: MatMul with a 2-D weight keeps the rank, 3
        return Mismatch("the projection's input is not [B, S, D_in] (Attention takes rank 3)")
    width = int(weight.shape[1])
    if bias is not None:
        bias_array = const_array(bias)
        if bias_array is None or bias_array.shape != (width,) or bias_array.dtype != np.float32:
            return Mismatch("the Q/K/V bias is not a constant [3*D] float32 vector")
    sizes = _split_sizes(split)
    if sizes is None:
        sizes = [width // 3] * 3 if width % 3 == 0 else []
    if len(sizes) != 3 or sum(sizes) != width or len(set(sizes)) != 1:
        return Mismatch(f"Q, K and V widths are not equal ({sizes} of {width})")
    heads = mha.attributes.get_int("num_heads", 0)
    if heads <= 0 or sizes[0] % heads:
        return Mismatch(f"the width {sizes[0]} is not a multiple of num_heads {heads}")
    position = {id(n): i for i, n in enumerate(context.graph)}
    dead.sort(key=lambda n: position.get(id(n), -1))
    scale = mha.attributes.get_float("scale", 0.0) or float(1.0 / np.sqrt(sizes[0] // heads))
    nodes = [*projection.nodes, split, *dead, *reversed(scale_nodes), mha]
    return Match(
        nodes,
        {
            "source": source,
            "weight": weight_value,
            "bias": bias,
            "heads": heads,
            "scale": scale * factor,
        },
    )


def _rewrite_attention(match: Match, context: RewriteContext) -> Replacement:
    mha = match.root
    attention_bias = mha.inputs[_ATTENTION_BIAS] if len(mha.inputs) > _ATTENTION_BIAS else None
    inputs: list[ir.Value | None] = [match.bindings["source"], match.bindings["weight"]]
    inputs.append(match.bindings["bias"])
    if attention_bias is not None:
        inputs += [None, None, attention_bias]
    attributes = {"num_heads": match.bindings["heads"], "scale": match.bindings["scale"]}
    tape = ir.tape.Tape()
    attention = tape.op("Attention", inputs, attributes, domain=MS_DOMAIN)
    return Replacement(tape.nodes, [(mha.outputs[0], attention)])


SHAPE_RULE = Rule("shape-of-qkv-slice->shape-of-input", "Shape", _match_shape, _rewrite_shape)
PACKED_RULE = Rule(
    "qkv-matmul+split+mha->attention",
    "MultiHeadAttention",
    _match_attention,
    _rewrite_attention,
    domain=MS_DOMAIN,
)


class FusePackedAttentionPass(Pass):
    """Fold MatMul(x, Wqkv) (+ b) + Split + MultiHeadAttention into com.microsoft.Attention (ort)."""

    name = "fuse-packed-attention"
    summary = "fold the merged Q/K/V projection and MultiHeadAttention into one Attention op (ort)"

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        stats, notes = apply_rules(model, [SHAPE_RULE, PACKED_RULE], self.options)
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
