from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.passes.fuse_gelu import FuseBiasGeluPass
from onnxopt.passes.fuse_matmul import FuseMatMulPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked


def test_transpose_into_gemm() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[5, N] x) => (float[N, 4] y) {
        t = Transpose <perm = [1, 0]> (x)
        y = Gemm <transB = 1> (t, w, b)
    }
    """
    result = run_checked(FuseMatMulPass(), parse(text, w=rng_array(4, 5), b=rng_array(4)))
    assert result.stats == {"transpose+gemm->gemm": 1}
    assert op_types(result.model) == ["Gemm"]
    gemm = next(iter(result.model.graph))
    assert (gemm.attributes.get_int("transA", 0), gemm.attributes.get_int("transB", 0)) == (1, 1)


def test_transpose_into_matmul_for_ort_only() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 3, 5, 6] x, float[B, 3, 5, 4] z) => (float[B, 3, 6, 4] y) {
        t = Transpose <perm = [0, 1, 3, 2]> (x)
        y = MatMul (t, z)
    }
    """
    result = run_checked(FuseMatMulPass(), parse(text))
    assert result.stats == {"transpose+matmul->FusedMatMul": 1}
    assert op_types(result.model) == ["com.microsoft::FusedMatMul"]
    assert not FuseMatMulPass(PassOptions(target="onnx"))(parse(text)).modified


def test_other_transposes_are_not_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 5, 3, 6] x, float[B, 3, 5, 4] z) => (float[B, 3, 6, 4] y) {
        t = Transpose <perm = [0, 2, 3, 1]> (x)
        y = MatMul (t, z)
    }
    """
    assert not FuseMatMulPass()(parse(text)).modified


def test_matmul_add_to_gemm_2d_only() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 5] x, float[B, N, 5] x3) => (float[N, 4] y, float[B, N, 4] y3) {
        m = MatMul (x, w)
        y = Add (m, b)
        m3 = MatMul (x3, w3)
        y3 = Add (b, m3)
    }
    """
    model = parse(text, w=rng_array(5, 4), w3=rng_array(5, 4, seed=2), b=rng_array(4))
    result = run_checked(FuseMatMulPass(PassOptions(explain=True)), model)
    assert result.stats == {"matmul+add->gemm": 1}
    assert op_types(result.model) == ["Gemm", "MatMul", "Add"]
    assert result.notes == []  # 3-D linear layers are not near-misses


# A linear layer as exporters write nn.Linear / GPT-2's Conv1D on a rank-3 x: flatten to [-1, K],
# Gemm, and view the [B*S, N] result back as [B, S, N] with B, S read off x.
FLATTENED_GEMM = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, S, 5] x) => (float[{out}] y) {{
        flat = Reshape(x, to2d)
        gm = Gemm{attrs}(flat, w{bias})
        bs = Shape<start = 0, end = 2>(x)
        b0 = Shape<start = 0, end = 1>(x)
        s0 = Shape<start = 1, end = 2>(x)
        target = Concat<axis = 0>({pieces})
        y = Reshape(gm, target)
    }}
