"""Fold Transposes into Gemm / MatMul and a bias Add into a 2-D MatMul.

- ``Gemm(Transpose(A), B)`` -> ``Gemm(A, B, transA=1)`` (likewise for B): no copy of the operand.
- ``MatMul(Transpose(A, swap last two axes), B)`` -> com.microsoft ``FusedMatMul(A, B, transA=1)``
  (target ort): the GEMM reads the operand transposed instead of materializing it.
- ``MatMul(A, W) + b`` with A of rank 2, W a constant matrix and b a constant vector -> ``Gemm``:
  the bias is added inside the GEMM kernel.
- ``Reshape(Gemm(Reshape(x, [-1, K]), W, c), [*x.shape[:-1], N])`` with x of rank >= 3 ->
  ``MatMul(x, W) (+ c)``: a linear layer written as addmm between views (GPT-2's Conv1D) is the
  same product row for row, and ORT's MatMul multiplies a rank-3 x by a 2-D W as one GEMM of
  [B*S, K] x [K, N] on the same prepacked weight. Two views and a Gemm become one MatMul (an Add
  when c is given). With transB=1 the ort target reads W as it is through FusedMatMul(transB=1);
  the onnx target stores a transposed constant (within --fold-limit).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array
from onnxopt.passes._attention_shapes import (
    flattens_rows,
    restores_rows,
    target_entries,
    value_rank,
)
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import (
    ensure_opset,
    new_constant,
    operand_op,
    other_input,
    producer_op,
    users,
)

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)
_FUSED_MATMUL_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)  # com.microsoft FusedMatMul's


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
    if matmul.outputs[0].dtype not in _FUSED_MATMUL_TYPES:
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
    matmul = operand_op(add, "MatMul")
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


def _gemm_output_width(gemm: ir.Node) -> int | None:
    weight = gemm.inputs[1]
    if weight is None or weight.shape is None or len(weight.shape) != 2:
        return None
    width = weight.shape[0 if gemm.attributes.get_int("transB", 0) else 1]
    return width if isinstance(width, int) else None


def _match_flattened_gemm(reshape: ir.Node, context: RewriteContext) -> Match | Mismatch:
    gemm = producer_op(reshape.inputs[0], "Gemm")
    flatten = producer_op(gemm.inputs[0], "Reshape") if gemm is not None else None
    if gemm is None or flatten is None:
        return Mismatch("not a Gemm between two Reshapes", candidate=False)
    source = flatten.inputs[0]
    rank = value_rank(source)
    if source is None or rank is None or rank < 3:
        return Mismatch("the Gemm's input is not a flattened tensor of known rank >= 3")
    attributes = gemm.attributes
    if attributes.get_int("transA", 0) or attributes.get_float("alpha", 1.0) != 1.0:
        return Mismatch("the Gemm transposes or scales A")
    if users(gemm.outputs[0]) != 1:
        return Mismatch("the Gemm's output has other consumers")
    width = _gemm_output_width(gemm)
    if width is None:
        return Mismatch("the Gemm's weight is not a matrix of known width")
    transposed = _transposed_weight(gemm, context)
    if isinstance(transposed, Mismatch):
        return transposed
    bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if bias is not None:
        if attributes.get_float("beta", 1.0) != 1.0:
            return Mismatch("the Gemm scales its C input (beta != 1)")
        if bias.shape is None or len(bias.shape) > 2 or any(d != 1 for d in bias.shape[:-1]):
            return Mismatch("the Gemm's C is not known to be a row vector")
        zeros = const_array(bias)
        if zeros is not None and zeros.size and not np.any(zeros):
            bias = None  # adding 0 changes nothing (as eliminate-noops removes x + 0)
    if not flattens_rows(flatten, source, rank):
        return Mismatch("the first Reshape is not [-1, K] of its input's last dim K")
    if not restores_rows(target_entries(reshape.inputs[1]), source, rank, width):
        return Mismatch("the second Reshape does not restore the input's leading dims")
    return Match(
        [flatten, gemm, reshape], {"source": source, "bias": bias, "transposed": transposed}
    )


def _transposed_weight(gemm: ir.Node, context: RewriteContext) -> str | Mismatch | None:
    """How the MatMul reads a weight the Gemm reads transposed (transB=1, torch's
    ``addmm(b, x, W.t())``): ``"fused"``, ORT's FusedMatMul(transB=1), which prepacks it the same
    way (equal bits and speed measured); ``"copy"``, a transposed constant, for the onnx target
    and within --fold-limit. None when the weight is not transposed."""
    if not gemm.attributes.get_int("transB", 0):
        return None
    if context.options.target == "ort" and gemm.outputs[0].dtype in _FUSED_MATMUL_TYPES:
        return "fused"
    array = const_array(gemm.inputs[1])
    if array is None:
        return Mismatch("the Gemm reads a transposed weight that is not a constant")
    if array.nbytes > context.options.fold_limit_bytes:
        return Mismatch(
            f"the Gemm reads its weight transposed and a transposed copy ({array.nbytes} bytes)"
            " would exceed --fold-limit"
        )
    return "copy"


def _rewrite_flattened_gemm(match: Match, context: RewriteContext) -> Replacement:
    _, gemm, reshape = match.nodes
    weight = gemm.inputs[1]
    assert weight is not None
    source = match.bindings["source"]
    constants = []
    if match.bindings["transposed"] == "fused":
        attributes = {"alpha": 1.0, "transA": 0, "transB": 1}
        product = ir.node(
            "FusedMatMul", [source, weight], attributes, domain=MS_DOMAIN, name=gemm.name
        )
        ensure_opset(context.model, MS_DOMAIN, 1)
    else:
        if match.bindings["transposed"] == "copy":
            array = const_array(weight)
            assert array is not None
            weight = new_constant(array.T, weight.name)
            constants.append(weight)
        product = ir.node("MatMul", [source, weight], name=gemm.name)
    # The product has the Reshape's dtype and shape (a row-vector bias broadcasts without growing
    # it): later fusions read them (fuse-bias-gelu's dtype check on the Add's other operand).
    result = reshape.outputs[0]
    product.outputs[0].type = result.type
    if result.shape is not None:
        product.outputs[0].shape = ir.Shape(list(result.shape))
    nodes = [product]
    if match.bindings["bias"] is not None:
        nodes.append(ir.node("Add", [product.outputs[0], match.bindings["bias"]]))
    return Replacement(nodes, [(reshape.outputs[0], nodes[-1].outputs[0])], constants=constants)


RULES = (
    Rule("transpose+gemm->gemm", "Gemm", _match_gemm, _rewrite_gemm),
    Rule("matmul+add->gemm", "Add", _match_matmul_add, _rewrite_matmul_add),
    Rule("transpose+matmul->FusedMatMul", "MatMul", _match_matmul, _rewrite_matmul),
    Rule("reshape+gemm+reshape->matmul", "Reshape", _match_flattened_gemm, _rewrite_flattened_gemm),
)


class FuseMatMulPass(RulePass):
    """Transpose into Gemm/MatMul (FusedMatMul for ort), 2-D MatMul + constant bias into Gemm, a
    Gemm between a flattening and an unflattening Reshape into MatMul."""

    name = "fuse-matmul"
    summary = (
        "fold Transpose into Gemm (transA/B) and MatMul (ort FusedMatMul); 2-D MatMul+Add -> Gemm;"
        " Reshape+Gemm+Reshape (addmm between views) -> MatMul"
    )
    rules = RULES
