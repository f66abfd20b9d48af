"""Fuse hand-written hard-sigmoid and hard-swish into HardSigmoid and HardSwish.

MobileNetV3 implementations written before torch had ``nn.Hardswish`` (and YOLOv5's "export-friendly"
Hardswish) spell them with ReLU6 / hardtanh / clamp, which both exporters write as four nodes:

- hard-sigmoid ``relu6(x + 3) / 6``: ``Div(Clip(Add(x, 3), 0, 6), 6)``, or ``Mul(..., 1/6)``
  -> ``HardSigmoid(x, alpha=1/6, beta=0.5)`` (opset 6+); ``relu6(z) / 6`` alone (a Conv's bias
  has taken the 3 by the time this pass runs) -> ``HardSigmoid(z, alpha=1/6, beta=0)``;
- hard-swish ``x * relu6(x + 3) / 6``: ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (or the product
  scaled by 1/6) -> ``HardSwish(x)`` (opset 14+; below, ``x * HardSigmoid(x)``);
- ``x * HardSigmoid(x, 1/6, 0.5)`` (``x * F.hardsigmoid(x)``, or what the rule above made of
  ``x * (relu6(x + 3) / 6)``) -> ``HardSwish(x)`` (opset 14+).

Both are standard ops, so both targets take them; a hard-sigmoid after a Conv then becomes ORT's
FusedConv (fuse-conv-activation runs next). The constants must be exactly 3, 0, 6 and 6 (or
float32's 1/6): the fused op computes ``max(0, min(1, x/6 + 1/2))``, the same value up to the
rounding of one operation. float32 only (ORT's CPU HardSigmoid and HardSwish kernels).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_activation import clip_bounds
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import const_scalar_within, only_user, rank_of

HARD_SWISH_OPSET = 14
SIXTH = float(np.float32(1 / 6))


def _constant(value: ir.Value | None, rank: int) -> float | None:
    """A float32 constant of one element that does not raise the rank of a rank-``rank`` x."""
    if value is None or value.dtype != ir.DataType.FLOAT:
        return None
    return const_scalar_within(value, rank)


def _sixth_of(node: ir.Node, rank: int) -> ir.Value | None:
    """The operand ``node`` scales by 1/6: ``Div(a, 6)`` or ``Mul(a, 1/6)`` (either order)."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    if node.op_type == "Div":
        return node.inputs[0] if _constant(node.inputs[1], rank) == 6.0 else None
    for factor, other in ((node.inputs[1], node.inputs[0]), (node.inputs[0], node.inputs[1])):
        if _constant(factor, rank) == SIXTH:
            return other
    return None


def _relu6(value: ir.Value | None, rank: int) -> ir.Node | None:
    """The Clip when ``value`` is ``Clip(z, 0, 6)`` of a float32 z (bounds of z's type and rank)."""
    clip = None if value is None else value.producer()
    if clip is None or not is_op(clip, "Clip") or clip.inputs[0] is None:
        return None
    if clip.inputs[0].dtype != ir.DataType.FLOAT:
        return None
    bounds = clip_bounds(clip)
    if isinstance(bounds, Mismatch) or bounds != [0.0, 6.0]:
        return None
    if any(_constant(bound, rank) is None for bound in clip.inputs[1:] if bound is not None):
        return None
    return clip


def _plus_3(value: ir.Value | None, rank: int) -> tuple[ir.Node, ir.Value] | None:
    """(Add, x) when ``value`` is ``Add(x, 3)`` (either order)."""
    add = None if value is None else value.producer()
    if add is None or not is_op(add, "Add") or len(add.inputs) != 2:
        return None
    for three, x in ((add.inputs[1], add.inputs[0]), (add.inputs[0], add.inputs[1])):
        if x is not None and x.dtype == ir.DataType.FLOAT and _constant(three, rank) == 3.0:
            return add, x
    return None


def _keeps_rank(x: ir.Value, rank: int) -> bool:
    """Whether x has the result's rank (no constant broadcast it up, which the fused op would not)."""
    return rank_of(x) == rank


