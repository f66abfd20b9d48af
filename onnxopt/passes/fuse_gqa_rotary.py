"""Fold the two RotaryEmbedding nodes before a GroupQueryAttention into it (``do_rotary=1``, --target ort).

After fuse-rotary-embedding, fuse-group-query-attention and fuse-rotary-transposes, each layer of
a LLaMA-style model reads ::

    GroupQueryAttention(RotaryEmbedding(q, [0], cos, sin, num_heads=N),
                        RotaryEmbedding(k, [0], cos, sin, num_heads=Nkv), v, , ,
                        seqlens_k, total_sequence_length, , , , attention_bias)

GroupQueryAttention rotates Q and K itself given ``do_rotary=1`` and the caches (inputs 7 and 8):
``GroupQueryAttention(q, k, v, , , seqlens_k, total, cos, sin, , attention_bias)``. Without a
past cache it places token s of every batch row at position ``s`` when ``seqlens_k + 1`` equals
``total_sequence_length`` equals the query's length S, which is what the one-element ``[0]``
position_ids (ONNX Runtime's offset form) means. scripts/gqa_rotary_check.py measures the two
forms bit-identical on ORT 1.32 CPU (output and present_key, batch 1 and 3, S = 1, 5, 16, with
and without left padding in attention_bias, causal 0 and 1, with and without ``head_sink``).

So the rewrite is made only when the GroupQueryAttention has no past cache, ``seqlens_k`` is
``Expand(Sub(t, 1), ...)`` and ``total_sequence_length`` is ``Reshape(t, ...)`` of the same ``t``,
a Cast of the query's length read off a tensor whose dim provably is the query's (the form
fuse-group-query-attention writes), and both rotaries rotate the same dims of each head (float32,
3-D, the same position_ids and caches, ``interleaved`` equal, outputs read by the attention only):
the whole head, or its first R dims (``rotary_embedding_dim``) with R a multiple of 16, which
ORT 1.32 takes from caches [S, R/2] (bit-identical too: Phi's, StableLM's, GPT-NeoX's partial
rotary).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, is_scalar_constant, is_unread
from onnxopt.passes._attention_shapes import value_rank
from onnxopt.passes._shape_facts import const_ints, optional_input
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule

# GroupQueryAttention inputs.
_PAST = (3, 4)
_SEQLENS_K, _TOTAL, _COS, _SIN, _POSITION_IDS, _ATTENTION_BIAS, _HEAD_SINK = range(5, 12)
_ROTARY_ATTRIBUTES = {"interleaved", "num_heads", "rotary_embedding_dim", "scale"}
# ORT 1.32's CPU kernel: "head_size shall be a multiple of 16" with do_rotary (GQA alone needs 8).
_ROTARY_HEAD_MULTIPLE = 16


def _view_target(node: ir.Node | None) -> tuple[int, ...] | None:
    """A Reshape's constant target where 0 copies a dim (allowzero=0), else None."""
    if node is None or not is_op(node, "Reshape") or node.attributes.get_int("allowzero", 0) != 0:
        return None
    return const_ints(optional_input(node, 1))


def _heads_merged_back(value: ir.Value | None) -> tuple[ir.Value, list[ir.Node]] | None:
    """(r, views) when ``value = Reshape(Reshape(r, [0, 0, H, d]), [0, 0, -1])`` with the inner
    view read only by the outer: r's last dim split into heads and merged back, which is r for
    any r of rank 3 (the 0s copy its first two dims both ways). A rotated query or key of a
    view-shaped layer comes out of fuse-group-query-attention so (Gemma 4's dynamo export)."""
    outer = value.producer() if value is not None else None
    if _view_target(outer) != (0, 0, -1) or outer is None:
        return None
    inner = outer.inputs[0].producer() if outer.inputs[0] is not None else None
    split = _view_target(inner)
    if inner is None or split is None or len(split) != 4 or split[:2] != (0, 0):
        return None
    middle = inner.outputs[0]
    if middle.is_graph_output() or any(use.node is not outer for use in middle.uses()):
        return None
    source = inner.inputs[0]
    return None if source is None else (source, [inner, outer])


