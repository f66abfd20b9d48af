"""Rewrite a two-operand Einsum that is a batched matrix product as MatMul (and Transposes).

``torch.einsum("bhsd,bhtd->bhst", q, k)`` is exported as an ONNX Einsum; so is the attention
output ``einsum("bhst,bhtd->bhsd", p, v)``. Both are one MatMul over shared batch letters::

    Einsum(a, b, equation="<a>,<b>-><out>")
      = Transpose(MatMul(Transpose(a, [batch, m, k]), Transpose(b, [batch, k, n])), out order)

where, of the letters, ``batch`` are in both operands and the output, ``k`` (one) is in both
operands only (summed), ``m`` (one) is in ``a`` and the output only, ``n`` (one) in ``b`` and the
output only. An identity permutation is no Transpose. ONNX names each letter's dim once, so the
batch dims of the two operands are equal and MatMul computes exactly the sums Einsum does (in
another summation order: float rounding may differ in the last bits). Then the attention fusions
see their MatMuls, and merge-consecutive-ops folds the Transposes into the ones around them.

Equations with an ellipsis, an implicit output, a repeated letter in one term, a letter summed in
one operand only, or several letters on a side (which would need Reshapes) are left alone, and so
are those that need both operands transposed (the node count would grow where no fusion follows).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule

# MatMul's CPU kernels on ONNX Runtime; Einsum takes more types (int8, ...).
_MATMUL_DTYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


@dataclass(frozen=True)
class _Plan:
    """Permutations of a, b (to [batch, m, k] and [batch, k, n]) and of the [batch, m, n] product."""

    a: list[int]
    b: list[int]
    out: list[int]


def matmul_plan(equation: str) -> _Plan | str:
    """The MatMul form of a two-operand Einsum ``equation``, or why there is none."""
    text = equation.replace(" ", "")
    if "..." in text:
        return "the equation has an ellipsis"
    if "->" not in text:
        return "the equation has no explicit output"
    inputs, out = text.split("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        return f"Einsum of {len(terms)} operands"
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)) or not all(c.isalpha() for c in a + b + out):
        return "a letter repeats within a term (a diagonal or trace)"
    if not set(out) <= set(a) | set(b):
        return "the output has a letter no operand has"
    batch = [c for c in out if c in a and c in b]
    summed = [c for c in a if c in b and c not in out]
    rows = [c for c in out if c in a and c not in b]
    cols = [c for c in out if c in b and c not in a]
    if any(c not in out and c not in b for c in a) or any(c not in out and c not in a for c in b):
        return "a letter is summed within one operand only"
    if (len(summed), len(rows), len(cols)) != (1, 1, 1):
        return (
            f"not one matrix product: {len(summed)} summed, {len(rows)} row and {len(cols)} "
            "column letter(s), one each needed"
        )
    product = [*batch, *rows, *cols]
    return _Plan(
        [a.index(c) for c in [*batch, *rows, *summed]],
        [b.index(c) for c in [*batch, *summed, *cols]],
        [product.index(c) for c in out],
    )


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if not is_op(node, "Einsum"):
        return Mismatch("not an Einsum", candidate=False)
    equation = node.attributes.get_string("equation", "")
    plan = matmul_plan(equation)
    if isinstance(plan, str):
        return Mismatch(f"Einsum '{equation}': {plan}")
    if any(v is None for v in node.inputs) or len(node.inputs) != 2:
        return Mismatch("the Einsum has a missing input")
    if all(perm != list(range(len(perm))) for perm in (plan.a, plan.b)):
        # Both operands moved (XLNet's and Funnel's 'ibnd,jbnd->bnij' position terms): a MatMul
        # and two or three Transposes for one Einsum, more nodes where no attention fusion
        # follows. The attention products move one operand at most (K^T, or V with the output
        # in [B, S, H, d], which the heads' merge takes).
        return Mismatch(f"Einsum '{equation}' would need both operands transposed")
    dtype = node.outputs[0].dtype
    if dtype not in _MATMUL_DTYPES:
        return Mismatch(f"Einsum in {dtype}: only float32 and float64 become MatMul")
    return Match([node], {"plan": plan})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    plan: _Plan = match.bindings["plan"]
    einsum = match.root
    tape = ir.tape.Tape()

    def moved(value: ir.Value, perm: list[int]) -> ir.Value:
        identity = perm == list(range(len(perm)))
        return value if identity else tape.op("Transpose", [value], {"perm": perm})

    a, b = einsum.inputs
    assert a is not None and b is not None
    product = moved(tape.op("MatMul", [moved(a, plan.a), moved(b, plan.b)]), plan.out)
    return Replacement(tape.nodes, [(einsum.outputs[0], product)])


RULES = (Rule("einsum->matmul", "Einsum", _match, _rewrite),)


class LowerEinsumPass(RulePass):
    """Two-operand Einsum that is a batched matrix product -> MatMul (+ Transposes)."""

    name = "lower-einsum"
    summary = "rewrite a batched-matmul Einsum (bhsd,bhtd->bhst) as MatMul and Transposes"
    rules = RULES
