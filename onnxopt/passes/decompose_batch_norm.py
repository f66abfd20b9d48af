"""Rewrite a lone inference-mode BatchNormalization as ``x * s + t`` (Mul, Add with constants).

Not in the default levels: on ONNX Runtime one BatchNormalization kernel is cheaper than two
element-wise kernels. It helps runtimes without BatchNormalization, and lets a following pass fold
the Mul/Add into a neighbour. BatchNormalizations right after Conv/Gemm are left to fuse-conv-bn.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import bn_affine
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant


def _match(bn: ir.Node, context: RewriteContext) -> Match | Mismatch:
    x = bn.inputs[0]
    producer = None if x is None else x.producer()
    if any(is_op(producer, op) for op in ("Conv", "ConvTranspose", "Gemm")):
        return Mismatch(
            f"follows a {producer.op_type if producer else ''}: left to fuse-conv-bn",
            candidate=False,
        )
    if x is None or x.shape is None or len(x.shape) < 2:
        return Mismatch("input rank is unknown")
    affine = bn_affine(bn)
    if isinstance(affine, Mismatch):
        return affine
    if x.dtype is None:
        return Mismatch("input dtype is unknown")
    s, t = affine
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    dtype = x.dtype.numpy()
    return Match(
        [bn], {"x": x, "s": s.reshape(shape).astype(dtype), "t": t.reshape(shape).astype(dtype)}
    )


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    scale = new_constant(b["s"], f"{match.root.name or 'bn'}_scale")
    shift = new_constant(b["t"], f"{match.root.name or 'bn'}_shift")
    mul = ir.node("Mul", [b["x"], scale])
    add = ir.node("Add", [mul.outputs[0], shift])
    return Replacement(
        [mul, add], [(match.root.outputs[0], add.outputs[0])], constants=[scale, shift]
    )


RULES = (Rule("bn->mul+add", "BatchNormalization", _match, _rewrite),)


class DecomposeBatchNormPass(RulePass):
    """Lone BatchNormalization (inference mode, constant statistics) -> Mul + Add."""

    name = "decompose-batch-norm"
    summary = "rewrite a lone BatchNormalization as Mul + Add (not in default levels)"
    rules = RULES
