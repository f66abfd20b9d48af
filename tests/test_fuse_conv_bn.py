from __future__ import annotations

import numpy as np
import pytest

from onnxopt.passes.fuse_conv_bn import FuseConvBnPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

BN_PARAMS = {
    "s": rng_array(4, seed=1),
    "b": rng_array(4, seed=2),
    "m": rng_array(4, seed=3),
    "v": rng_array(4, seed=4, positive=True),
}

CONV_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y) {
    c = Conv <kernel_shape = [3, 3]> (x, w, bias)
    y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)
}
"""


def test_conv_bn_folds_into_weights() -> None:
    model = parse(CONV_BN, w=rng_array(4, 3, 3, 3), bias=rng_array(4, seed=9), **BN_PARAMS)
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {"conv+bn->conv": 1}
    assert op_types(result.model) == ["Conv"]


def test_conv_transpose_bn_with_groups() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 5, 5] x) => (float[N, 4, 7, 7] y) {
        c = ConvTranspose <kernel_shape = [3, 3], group = 2> (x, w)
        y = BatchNormalization (c, s, b, m, v)
    }
    """
    model = parse(text, w=rng_array(4, 2, 3, 3), **BN_PARAMS)
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {"convtranspose+bn->convtranspose": 1}
    assert op_types(result.model) == ["ConvTranspose"]


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn(trans_b: int) -> None:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 5] x) => (float[N, 4] y) {{
        c = Gemm <transB = {trans_b}, beta = 0.5> (x, w, bias)
        y = BatchNormalization (c, s, b, m, v)
    }}
    """
    w = rng_array(4, 5) if trans_b else rng_array(5, 4)
    model = parse(text, w=w, bias=rng_array(4, seed=7), **BN_PARAMS)
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {"gemm+bn->gemm": 1}
    assert op_types(result.model) == ["Gemm"]


def test_matmul_bn_becomes_gemm() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 5] x) => (float[N, 4] y) {
        c = MatMul (x, w)
        y = BatchNormalization (c, s, b, m, v)
    }
    """
    result = run_checked(FuseConvBnPass(), parse(text, w=rng_array(5, 4), **BN_PARAMS))
    assert result.stats == {"matmul+bn->gemm": 1}
    assert op_types(result.model) == ["Gemm"]


@pytest.mark.parametrize(
    ("op", "shape", "rule"),
    [
        ("Add", (4, 1, 1), "conv+add->conv"),
        ("Mul", (1, 4, 1, 1), "conv+mul->conv"),
        ("Mul", (1,), "conv+mul->conv"),
    ],
)
def test_conv_per_channel_add_mul(op: str, shape: tuple[int, ...], rule: str) -> None:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y) {{
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = {op} (k, c)
    }}
    """
    model = parse(text, w=rng_array(4, 3, 3, 3), k=rng_array(*shape, seed=5))
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {rule: 1}
    assert op_types(result.model) == ["Conv"]


def _explain(model_text: str, **arrays: np.ndarray) -> list[str]:
    model = parse(model_text, **arrays)
    result = FuseConvBnPass(PassOptions(explain=True))(model)
    assert not result.modified
    return result.notes


def test_shared_weight_is_not_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y, float[N, 4, 6, 6] z) {
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = BatchNormalization (c, s, b, m, v)
        z = Conv <kernel_shape = [3, 3]> (x, w)
    }
    """
    notes = _explain(text, w=rng_array(4, 3, 3, 3), **BN_PARAMS)
    assert notes == [
        "conv+bn->conv: BatchNormalization: Conv weight 'w' is shared with 1 other node(s)"
    ]


def test_non_constant_statistics_are_not_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x, float[4] m) => (float[N, 4, 6, 6] y) {
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = BatchNormalization (c, s, b, m, v)
    }
    """
    params = {k: v for k, v in BN_PARAMS.items() if k != "m"}
    notes = _explain(text, w=rng_array(4, 3, 3, 3), **params)
    assert notes == ["conv+bn->conv: BatchNormalization: BatchNormalization mean is not a constant"]


def test_foreign_domain_and_non_channel_constants_are_left_alone() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y, float[N, 4, 6, 6] z) {
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = custom.BatchNormalization (c, s, b, m, v)
        d = Conv <kernel_shape = [3, 3]> (x, w2)
        z = Add (d, k)
    }
    """
    notes = _explain(
        text, w=rng_array(4, 3, 3, 3), w2=rng_array(4, 3, 3, 3), k=rng_array(6, 1), **BN_PARAMS
    )
    assert notes == [
        "conv+add->conv: Add: the constant of shape [6, 1] is not per-channel (axis 2 has 6)"
    ]


