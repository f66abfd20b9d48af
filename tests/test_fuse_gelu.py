from __future__ import annotations

import numpy as np
import pytest

from onnxopt.passes.fuse_gelu import FuseBiasGeluPass, FuseGeluPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

HEADER = (
    '<ir_version: 9, opset_import: ["" : {opset}]>\ng (float[B, S, 8] x) => (float[B, S, 8] y) {{\n'
)

ERF_TORCH = """
    z = Add (x, bias)
    d = Div (z, sqrt2)
    e = Erf (d)
    a = Add (e, one)
    m = Mul (z, a)
    y = Mul (m, half)
}}
"""

ERF_HALF_FIRST = """
    z = Add (bias, x)
    d = Mul (z, inv_sqrt2)
    e = Erf (d)
    a = Add (one, e)
    h = Mul (half, z)
    y = Mul (h, a)
}}
"""

TANH = """
    z = Add (x, bias)
    p = Pow (z, three)
    c = Mul (p, k)
    s = Add (z, c)
    t = Mul (s, sqrt2pi)
    th = Tanh (t)
    a = Add (th, one)
    h = Mul (z, half)
    y = Mul (h, a)
}}
"""

# jax's gelu(approximate=True) as tf2onnx writes it (magika, every jax2tf model): the cube built
# as x * (x * (0.044715 * x)), constants first, the 0.5 applied to 1 + tanh before x.
TANH_JAX = """
    z = Add (x, bias)
    k1 = Mul (k, z)
    k2 = Mul (z, k1)
    c = Mul (z, k2)
    s = Add (z, c)
    t = Mul (sqrt2pi, s)
    th = Tanh (t)
    a = Add (one, th)
    h = Mul (half, a)
    y = Mul (z, h)
}}
"""

# The coefficient split in two and divided: (x * x) / (1 / 0.044715) * x.
TANH_DIVIDED = """
    z = Add (x, bias)
    sq = Mul (z, z)
    d = Div (sq, inv_k)
    c = Mul (d, z)
    s = Add (c, z)
    t = Mul (s, sqrt2pi)
    th = Tanh (t)
    a = Add (th, one)
    h = Mul (z, half)
    y = Mul (h, a)
}}
"""

CONSTANTS = {
    "sqrt2": rng_array(1)[0] * 0 + 1.4142135,
    "inv_sqrt2": rng_array(1)[0] * 0 + 0.70710678,
    "one": rng_array(1)[0] * 0 + 1.0,
    "half": rng_array(1)[0] * 0 + 0.5,
    "three": rng_array(1)[0] * 0 + 3.0,
    "k": rng_array(1)[0] * 0 + 0.044715,
    "inv_k": rng_array(1)[0] * 0 + 1 / 0.044715,
    "sqrt2pi": rng_array(1)[0] * 0 + 0.7978845608,
}


def _model(body: str, opset: int = 17):  # type: ignore[no-untyped-def]
    return parse(HEADER.format(opset=opset) + body.format(), bias=rng_array(8, seed=3), **CONSTANTS)


@pytest.mark.parametrize("body", [ERF_TORCH, ERF_HALF_FIRST])
def test_erf_gelu_ort_old_opset_becomes_contrib_gelu(body: str) -> None:
    result = run_checked(FuseGeluPass(), _model(body))
    assert result.stats == {"gelu(erf)->Gelu": 1}
    assert op_types(result.model) == ["Add", "com.microsoft::Gelu"]
    biased = run_checked(FuseBiasGeluPass(), result.model)
    assert biased.stats == {"add+Gelu->BiasGelu": 1}
    assert op_types(biased.model) == ["com.microsoft::BiasGelu"]


def test_tanh_gelu_ort_old_opset_becomes_fast_gelu() -> None:
    result = run_checked(FuseGeluPass(), _model(TANH))
    assert result.stats == {"gelu(tanh)->Gelu": 1}
    assert op_types(result.model) == ["Add", "com.microsoft::FastGelu"]
    biased = run_checked(FuseBiasGeluPass(), result.model)
    assert biased.stats == {"add+FastGelu->FastGelu(bias)": 1}
    assert op_types(biased.model) == ["com.microsoft::FastGelu"]