"""


def _flattened_gemm(
    *,
    out: str = "B, S, 4",
    attrs: str = "",
    bias: str = ", b",
    pieces: str = "bs, n",
    w_shape: tuple[int, int] = (5, 4),
    b: np.ndarray | None = None,
) -> ir.Model:
    text = FLATTENED_GEMM.format(out=out, attrs=attrs, bias=bias, pieces=pieces)
    return parse(
        text,
        to2d=np.array([-1, 5], np.int64),
        n=np.array([4], np.int64),
        minus1=np.array([-1], np.int64),
        w=rng_array(*w_shape),
        b=rng_array(4, seed=3) if b is None else b,
    )


def _products(model: ir.Model) -> list[str]:
    """The ops left once the (now unread) shape reads are gone."""
    return [op for op in op_types(model) if op not in ("Shape", "Concat")]


def test_gemm_between_views_becomes_matmul() -> None:
    result = run_checked(FuseMatMulPass(), _flattened_gemm())
    assert result.stats == {"reshape+gemm+reshape->matmul": 1}
    assert _products(result.model) == ["MatMul", "Add"]
    # No bias, weight stored [N, K] (transB=1, torch's addmm(b, x, W.t())): ORT's FusedMatMul
    # reads it as it is; the onnx target stores W^T, unless that copy would exceed --fold-limit.
    transposed = _flattened_gemm(attrs="<transB = 1>", bias="", w_shape=(4, 5))
    result = run_checked(FuseMatMulPass(), transposed)
    assert _products(result.model) == ["com.microsoft::FusedMatMul"]
    result = run_checked(FuseMatMulPass(PassOptions(target="onnx")), transposed)
    assert _products(result.model) == ["MatMul"]
    tight = FuseMatMulPass(PassOptions(target="onnx", fold_limit_bytes=64, explain=True))
    result = tight(transposed.clone())
    assert not result.modified and any("fold-limit" in n for n in result.notes), result.notes
    # A [1, N] C broadcasts over the rows the same way; B, S read one by one, N as -1; both
    # targets (MatMul is standard ONNX).
    model = _flattened_gemm(b=rng_array(1, 4, seed=4), pieces="b0, s0, minus1")
    result = run_checked(FuseMatMulPass(PassOptions(target="onnx")), model)
    assert _products(result.model) == ["MatMul", "Add"]
    # An all-zero C adds nothing: no Add (else fuse-bias-gelu would take it into a FastGelu
    # before the cleanup after the fusions removes it).
    result = run_checked(FuseMatMulPass(), _flattened_gemm(b=np.zeros(4, np.float32)))
    assert _products(result.model) == ["MatMul"]


def test_gemm_between_views_then_bias_gelu() -> None:
    # GPT-1/GPT-2's MLP: Conv1D (addmm between views), then Gelu. The new MatMul's result keeps
    # the Reshape's dtype and shape, so fuse-bias-gelu, which runs next, takes the new Add + Gelu
    # in the same optimize run (before, only a second run did: the output was not a fixed point).
    text = """
    <ir_version: 8, opset_import: ["" : 20]>
    g (float[B, S, 5] x) => (float[B, S, 4] y) {
        flat = Reshape(x, to2d)
        gm = Gemm(flat, w, b)
        bs = Shape<start = 0, end = 2>(x)
        target = Concat<axis = 0>(bs, n)
        h = Reshape(gm, target)
        y = Gelu<approximate = "tanh">(h)
    }
    """
    model = parse(
        text,
        to2d=np.array([-1, 5], np.int64),
        n=np.array([4], np.int64),
        w=rng_array(5, 4),
        b=rng_array(4, seed=3),
    )
    flattened = run_checked(FuseMatMulPass(), model)
    (matmul,) = [node for node in flattened.model.graph if node.op_type == "MatMul"]
    assert matmul.outputs[0].dtype == ir.DataType.FLOAT
    result = run_checked(FuseBiasGeluPass(), flattened.model)
    assert _products(result.model) == ["MatMul", "com.microsoft::FastGelu"]


def test_gemm_between_views_needs_the_same_rows() -> None:
    # Viewed back as [S, B, N]: the same numbers in another order, not x @ W.
    swapped = _flattened_gemm(out="S, B, 4", pieces="s0, b0, n")
    result = FuseMatMulPass(PassOptions(explain=True))(swapped)
    assert not result.modified
    assert any("does not restore" in note for note in result.notes), result.notes
    # alpha and beta scale what MatMul would not; a per-row C does not broadcast over B and S.
    for attrs, reason in (("<alpha = 2.0>", "scales A"), ("<beta = 0.5>", "beta")):
        result = FuseMatMulPass(PassOptions(explain=True))(_flattened_gemm(attrs=attrs))
        assert not result.modified and any(reason in note for note in result.notes), result.notes
    assert not FuseMatMulPass()(_flattened_gemm(b=rng_array(6, 4))).modified
    # Rank 2 stays a Gemm: matmul+add->gemm would only turn it back.
    flat = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 5] x) => (float[N, 4] y) {
        f = Reshape(x, to2d)
        gm = Gemm(f, w, b)
        y = Reshape(gm, back)
    }
    """
    model = parse(
        flat,
        to2d=np.array([-1, 5], np.int64),
        back=np.array([-1, 4], np.int64),
        w=rng_array(5, 4),
        b=rng_array(4),
    )
    assert not FuseMatMulPass()(model).modified