def _rotary(value: ir.Value | None, gqa: ir.Node, name: str) -> ir.Node | Mismatch:
    reader, views = gqa, list[ir.Node]()
    merged = _heads_merged_back(value)
    if merged is not None and value is not None:
        if value.is_graph_output() or any(use.node is not gqa for use in value.uses()):
            return Mismatch(f"the {name}'s view back to [B, S, N*d] is read elsewhere")
        value, views = merged
        reader = views[0]
    node = value.producer() if value is not None else None
    if node is None or not is_op(node, "RotaryEmbedding", MS_DOMAIN):
        return Mismatch(f"the {name} is not a com.microsoft.RotaryEmbedding", candidate=False)
    assert value is not None
    if value.is_graph_output():
        return Mismatch(f"the rotated {name} is a graph output")
    # Unread readers (through 4 nodes) are the views and transposes the attention fusions left of
    # a layer's former 4-D heads, which dead-code elimination removes only after this pass.
    others = sorted(
        {
            use.node.op_type
            for use in value.uses()
            if use.node is not reader and not is_unread(use.node, 4)
        }
    )
    if others:
        return Mismatch(f"the rotated {name} is also read by {', '.join(others)}")
    extra = set(node.attributes) - _ROTARY_ATTRIBUTES
    if extra:
        return Mismatch(f"the {name}'s RotaryEmbedding has attributes {', '.join(sorted(extra))}")
    if node.attributes.get_float("scale", 1.0) != 1.0:
        return Mismatch(f"the {name}'s RotaryEmbedding scales its position ids")
    if len(node.inputs) != 4 or any(v is None for v in node.inputs):
        return Mismatch(f"the {name}'s RotaryEmbedding lacks an input")
    if value_rank(node.inputs[0]) != 3:
        return Mismatch(f"the {name} is not 3-D [B, S, N*d]")
    if node.inputs[0].dtype != ir.DataType.FLOAT:  # type: ignore[union-attr]
        return Mismatch(f"the {name} is not float32")
    positions = const_array(node.inputs[1])
    if positions is None or positions.size != 1 or int(positions.reshape(-1)[0]) != 0:
        return Mismatch(f"the {name}'s position_ids are not the one-element [0] offset form")
    return node


def _total_length(gqa: ir.Node) -> Mismatch | None:
    """Why seqlens_k is not ``Expand(Sub(t, 1))`` with total_sequence_length ``Reshape(t)`` (t - 1
    for every batch row), or None when it is.

    ``t`` itself is the query's length S: without a past cache, ONNX Runtime rejects any other
    total_sequence_length (the attention already ran with this one before the rewrite).
    """
    seqlens, total = gqa.inputs[_SEQLENS_K], gqa.inputs[_TOTAL]
    expand = seqlens.producer() if seqlens is not None else None
    expanded = expand.inputs[0] if expand is not None and is_op(expand, "Expand") else None
    sub = expanded.producer() if expanded is not None else None
    reshape = total.producer() if total is not None else None
    if (
        sub is None
        or not is_op(sub, "Sub")
        or not is_scalar_constant(sub.inputs[1], 1.0)
        or reshape is None
        or not is_op(reshape, "Reshape")
        or reshape.inputs[0] is not sub.inputs[0]
    ):
        return Mismatch("seqlens_k is not total_sequence_length - 1 for every batch row")
    return None


def _same_cache(a: ir.Value | None, b: ir.Value | None) -> bool:
    """One cache, or two equal constants (fuse-rotary-embedding gives each rotary of a constant
    table its own copy; deduplicate-initializers merges them only later)."""
    if a is b:
        return True
    first, second = const_array(a), const_array(b)
    return (
        first is not None
        and second is not None
        and first.dtype == second.dtype
        and first.shape == second.shape
        and bool(np.array_equal(first, second))
    )


def _cache_width(cache: ir.Value | None) -> int | None:
    """The cache's static last dim: its shape's, or (fuse-rotary-embedding's caches, built after
    shapes were inferred) the last entry of the constant shape of the Reshape under Cos / Sin
    (times a scalar constant: YaRN's scaled tables)."""
    if cache is None:
        return None
    if cache.shape is not None and len(cache.shape) == 2 and isinstance(cache.shape[1], int):
        return cache.shape[1]
    array = const_array(cache)  # a constant cache fuse-rotary-embedding made, not yet inferred
    if array is not None and array.ndim == 2:
        return int(array.shape[1])
    trig = cache.producer()
    factor = const_array(trig.inputs[1]) if is_op(trig, "Mul") and trig is not None else None
    if trig is not None and factor is not None and factor.size == 1:
        trig = trig.inputs[0].producer() if trig.inputs[0] is not None else None
    if trig is None or not (is_op(trig, "Cos") or is_op(trig, "Sin")):
        return None
    reshape = trig.inputs[0].producer() if trig.inputs[0] is not None else None
    target = (
        const_array(reshape.inputs[1])
        if reshape is not None and is_op(reshape, "Reshape")
        else None
    )
    if target is None or target.shape != (2,) or int(target[1]) <= 0:
        return None
    return int(target[1])