@pytest.mark.parametrize("body", [TANH_JAX, TANH_DIVIDED], ids=["jax", "divided"])
def test_tanh_cube_in_any_association_is_gelu(body: str) -> None:
    result = run_checked(FuseGeluPass(), _model(body))
    assert result.stats == {"gelu(tanh)->Gelu": 1}
    assert op_types(result.model) == ["Add", "com.microsoft::FastGelu"]


@pytest.mark.parametrize(
    ("old", "new"),
    [("k2 = Mul (z, k1)", "k2 = Mul (k, k1)"), ("c = Mul (z, k2)", "c = Mul (x, k2)")],
    ids=["square-times-coefficient", "other-tensor"],
)
def test_a_product_that_is_not_the_cube_is_not_gelu(old: str, new: str) -> None:
    model = _model(TANH_JAX.replace(old, new))
    result = FuseGeluPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [
        "gelu(tanh)->Gelu: Tanh: Tanh argument is not sqrt(2/pi) * (x + 0.044715 * x^3)"
    ]


@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize(("body", "approximate"), [(ERF_TORCH, None), (TANH, "tanh")])
def test_opset_20_uses_standard_gelu(body: str, approximate: str | None, target: str) -> None:
    options = PassOptions(target=target)  # type: ignore[arg-type]
    result = run_checked(FuseGeluPass(options), _model(body, opset=20))
    assert op_types(result.model) == ["Add", "Gelu"]
    gelu = list(result.model.graph)[-1]
    attr = gelu.attributes.get("approximate")
    assert (attr.as_string() if attr is not None else None) == approximate


def test_onnx_target_needs_opset_20() -> None:
    result = FuseGeluPass(PassOptions(target="onnx", explain=True))(_model(ERF_TORCH))
    assert not result.modified
    assert result.notes == ["gelu(erf)->Gelu: Erf: Gelu needs opset 20, the model imports 17"]


def test_wrong_constant_is_not_gelu() -> None:
    model = parse(
        HEADER.format(opset=17) + ERF_TORCH.format(),
        bias=rng_array(8),
        **{**CONSTANTS, "half": CONSTANTS["one"]},
    )
    result = FuseGeluPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == ["gelu(erf)->Gelu: Erf: x * (1 + ...) is not multiplied by 0.5"]


def test_shared_intermediate_blocks_fusion() -> None:
    text = HEADER.format(opset=17).replace(
        "=> (float[B, S, 8] y)", "=> (float[B, S, 8] y, float[B, S, 8] a)"
    )
    model = parse(text + ERF_TORCH.format(), bias=rng_array(8), **CONSTANTS)
    result = FuseGeluPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [
        "gelu(erf)->Gelu: Erf: 1 + erf/tanh is used by more than one Mul (or is a graph output)"
    ]


def test_native_gelu_with_bias_becomes_bias_gelu_for_ort() -> None:
    text = """
    <ir_version: 9, opset_import: ["" : 20]>
    g (float[B, S, 8] x) => (float[B, S, 8] y, float[B, S, 8] t) {
        z = Add (x, bias)
        y = Gelu (z)
        u = Add (x, bias)
        t = Gelu <approximate = "tanh"> (u)
    }
    """
    result = run_checked(FuseBiasGeluPass(), parse(text, bias=rng_array(8, seed=3)))
    assert result.stats == {"add+Gelu(onnx)->BiasGelu/FastGelu": 2}
    assert op_types(result.model) == ["com.microsoft::BiasGelu", "com.microsoft::FastGelu"]


def test_rank_raising_constant_is_not_a_scalar() -> None:
    model = parse(
        HEADER.format(opset=17).replace("float[B, S, 8] y", "float[1, B, S, 8] y")
        + ERF_TORCH.format(),
        bias=rng_array(8),
        **{**CONSTANTS, "half": np.full((1, 1, 1, 1), 0.5, dtype=np.float32)},
    )
    assert not FuseGeluPass()(model).modified


