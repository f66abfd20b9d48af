from __future__ import annotations

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