def _match(gqa: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch("GroupQueryAttention is an ONNX Runtime op (--target ort only)", False)
    if gqa.attributes.get_int("do_rotary", 0):
        return Mismatch("the GroupQueryAttention already rotates", candidate=False)
    inputs = list(gqa.inputs) + [None] * (_HEAD_SINK + 1 - len(gqa.inputs))
    if len(gqa.inputs) > _HEAD_SINK + 1 or any(
        inputs[i] is not None for i in (*_PAST, _COS, _SIN, _POSITION_IDS)
    ):
        return Mismatch(
            "the GroupQueryAttention has a past cache, caches or inputs after the head sinks"
        )
    query, key = _rotary(inputs[0], gqa, "query"), _rotary(inputs[1], gqa, "key")
    if isinstance(query, Mismatch):
        return query
    if isinstance(key, Mismatch):
        return key
    if not (
        _same_cache(query.inputs[2], key.inputs[2]) and _same_cache(query.inputs[3], key.inputs[3])
    ):
        return Mismatch("the query and key rotaries read different cos/sin caches")
    interleaved = query.attributes.get_int("interleaved", 0)
    if key.attributes.get_int("interleaved", 0) != interleaved:
        return Mismatch("the query and key rotaries differ in interleaved")
    heads = gqa.attributes.get_int("num_heads", 0)
    kv_heads = gqa.attributes.get_int("kv_num_heads", 0)
    for rotary, count in ((query, heads), (key, kv_heads)):
        if rotary.attributes.get_int("num_heads", 0) not in (0, count):
            return Mismatch("a rotary's num_heads differs from the attention's")
    width = query.inputs[0].shape[-1] if query.inputs[0].shape is not None else None  # type: ignore[union-attr]
    if not isinstance(width, int) or heads <= 0 or width % heads:
        return Mismatch("the query's hidden size is not static")
    head_size = width // heads
    if head_size % _ROTARY_HEAD_MULTIPLE:
        return Mismatch(
            f"head size {head_size}: ONNX Runtime's GroupQueryAttention rotates only heads "
            f"whose size is a multiple of {_ROTARY_HEAD_MULTIPLE}"
        )
    rotated = {
        rotary.attributes.get_int("rotary_embedding_dim", 0) or head_size for rotary in (query, key)
    }
    if len(rotated) != 1:
        return Mismatch("the query and key rotaries rotate different parts of each head")
    (dims,) = rotated
    if dims > head_size or (dims < head_size and dims % _ROTARY_HEAD_MULTIPLE):
        # ORT 1.32: "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"
        return Mismatch(
            f"a rotary rotates {dims} dims of each head: ONNX Runtime's GroupQueryAttention "
            f"rotates a part only in multiples of {_ROTARY_HEAD_MULTIPLE}"
        )
    for cache in (query.inputs[2], query.inputs[3]):
        if _cache_width(cache) != dims // 2:
            return Mismatch(f"cannot prove the cos/sin caches are [S, {dims // 2}]")
    refusal = _total_length(gqa)
    if refusal is not None:
        return refusal
    return Match([query, key, gqa], {"query": query, "key": key, "interleaved": interleaved})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    gqa = match.root
    query: ir.Node = match.bindings["query"]
    key: ir.Node = match.bindings["key"]
    inputs = list(gqa.inputs) + [None] * (_HEAD_SINK + 1 - len(gqa.inputs))
    inputs[0], inputs[1] = query.inputs[0], key.inputs[0]
    inputs[_COS], inputs[_SIN] = query.inputs[2], query.inputs[3]
    while inputs[-1] is None:  # the bias and head sinks (GPT-OSS) stay where they are
        inputs.pop()
    attributes = {name: attr.value for name, attr in gqa.attributes.items()}
    attributes["do_rotary"] = 1
    attributes["rotary_interleaved"] = match.bindings["interleaved"]
    new = ir.node(
        "GroupQueryAttention",
        inputs,
        attributes,
        domain=MS_DOMAIN,
        num_outputs=len(gqa.outputs),
        name=gqa.name,
    )
    for old, fresh in zip(gqa.outputs, new.outputs, strict=True):
        fresh.type, fresh.shape = old.type, old.shape
    return Replacement([new], list(zip(gqa.outputs, new.outputs, strict=True)))


def _match_shape(shape: ir.Node, context: RewriteContext) -> Match | Mismatch:
    rotary = shape.inputs[0].producer() if shape.inputs and shape.inputs[0] is not None else None
    if rotary is None or not is_op(rotary, "RotaryEmbedding", MS_DOMAIN):
        return Mismatch("not a Shape of a com.microsoft.RotaryEmbedding", candidate=False)
    if context.options.target != "ort" or not any(
        is_op(use.node, "GroupQueryAttention", MS_DOMAIN) for use in rotary.outputs[0].uses()
    ):
        return Mismatch("the RotaryEmbedding does not feed a GroupQueryAttention", candidate=False)
    return Match([shape], {"source": rotary.inputs[0]})


def _rewrite_shape(match: Match, context: RewriteContext) -> Replacement:
    shape = match.root
    attributes = {name: attr.value for name, attr in shape.attributes.items()}
    new = ir.node("Shape", [match.bindings["source"]], attributes, name=shape.name)
    return Replacement([new], [(shape.outputs[0], new.outputs[0])])


RULES = (
    # A RotaryEmbedding keeps its input's shape: its Shape reads (the attention fusions read B and
    # S there) read the input instead, so that the attention is the rotary's only reader.
    Rule("shape-of-rotary->shape-of-input", "Shape", _match_shape, _rewrite_shape),
    Rule("rotary->GroupQueryAttention", "GroupQueryAttention", _match, _rewrite, MS_DOMAIN),
)


class FuseGqaRotaryPass(RulePass):
    """RotaryEmbedding(q), RotaryEmbedding(k) -> GroupQueryAttention(do_rotary=1) (--target ort)."""

    name = "fuse-gqa-rotary"
    summary = (
        "fold the Q/K RotaryEmbedding nodes into GroupQueryAttention (do_rotary=1, --target ort)"
    )
    rules = RULES
