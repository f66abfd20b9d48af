"""Fold Transposes into Gemm / MatMul and a bias Add into a 2-D MatMul.

- ``Gemm(Transpose(A), B)`` -> ``Gemm(A, B, transA=1)`` (likewise for B): no copy of the operand.
- ``MatMul(Transpose(A, swap last two axes), B)`` -> com.microsoft ``FusedMatMul(A, B, transA=1)``
  (target ort): the GEMM reads the operand transposed instead of materializing it.
- ``MatMul(A, W) + b`` with A of rank 2, W a constant matrix and b a constant vector -> ``Gemm``:
  the bias is added inside the GEMM kernel.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules
from onnxopt.rewrite.patterns import ensure_opset, other_input, producer_op, users

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)


def _perm(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("perm")
    return None if attr is None else list(attr.as_ints())


def _match_gemm(gemm: ir.Node, context: RewriteContext) -> Match | Mismatch:
    flips: dict[int, ir.Node] = {}
    for index in (0, 1):
        transpose = producer_op(gemm.inputs[index], "Transpose")
        if transpose is not None and _perm(transpose) == [1, 0]:
            flips[index] = transpose
    if not flips:
        return Mismatch("no operand is a 2-D Transpose", candidate=False)
    return Match([*flips.values(), gemm], {"flips": flips})


def _rewrite_gemm(match: Match, context: RewriteContext) -> Replacement:
    gemm = match.root
    flips: dict[int, ir.Node] = match.bindings["flips"]
    attributes = {a.name: a for a in gemm.attributes.values()}
    inputs = list(gemm.inputs)
    for index, transpose in flips.items():
        key = "transA" if index == 0 else "transB"
        attributes[key] = ir.AttrInt64(key, 1 - gemm.attributes.get_int(key, 0))
        inputs[index] = transpose.inputs[0]
    new = ir.Node("", "Gemm", inputs, attributes.values(), name=gemm.name)
    return Replacement([new], [(gemm.outputs[0], new.outputs[0])])


def _swaps_last_two(perm: list[int] | None) -> bool:
    if perm is None or len(perm) < 2:
        return False
    n = len(perm)
    return perm == [*range(n - 2), n - 1, n - 2]


def _match_matmul(matmul: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch("FusedMatMul is an ONNX Runtime op (target ort)", candidate=False)
    flips: dict[int, ir.Node] = {}
    for index in (0, 1):
        transpose = producer_op(matmul.inputs[index], "Transpose")
        if transpose is not None and _swaps_last_two(_perm(transpose)):
            flips[index] = transpose
    if not flips:
        return Mismatch("no operand is a Transpose of the last two axes", candidate=False)
    if matmul.outputs[0].dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return Mismatch("FusedMatMul on ORT CPU runs float only")
    return Match([*flips.values(), matmul], {"flips": flips})


def _rewrite_matmul(match: Match, context: RewriteContext) -> Replacement:
    matmul = match.root
    flips: dict[int, ir.Node] = match.bindings["flips"]
    inputs = list(matmul.inputs)
    for index, transpose in flips.items():
        inputs[index] = transpose.inputs[0]
    attributes = {"alpha": 1.0, "transA": int(0 in flips), "transB": int(1 in flips)}
    new = ir.node("FusedMatMul", inputs, attributes, domain=MS_DOMAIN, name=matmul.name)
    ensure_opset(context.model, MS_DOMAIN, 1)
    return Replacement([new], [(matmul.outputs[0], new.outputs[0])])


def _match_matmul_add(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    matmul = None
    for operand in add.inputs[:2]:
        matmul = producer_op(operand, "MatMul")
        if matmul is not None:
            break
    if matmul is None:
        return Mismatch("no operand is a MatMul", candidate=False)
    bias = other_input(add, matmul.outputs[0])
    bias_array = const_array(bias)
    weight = const_array(matmul.inputs[1])
    if bias_array is None or weight is None:
        return Mismatch("weight or bias is not a constant", candidate=False)
    a = matmul.inputs[0]
    if a is None or a.shape is None or len(a.shape) != 2:
        # Linear layers on 3-D activations are the norm, not near-misses: stay quiet under --explain.
        return Mismatch("MatMul input is not known to be 2-D (Gemm is 2-D only)", candidate=False)
    if weight.ndim != 2 or a.dtype not in _FLOATS:
        return Mismatch("MatMul weight is not a floating-point matrix")
    if (
        bias_array.ndim > 2
        or any(d != 1 for d in bias_array.shape[:-1])
        or bias_array.shape[-1:] not in ((weight.shape[1],), (1,))
    ):
        return Mismatch(
            f"bias of shape {list(bias_array.shape)} is not a row vector of {weight.shape[1]}"
        )
    if users(matmul.outputs[0]) != 1:
        return Mismatch("MatMul output has other consumers")
    return Match([matmul, add], {"inputs": [a, matmul.inputs[1], bias]})


def _rewrite_matmul_add(match: Match, context: RewriteContext) -> Replacement:
    new = ir.node("Gemm", match.bindings["inputs"], name=match.nodes[0].name)
    return Replacement([new], [(match.root.outputs[0], new.outputs[0])])


RULES = (
    Rule("transpose+gemm->gemm", "Gemm", _match_gemm, _rewrite_gemm),
    Rule("matmul+add->gemm", "Add", _match_matmul_add, _rewrite_matmul_add),
    Rule("transpose+matmul->FusedMatMul", "MatMul", _match_matmul, _rewrite_matmul),
)


class FuseMatMulPass(Pass):
    """Transpose into Gemm/MatMul (FusedMatMul for ort), 2-D MatMul + constant bias into Gemm."""

    name = "fuse-matmul"
    summary = (
        "fold Transpose into Gemm (transA/B) and MatMul (ort FusedMatMul); 2-D MatMul+Add -> Gemm"
    )

    def call(self, model: ir.Model) -> PassResult:
        stats, notes = apply_rules(model, RULES, self.options)
        return PassResult(model, modified=bool(stats), stats=Counter(stats), notes=notes)