def _match_hard_swish(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (or ``* 1/6``): x * relu6(x + 3) / 6."""
    rank = rank_of(node.outputs[0])  # the rank the fused op must keep
    if rank is None:
        return Mismatch("the rank is not known", candidate=False)
    product = _sixth_of(node, rank)
    mul = None if product is None else product.producer()
    if mul is None or not is_op(mul, "Mul") or len(mul.inputs) != 2:
        return Mismatch("not a sixth of a product", candidate=False)
    for gate, x in ((mul.inputs[1], mul.inputs[0]), (mul.inputs[0], mul.inputs[1])):
        clip = _relu6(gate, rank)
        found = None if clip is None else _plus_3(clip.inputs[0], rank)
        if clip is None or found is None or found[1] is not x:
            continue
        add = found[0]
        if not _keeps_rank(x, rank):
            return Mismatch("a constant raises x's rank (or x's rank is not known)")
        # (each is an input of the next node: read once, it is read by that node alone)
        assert product is not None
        if not (only_user(product) and only_user(clip.outputs[0]) and only_user(add.outputs[0])):
            return Mismatch("a partial result of the hard-swish has other users")
        return Match([add, clip, mul, node], {"x": x})
    return Mismatch("no factor is relu6(x + 3) of the other", candidate=False)


def _match_hard_sigmoid(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Div(Clip(Add(x, 3), 0, 6), 6)`` (or ``* 1/6``): relu6(x + 3) / 6; or of z without the
    Add (a Conv's bias took the 3): relu6(z) / 6 = HardSigmoid(z, 1/6, 0)."""
    rank = rank_of(node.outputs[0])  # the rank the fused op must keep
    if rank is None:
        return Mismatch("the rank is not known", candidate=False)
    clip = _relu6(_sixth_of(node, rank), rank)
    if clip is None:
        return Mismatch("not a sixth of relu6(z)", candidate=False)
    if not only_user(clip.outputs[0]):
        return Mismatch("the clipped value has other users")
    x = clip.inputs[0]
    assert x is not None
    nodes, beta = [clip, node], 0.0
    found = _plus_3(x, rank)
    if found is not None and only_user(found[0].outputs[0]):
        x = found[1]
        nodes, beta = [found[0], clip, node], 0.5
    if not _keeps_rank(x, rank):
        return Mismatch("a constant raises x's rank (or x's rank is not known)")
    return Match(nodes, {"x": x, "beta": beta})


def _match_gated(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Mul(x, HardSigmoid(x, 1/6, 0.5))`` (either order)."""
    if len(node.inputs) != 2:
        return Mismatch("not a binary Mul", candidate=False)
    for gate, x in ((node.inputs[1], node.inputs[0]), (node.inputs[0], node.inputs[1])):
        sigmoid = None if gate is None else gate.producer()
        if sigmoid is None or not is_op(sigmoid, "HardSigmoid") or sigmoid.inputs[0] is not x:
            continue
        alpha = sigmoid.attributes.get_float("alpha", 0.2)
        beta = sigmoid.attributes.get_float("beta", 0.5)
        if alpha != SIXTH or beta != 0.5:
            return Mismatch(f"the HardSigmoid has alpha {alpha}, beta {beta}, not 1/6 and 0.5")
        if x is None or x.dtype != ir.DataType.FLOAT:
            return Mismatch("HardSwish is fused for float32 only")
        if context.opset() < HARD_SWISH_OPSET:
            return Mismatch(f"HardSwish needs opset {HARD_SWISH_OPSET}")
        assert gate is not None
        if not only_user(gate):
            return Mismatch("the HardSigmoid's result has other users")
        return Match([sigmoid, node], {"x": x})
    return Mismatch("no input is HardSigmoid of the other", candidate=False)


def _hard_sigmoid(x: ir.Value, beta: float = 0.5) -> ir.Node:
    return ir.node("HardSigmoid", [x], {"alpha": SIXTH, "beta": beta})


def _rewrite_hard_swish(match: Match, context: RewriteContext) -> Replacement:
    x = match.bindings["x"]
    if context.opset() >= HARD_SWISH_OPSET:
        nodes = [ir.node("HardSwish", [x])]
    else:
        gate = _hard_sigmoid(x)
        nodes = [gate, ir.node("Mul", [x, gate.outputs[0]])]
    return Replacement(nodes, [(match.root.outputs[0], nodes[-1].outputs[0])])


def _rewrite_hard_sigmoid(match: Match, context: RewriteContext) -> Replacement:
    new = _hard_sigmoid(match.bindings["x"], match.bindings["beta"])
    return Replacement([new], [(match.root.outputs[0], new.outputs[0])])


RULES = (
    # The swish first: its product's sixth would otherwise not be looked at as a whole.
    *(
        Rule(f"x*relu6(x+3)/6->HardSwish ({op})", op, _match_hard_swish, _rewrite_hard_swish)
        for op in ("Div", "Mul")
    ),
    *(
        Rule(f"relu6(x+3)/6->HardSigmoid ({op})", op, _match_hard_sigmoid, _rewrite_hard_sigmoid)
        for op in ("Div", "Mul")
    ),
    Rule("x*HardSigmoid(x)->HardSwish", "Mul", _match_gated, _rewrite_hard_swish),
)


class FuseHardSwishPass(RulePass):
    """``relu6(x + 3) / 6`` -> HardSigmoid, ``x * relu6(x + 3) / 6`` and ``x * HardSigmoid(x)``
    -> HardSwish (opset 14+), float32, both targets (standard ops)."""

    name = "fuse-hard-swish"
    summary = (
        "fuse relu6(x + 3) / 6 into HardSigmoid and x * relu6(x + 3) / 6 into HardSwish "
        "(hand-written MobileNetV3 / YOLOv5 forms)"
    )
    rules = RULES
