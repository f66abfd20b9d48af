"""Target ort: write the Add before a LayerNormalization as Sum, so that ONNX Runtime keeps them apart.

At ORT_ENABLE_ALL, ONNX Runtime fuses ``LayerNormalization(Add(a, b))`` into its contrib
SkipLayerNormalization when the Add's two inputs are 3-D with the same dims (equal sizes, or one
symbol in both: ORT 1.32 fuses [B, S, 768] + [B, S, 768] too, as a symbolic sequence reaches it
through a fused attention op's output) and the Add feeds nothing else: post-LN encoders (BERT,
NomicBERT), and the last LayerNorm of pre-LN ones (Whisper's encoder, ViT). On ORT 1.32's CPU
provider that kernel is slower than the pair it replaces: 267 vs 95 us at [1, 128, 768], 779 vs
240 us at [1, 197, 768], about 10 vs 1.6 ms at Whisper's [1, 1500, 384] (README, "Fusions").

``Sum(a, b)`` is the same element-wise addition with the same broadcasting (Sum-8 and later), its
CPU kernel ran as fast as Add's (61 vs 73 us at [1, 128, 768]), and ORT's fusion matches only
``Add``. The node count does not change. Only the Adds ORT's test may fuse are rewritten: 3-D
inputs (the shapes infer-shapes gave) none of whose dims are provably different. Two symbols are
taken as possibly equal: ORT infers its own names once the annotations are dropped, and an Add
written as Sum where ORT would not have fused costs nothing. Add + SimplifiedLayerNormalization (RMSNorm) is left
alone: ORT's SkipSimplifiedLayerNormalization ran as fast as the pair. With ``--enable
fuse-skip-layer-norm`` (for the CUDA provider, whose SkipLayerNormalization is fast) the pairs are
fused before this pass and it finds nothing to do.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules

# The types ORT's SkipLayerNormFusion accepts.
_FUSED_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.opset() < 8:
        return Mismatch("Sum broadcasts from opset 8 on")
    result = node.outputs[0]
    uses = list(result.uses())
    if result.is_graph_output() or len(uses) != 1:
        return Mismatch("the sum feeds more than one node, which ORT does not fuse")
    user = uses[0]
    if not is_op(user.node, "LayerNormalization") or user.idx != 0:
        return Mismatch("the sum does not feed a LayerNormalization")
    shapes = []
    for value in node.inputs:
        if value is None or value.shape is None or len(value.shape) != 3:
            return Mismatch("an input is not known to be 3-D, the only rank ORT fuses")
        if value.dtype not in _FUSED_TYPES:
            return Mismatch(f"{value.dtype} is not a type ORT fuses")
        shapes.append(value.shape)
    if not _ort_may_fuse(shapes[0], shapes[1]):
        return Mismatch("the inputs' dims differ (a broadcast), which ORT does not fuse")
    return Match([node], {})


def _ort_may_fuse(a: ir.Shape, b: ir.Shape) -> bool:
    """ORT's SkipLayerNormFusion test (every dim an equal size or the same symbol) may pass: no
    dim of one is a size the other's is provably not."""
    for x, y in zip(a, b, strict=True):
        if isinstance(x, int) and isinstance(y, int) and x != y:
            return False
        if isinstance(x, int) != isinstance(y, int) and 1 in (x, y):
            return False  # a broadcast of a size-1 dim
    return True


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    add = match.root
    total = ir.node("Sum", list(add.inputs), name=add.name)
    return Replacement([total], [(add.outputs[0], total.outputs[0])])


RULES = (Rule("Add->Sum before LayerNormalization", "Add", _match, _rewrite),)


class KeepLayerNormUnfusedPass(Pass):
    """Target ort: Add feeding only a LayerNormalization becomes Sum (ORT fuses the pair into its
    slower SkipLayerNormalization on CPU otherwise)."""

    name = "keep-layer-norm-unfused"
    summary = (
        "target ort: Add before LayerNormalization as Sum, which ORT's ENABLE_ALL does not fuse"
        " into its slower CPU SkipLayerNormalization"
    )

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        stats, notes = apply_rules(model, RULES, self.options)
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
