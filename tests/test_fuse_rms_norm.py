from __future__ import annotations

import pytest

from onnxopt.passes.fuse_rms_norm import FuseRmsNormPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

RMS = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {{
    h = Cast <to = 1> (x)
    sq = Pow (h, two)
    axes = Constant <value = int64[1] {{{axis}}}> ()
    ms = ReduceMean (sq, axes)
    v = Add (ms, eps)
    {rsqrt}
    n = Mul (h, r)
    c = Cast <to = 1> (n)
    y = Mul (w, c)
}}
"""
RSQRT = {
    "reciprocal": "s = Sqrt (v)\n    r = Reciprocal (s)",
    "div": "s = Sqrt (v)\n    r = Div (one, s)",
    "pow": "r = Pow (v, minus_half)",
}


def _model(opset: int = 18, rsqrt: str = "reciprocal", axis: int = -1, eps: float = 1e-6):  # type: ignore[no-untyped-def]
    text = RMS.format(opset=opset, axis=axis, rsqrt=RSQRT[rsqrt])
    scalars = {"two": 2.0, "eps": eps, "one": 1.0, "minus_half": -0.5}
    return parse(
        text, w=rng_array(8, seed=1), **{k: rng_array(1)[0] * 0 + v for k, v in scalars.items()}
    )


@pytest.mark.parametrize("rsqrt", sorted(RSQRT))
def test_rms_norm_ort(rsqrt: str) -> None:
    result = run_checked(FuseRmsNormPass(), _model(rsqrt=rsqrt))
    assert result.stats == {"rms-norm->RMSNormalization": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == [
        "Cast",
        "SimplifiedLayerNormalization",
    ]


def test_rms_norm_onnx_opset_23() -> None:
    result = run_checked(FuseRmsNormPass(PassOptions(target="onnx")), _model(opset=23))
    assert [t for t in op_types(result.model) if t != "Constant"] == ["Cast", "RMSNormalization"]


def test_rms_norm_onnx_old_opset_left_alone() -> None:
    result = FuseRmsNormPass(PassOptions(target="onnx", explain=True))(_model())
    assert not result.modified
    assert result.notes == [
        "rms-norm->RMSNormalization: Mul: RMSNormalization needs opset 23, the model imports 18"
    ]


def test_rms_norm_wrong_axis() -> None:
    result = FuseRmsNormPass(PassOptions(explain=True))(_model(axis=1))
    assert not result.modified
    assert result.notes == [
        "rms-norm->RMSNormalization: Mul: RMS ReduceMean axes [1] are not the last axis (rank 3)"
    ]


# TensorFlow's form (transformers' TF T5 through tf2onnx): the weight joins the rsqrt first,
# ``x * (rsqrt(mean(x²) + eps) * w)``, the mean a GlobalAveragePool of the rank-3 square.
TF_RMS = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {
    sq = Mul (x, x)
    ms = GlobalAveragePool (sq)
    v = Add (ms, eps)
    s = Sqrt (v)
    r = Reciprocal (s)
    m = Mul (r, w)
    y = Mul (x, m)
}
"""


def test_rms_norm_with_the_weight_folded_into_the_rsqrt() -> None:
    model = parse(TF_RMS, w=rng_array(8, seed=1), eps=rng_array(1)[0] * 0 + 1e-6)
    result = run_checked(FuseRmsNormPass(), model)
    assert result.stats == {"rms-norm->RMSNormalization": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == [
        "SimplifiedLayerNormalization"
    ]


def test_rms_norm_with_a_folded_scale_that_is_not_per_channel_is_left() -> None:
    text = TF_RMS.replace(
        "float[B, S, 8] x) => (float[B, S, 8]", "float[2, S, 8] x) => (float[2, S, 8]"
    )
    model = parse(text, w=rng_array(2, 1, 1, seed=1), eps=rng_array(1)[0] * 0 + 1e-6)
    result = FuseRmsNormPass(PassOptions(explain=True))(model)
    assert not result.modified


# ImageGPT's layer norm divides by the root instead of multiplying by its reciprocal:
# ``x / sqrt(mean(x²) + eps) * w``.
DIV_RMS = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {
    sq = Mul (x, x)
    axes = Constant <value = int64[1] {-1}> ()
    ms = ReduceMean (sq, axes)
    v = Add (ms, eps)
    s = Sqrt (v)
    n = Div (x, s)
    y = Mul (n, w)
}
"""


def test_rms_norm_dividing_by_the_root() -> None:
    model = parse(DIV_RMS, w=rng_array(8, seed=1), eps=rng_array(1)[0] * 0 + 1e-5)
    result = run_checked(FuseRmsNormPass(), model)
    assert result.stats == {"rms-norm->RMSNormalization": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == [
        "SimplifiedLayerNormalization"
    ]


def test_a_division_by_another_root_is_left_alone() -> None:
    """The root divides, but not the mean of the input's own square: not an RMS norm."""
    text = DIV_RMS.replace("sq = Mul (x, x)", "sq = Mul (x, w)")
    result = FuseRmsNormPass(PassOptions(explain=True))(
        parse(text, w=rng_array(8), eps=rng_array(1)[0] * 0 + 1e-5)
    )
    assert not result.modified