def test_conv_with_two_consumers_is_not_folded() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y, float[N, 4, 6, 6] c) {
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = BatchNormalization (c, s, b, m, v)
    }
    """
    notes = _explain(text, w=rng_array(4, 3, 3, 3), **BN_PARAMS)
    assert notes == ["conv+bn->conv: BatchNormalization: Conv output has 2 consumers"]


def test_lone_batch_norm_decomposes_to_mul_add() -> None:
    from onnxopt.passes.decompose_batch_norm import DecomposeBatchNormPass

    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 5] x) => (float[N, 4, 5] y) {
        r = Relu (x)
        y = BatchNormalization (r, s, b, m, v)
    }
    """
    result = run_checked(DecomposeBatchNormPass(), parse(text, **BN_PARAMS))
    assert result.stats == {"bn->mul+add": 1}
    assert op_types(result.model) == ["Relu", "Mul", "Add"]
    after_conv = parse(CONV_BN, w=rng_array(4, 3, 3, 3), bias=rng_array(4), **BN_PARAMS)
    assert not DecomposeBatchNormPass()(after_conv).modified


# tf2onnx's Conv1D: a 2-D Conv of height 1 between an Unsqueeze and a Squeeze, its bias added to
# the squeezed [N, C, L] result (TF Whisper's and wav2vec2's feature convolutions).
SQUEEZED_CONV = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 10] x) => (float[N, 4, 8] y) {{
    axes = Constant <value = int64[1] {{{axis}}}> ()
    u = Unsqueeze (x, axes)
    c = Conv <kernel_shape = [1, 3]> (u, w)
    s = Squeeze (c, axes)
    y = {op} (s, k)
}}
"""


@pytest.mark.parametrize(("op", "rule"), [("Add", "conv+add->conv"), ("Mul", "conv+mul->conv")])
def test_per_channel_constant_after_a_squeezed_conv1d_folds(op: str, rule: str) -> None:
    model = parse(
        SQUEEZED_CONV.format(axis=2, op=op), w=rng_array(4, 3, 1, 3), k=rng_array(1, 4, 1, seed=5)
    )
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {rule: 1}
    assert op_types(result.model) == ["Constant", "Unsqueeze", "Conv", "Squeeze"]


def test_constant_after_a_squeezed_conv_along_time_stays() -> None:
    # [1, 1, 8] varies along the squeezed result's last axis: not one number per channel
    model = parse(
        SQUEEZED_CONV.format(axis=2, op="Add"), w=rng_array(4, 3, 1, 3), k=rng_array(1, 1, 8)
    )
    result = FuseConvBnPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [
        "conv+add->conv: Add: the constant of shape [1, 1, 8] is not per-channel (axis 2 has 8)"
    ]


# A projection scaled per output column: DINOv2's LayerScale (`x + lambda * proj(h)`), and
# MobileBERT's NoNorm (`proj(h) * gamma + beta`) with its shift.
SCALED_LINEAR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 6] h) => (float[B, S, 4] y) {{
    p = MatMul (h, w)
    {body}
}}
"""


@pytest.mark.parametrize(
    ("body", "ops"),
    [
        ("pb = Add (p, b)\n    y = Mul (pb, g)", ["MatMul", "Add"]),  # LayerScale
        (
            "pb = Add (b, p)\n    s = Mul (g, pb)\n    y = Add (s, beta)",
            ["MatMul", "Add"],
        ),  # NoNorm
        ("y = Mul (p, g)", ["MatMul"]),  # no bias
        ("s = Mul (p, g)\n    y = Add (s, beta)", ["MatMul", "Add"]),  # the shift becomes a bias
    ],
    ids=["layer-scale", "no-norm", "bare", "bare-with-shift"],
)
def test_per_column_scale_after_a_projection_folds_into_its_weight(
    body: str, ops: list[str]
) -> None:
    model = parse(
        SCALED_LINEAR.format(body=body),
        w=rng_array(6, 4),
        b=rng_array(4, seed=2),
        g=rng_array(1, 1, 4, seed=3),
        beta=rng_array(4, seed=4),
    )
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == {"matmul+mul->matmul": 1}
    assert op_types(result.model) == ops


@pytest.mark.parametrize(
    ("divisor", "stats"),
    [
        (rng_array(1, 1, 4, seed=3), {"matmul+div->matmul": 1}),  # twin heads' average: / 2
        (np.array([2.0, 0.0, 1.0, 4.0], dtype=np.float32), {}),  # a 0 would be a new inf
    ],
    ids=["per-column", "holding-zero"],
)
def test_a_division_after_a_projection_folds_as_a_scale(
    divisor: np.ndarray, stats: dict[str, int]
) -> None:
    model = parse(
        SCALED_LINEAR.format(body="pb = Add (p, b)\n    y = Div (pb, g)"),
        w=rng_array(6, 4),
        b=rng_array(4, seed=2),
        g=divisor,
    )
    result = run_checked(FuseConvBnPass(), model)
    assert result.stats == stats
    assert op_types(result.model) == ["MatMul", "Add"] + ([] if stats else ["Div"])


def test_scale_that_varies_along_rows_is_not_folded() -> None:
    # [S, 1]: one number per position, not per output column
    model = parse(
        SCALED_LINEAR.format(body="pb = Add (p, b)\n    y = Mul (pb, g)").replace("S, ", "5, "),
        w=rng_array(6, 4),
        b=rng_array(4, seed=2),
        g=rng_array(5, 1, seed=3),
    )
    result = FuseConvBnPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [
        "matmul+mul->matmul: Mul: the constant of shape [5, 1] is not per-channel (axis 1 has 5)"
    ]