BIAS_GELU = """
    <ir_version: 9, opset_import: ["" : 20]>
    g ({xtype}[B, S, 8] x{extra_input}) => ({xtype}[B, S, 8] y) {{
        z = Add (x, bias)
        y = Gelu (z)
    }}
"""


@pytest.mark.parametrize(
    ("bias", "extra_input", "xtype", "reason"),
    [
        (rng_array(1, 8), "", "float", "bias has shape [1, 8], not 1-D"),
        (rng_array(1), "", "float", "bias length 1 is not the input's last dim (8)"),
        (None, ", float[8] bias", "float", None),
        (
            rng_array(8).astype(np.float64),
            "",
            "double",
            "BiasGelu/FastGelu run on float and float16",
        ),
    ],
    ids=["2-D", "broadcast", "graph-input", "double"],
)
def test_bias_gelu_needs_a_constant_1d_float_bias_along_the_last_axis(
    bias: np.ndarray | None, extra_input: str, xtype: str, reason: str | None
) -> None:
    text = BIAS_GELU.format(xtype=xtype, extra_input=extra_input)
    model = parse(text, **({"bias": bias} if bias is not None else {}))
    result = FuseBiasGeluPass(PassOptions(explain=True))(model)
    assert not result.modified
    if reason is None:  # a bias that is not a constant is not a candidate at all
        assert result.notes == []
    else:
        assert len(result.notes) == 1
        assert result.notes[0].startswith("add+Gelu(onnx)->BiasGelu/FastGelu: ")
        assert reason in result.notes[0]


def test_bias_gelu_along_another_axis_is_refused() -> None:
    text = BIAS_GELU.format(xtype="float", extra_input="").replace("[B, S, 8]", "[B, 8, 3]")
    result = FuseBiasGeluPass(PassOptions(explain=True))(parse(text, bias=rng_array(8, 1)))
    assert not result.modified
    assert result.notes == [
        "add+Gelu(onnx)->BiasGelu/FastGelu: Gelu: bias has shape [8, 1], not 1-D"
    ]


def test_bias_gelu_is_ort_only() -> None:
    model = parse(BIAS_GELU.format(xtype="float", extra_input=""), bias=rng_array(8))
    assert not FuseBiasGeluPass(PassOptions(target="onnx"))(model).modified


def test_default_level_emits_bias_gelu_for_ort_only() -> None:
    from onnxopt.api import optimize

    model = parse(BIAS_GELU.format(xtype="float", extra_input=""), bias=rng_array(8))
    result = optimize(model)
    assert result.validated
    assert op_types(result.model) == ["com.microsoft::BiasGelu"]
    portable = optimize(model, target="onnx")
    assert op_types(portable.model) == ["Add", "Gelu"]
    assert op_types(optimize(model, disable=["fuse-bias-gelu"]).model) == ["Add", "Gelu"]


def test_one_of_rank_3_added_to_a_rank_3_erf_is_plus_one() -> None:
    """tf2onnx writes the 1 of 1 + erf as a [1, 1, 1] constant beside Whisper's transposed conv
    features: it broadcasts without raising the rank. Against a rank-2 input it would raise it."""
    ones = {**CONSTANTS, "one": np.ones((1, 1, 1), dtype=np.float32)}
    result = run_checked(
        FuseGeluPass(),
        parse(HEADER.format(opset=17) + ERF_TORCH.format(), bias=rng_array(8, seed=3), **ones),
    )
    assert result.stats == {"gelu(erf)->Gelu": 1}
    flat = HEADER.format(opset=17).replace(
        "float[B, S, 8] x) => (float[B, S, 8] y)", "float[S, 8] x) => (float[1, S, 8] y)"
    )
    model = parse(flat + ERF_TORCH.format(), bias=rng_array(8, seed=3), **ones)
    refused = FuseGeluPass(PassOptions(explain=True))(model)
    assert not refused.modified
    assert refused.notes == ["gelu(erf)->Gelu: Erf: Erf result is not increased by 1"]
