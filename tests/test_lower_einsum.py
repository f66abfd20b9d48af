"""LowerEinsumPass: a two-operand batched-matmul Einsum -> MatMul (+ Transposes)."""

from __future__ import annotations

import pytest

from onnxopt.passes.lower_einsum import LowerEinsumPass, matmul_plan
from tests._pass_check import assert_refuses, assert_rewrites


def _einsum(equation: str, a: str, b: str, out: str, dtype: str = "float") -> str:
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({dtype}[{a}] a, {dtype}[{b}] b) => ({dtype}[{out}] y) {{
            y = Einsum <equation: string = "{equation}"> (a, b)
        }}
    """


@pytest.mark.parametrize(
    ("equation", "a", "b", "out", "ops"),
    [
        # attention scores, q @ k^T: the key's last two dims swap
        ("bhsd,bhtd->bhst", "B, 2, S, 4", "B, 2, T, 4", "B, 2, S, T", ["Transpose", "MatMul"]),
        # attention output, p @ v: already a MatMul
        ("bhst,bhtd->bhsd", "B, 2, S, T", "B, 2, T, 4", "B, 2, S, 4", ["MatMul"]),
        # heads moved next to the sequence on the way out (einsum("bhst,bthd->bshd"))
        (
            "bhst,bthd->bshd",
            "B, 2, S, T",
            "B, T, 2, 4",
            "B, S, 2, 4",
            ["Transpose", "MatMul", "Transpose"],
        ),
        ("ik,kj->ij", "3, 5", "5, 2", "3, 2", ["MatMul"]),
        (" b i k , b j k -> b i j ", "B, 3, 5", "B, 2, 5", "B, 3, 2", ["Transpose", "MatMul"]),
    ],
)
def test_a_batched_matrix_product_becomes_matmul(
    equation: str, a: str, b: str, out: str, ops: list[str]
) -> None:
    text = _einsum(equation, a, b, out)
    dynamic = any(c.isalpha() for c in a + b)
    assert_rewrites(LowerEinsumPass, text, {"einsum->matmul": 1}, ops, trials=2 if dynamic else 1)


@pytest.mark.parametrize(
    ("equation", "a", "b", "out", "reason"),
    [
        ("bsd,btd->bt", "B, S, 4", "B, T, 4", "B, T", "a letter is summed within one operand only"),
        ("bi,bi->b", "B, 4", "B, 4", "B", "not one matrix product"),
        ("bij,bjk->bik", "B, 3, 4", "B, 4, 5", "B, 3, 5", ""),  # control: rewritten below
        ("...ij,...jk->...ik", "B, 3, 4", "B, 4, 5", "B, 3, 5", "the equation has an ellipsis"),
        ("ij,jk", "3, 4", "4, 5", "3, 5", "the equation has no explicit output"),
        ("ii,ij->ij", "3, 3", "3, 5", "3, 5", "a letter repeats within a term"),
        ("bijk,bkl->bijl", "B, 2, 3, 4", "B, 4, 5", "B, 2, 3, 5", "not one matrix product"),
        # XLNet's position terms: MatMul + 2 Transposes for one Einsum, no attention behind
        (
            "ibnd,jbnd->bnij",
            "S, B, 2, 4",
            "T, B, 2, 4",
            "B, 2, S, T",
            "would need both operands transposed",
        ),
    ],
)
def test_other_equations_are_left_alone(
    equation: str, a: str, b: str, out: str, reason: str
) -> None:
    if not reason:
        assert not isinstance(matmul_plan(equation), str)
        return
    assert_refuses(LowerEinsumPass, _einsum(equation, a, b, out), reason)


def test_integer_einsum_is_left_alone() -> None:
    text = _einsum("bij,bjk->bik", "B, 3, 4", "B, 4, 5", "B, 3, 5", dtype="int8")
    assert_refuses(LowerEinsumPass, text, "only float32 and float64 become MatMul")
