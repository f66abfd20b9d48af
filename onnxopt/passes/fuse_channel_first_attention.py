"""Fuse attention written on channels-first heads, ``[B, h, d, N]``, into MultiHeadAttention.

YOLO12's area attention (Ultralytics ``AAttn``) splits Q, K and V with the head dim before the
tokens and writes the products transposed: ``attn = (q.transpose(-2, -1) @ k) * scale``, then
``v @ attn.transpose(-2, -1)``, moved back to ``[B, N, h, d]``. After fuse-matmul the block reads

    T       = Transpose(R, perm=[0, 2, 3, 1])             R: [B, N, h, dq + dq + dv]
    q, k, v = Split(T, [dq, dq, dv], axis=2)              [B, h, d, N] each

(where an area holds the whole image, the exporter's views of the Conv's output fold into one
Reshape to T: R is then T transposed back, one Transpose added)
    s       = FusedMatMul(q (* c), k, transA=1, alpha=a)  [B, h, N, N] (the scores scaled, or Q)
    o       = FusedMatMul(v, Softmax(s, axis=-1), transB=1)
    y       = Transpose(o, perm=[0, 3, 1, 2])             [B, N, h, dv]

and ``y`` is MultiHeadAttention on R's own token-major slices, the heads already in BSNH order:

    q', k', v' = Split(R, [dq, dq, dv], axis=3)
    y          = Reshape(MultiHeadAttention(q'', k'', v'', num_heads=h, scale=a*c), [0, 0, h, dv])

with ``q''`` = ``Reshape(q', [0, 0, h*dq])`` (and so K and V). The same arithmetic in another
order: validated within float32 rounding (tests/test_fuse_channel_first_attention.py). Measured on
one such block at YOLO12n's 640² size (4 areas of 400 tokens, 2 heads of 32, ORT 1.32 CPU, 2
threads): 2.69 ms against 3.11 ms for the seven nodes it replaces. ``ort`` target only
(MultiHeadAttention is a contrib op; ``onnx`` keeps the MatMuls fuse-matmul leaves). A split
whose V is wider than Q and K (YOLO11's C2PSA, keys half the values' width) is written
channels-first without a token-major source and is left, as are float16 blocks.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, is_op
from onnxopt.passes._attention_shapes import softmax_axis, transpose_perm
from onnxopt.passes._shape_facts import int_param
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import const_scalar, ensure_opset, int64_constant, only_user

_TOKENS_LAST = [0, 2, 3, 1]
_TOKENS_BACK = [0, 3, 1, 2]


def _fused_matmul(value: ir.Value | None, trans_a: int, trans_b: int) -> ir.Node | Mismatch:
    node = value.producer() if value is not None else None
    if node is None or not is_op(node, "FusedMatMul", MS_DOMAIN) or len(node.inputs) != 2:
        return Mismatch("not a FusedMatMul", candidate=False)
    attributes = node.attributes
    if (
        attributes.get_int("transA", 0) != trans_a
        or attributes.get_int("transB", 0) != trans_b
        or attributes.get_int("transBatchA", 0) != 0
        or attributes.get_int("transBatchB", 0) != 0
    ):
        return Mismatch("a FusedMatMul transposed otherwise", candidate=False)
    return node


def _scaled(value: ir.Value | None) -> tuple[ir.Node, ir.Value, float] | None:
    """(the Mul, its other operand, c) when ``value`` is read once and is ``x * c``, c a
    constant scalar."""
    node = value.producer() if value is not None else None
    if node is None or not is_op(node, "Mul") or value is None or not only_user(value):
        return None
    constants = [const_scalar(operand) for operand in node.inputs]
    if len(constants) != 2 or constants.count(None) != 1:
        return None
    factor = next(c for c in constants if c is not None)
    operand = node.inputs[constants.index(None)]
    return None if operand is None else (node, operand, factor)


def _match(root: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if transpose_perm(root) != _TOKENS_BACK:
        return Mismatch("not a Transpose back to tokens first", candidate=False)
    out = _fused_matmul(root.inputs[0], 0, 1)
    if isinstance(out, Mismatch):
        return out
    v, probs = out.inputs[0], out.inputs[1]
    softmax = probs.producer() if probs is not None else None
    if softmax is None or not is_op(softmax, "Softmax"):
        return Mismatch("P·V's second operand is not a Softmax", candidate=False)
    nodes: list[ir.Node] = [softmax, out, root]
    factor = 1.0
    logits = softmax.inputs[0]
    scaled = _scaled(logits)
    if scaled is not None:  # (q^T·k) * c, as the module writes it
        nodes.insert(0, scaled[0])
        logits, factor = scaled[1], scaled[2]
    scores_mm = _fused_matmul(logits, 1, 0)
    if isinstance(scores_mm, Mismatch):
        return Mismatch("the Softmax does not read q^T·k", candidate=False)
    if context.options.target != "ort":
        return Mismatch("MultiHeadAttention is a contrib op (target ort only)")
    if softmax_axis(softmax, context.opset()) not in (-1, 3):
        return Mismatch("the Softmax is not over the keys (last axis)")
    if out.attributes.get_float("alpha", 1.0) != 1.0:
        return Mismatch("P·V is scaled")
    assert root.inputs[0] is not None and probs is not None
    inside = [root.inputs[0], probs, *(n.outputs[0] for n in nodes[:-3]), scores_mm.outputs[0]]
    if not all(only_user(value) for value in inside):
        return Mismatch("a value inside the block has another reader")
    query, key = scores_mm.inputs[0], scores_mm.inputs[1]
    nodes.insert(0, scores_mm)
    scaled = _scaled(query)
    if scaled is not None:  # (q * c)^T·k, as onnxslim moves the scale
        nodes.insert(0, scaled[0])
        query, factor = scaled[1], factor * scaled[2]
    split = query.producer() if query is not None else None
    if (
        split is None
        or not is_op(split, "Split")
        or len(split.outputs) != 3
        or [query, key, v] != list(split.outputs)
    ):
        return Mismatch("q, k and v are not the three parts of one Split")
    sizes = int_param(split, "split", 1)  # None (equal parts) or a Mismatch (not constant): left
    rank = len(split.inputs[0].shape) if split.inputs[0] and split.inputs[0].shape else None
    axis = split.attributes.get_int("axis", 0)
    if rank != 4 or axis not in (2, -2) or not isinstance(sizes, tuple) or len(sizes) != 3:
        return Mismatch("the Split is not along a [B, h, d, N] head dim")
    depth, key_depth, value_depth = sizes
    if depth != key_depth or value_depth != depth:
        return Mismatch(f"q, k and v are {depth}, {key_depth} and {value_depth} wide, not equal")
    stacked = split.inputs[0]
    assert stacked is not None and stacked.shape is not None
    heads = stacked.shape[1]
    if not isinstance(heads, int) or heads <= 0:
        return Mismatch("the head count is not static")
    if stacked.dtype != ir.DataType.FLOAT:
        return Mismatch("fused for float32 only")
    # The token-major tensor the heads were transposed from, or None: transposed back here (one
    # Transpose of the stacked Q/K/V, where the block transposes all three inside its products).
    heads_first = stacked.producer()
    source = None
    if transpose_perm(heads_first) == _TOKENS_LAST and heads_first is not None:
        source = heads_first.inputs[0]
    # V's other readers that move it to tokens first (the positional Conv's path): the new V is
    # that already.
    assert v is not None
    moved = [
        use.node
        for use in v.uses()
        if use.node is not out and transpose_perm(use.node) == _TOKENS_BACK
    ]
    alpha = scores_mm.attributes.get_float("alpha", 1.0)
    return Match(
        nodes,
        {
            "source": source,
            "stacked": stacked,
            "split": split,
            "heads": heads,
            "depth": depth,
            "scale": alpha * factor,
            "moved": moved,
        },
        # Before the old Split: V's other readers (now reading the new V) may come before the root.
        anchor=split,
    )


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    bindings = match.bindings
    source, split, heads, depth = (bindings[k] for k in ("source", "split", "heads", "depth"))
    back_to_tokens = []
    if source is None:
        back_to_tokens = [ir.node("Transpose", [bindings["stacked"]], {"perm": _TOKENS_BACK})]
        source = back_to_tokens[0].outputs[0]
    attributes = {k: v for k, v in split.attributes.items() if k != "axis"}
    parts = ir.node(
        "Split", [source, *split.inputs[1:]], attributes, num_outputs=3, domain=split.domain
    )
    parts.attributes["axis"] = ir.AttrInt64("axis", 3)
    flat = int64_constant([0, 0, heads * depth])
    views = [ir.node("Reshape", [part, flat]) for part in parts.outputs]
    attention = ir.node(
        "MultiHeadAttention",
        [view.outputs[0] for view in views],
        {"num_heads": heads, "scale": float(bindings["scale"])},
        domain=MS_DOMAIN,
    )
    heads_view = int64_constant([0, 0, heads, depth])
    back = ir.node("Reshape", [attention.outputs[0], heads_view])
    ensure_opset(context.model, MS_DOMAIN, 1)
    return Replacement(
        [*back_to_tokens, parts, *views, attention, back],
        [
            (match.root.outputs[0], back.outputs[0]),
            *((node.outputs[0], parts.outputs[2]) for node in bindings["moved"]),
        ],
        constants=[flat, heads_view],
    )


RULES = (Rule("channel-first-attention->mha", "Transpose", _match, _rewrite),)


class FuseChannelFirstAttentionPass(RulePass):
    """Attention on channels-first heads (YOLO12's area attention) -> MultiHeadAttention (ort)."""

    name = "fuse-channel-first-attention"
    summary = (
        "fuse attention on [B, h, d, N] heads (q^T·k, v·P^T: YOLO12's area attention) into "
        "com.microsoft MultiHeadAttention (ort)"
    )
    rules = RULES
