from __future__ import annotations

import pytest

from onnxopt.passes.fuse_conv_activation import FuseConvActivationPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

CONV_ACT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y) {{
    c = Conv <kernel_shape = [3, 3]> (x, w, b)
    y = {activation}
}}
"""
ACTIVATIONS = {
    "relu": "Relu (c)",
    "tanh": "Tanh (c)",
    "sigmoid": "Sigmoid (c)",
    "leakyrelu": "LeakyRelu <alpha = 0.2> (c)",
    "clip": "Clip (c, lo, hi)",
    "hardsigmoid": "HardSigmoid (c)",
}


def _model(activation: str):  # type: ignore[no-untyped-def]
    scalars = {"lo": rng_array(1)[0] * 0 + 0.0, "hi": rng_array(1)[0] * 0 + 6.0}
    return parse(
        CONV_ACT.format(activation=activation),
        w=rng_array(4, 3, 3, 3),
        b=rng_array(4, seed=2),
        **scalars,
    )


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_conv_activation_becomes_fused_conv(name: str) -> None:
    result = run_checked(FuseConvActivationPass(), _model(ACTIVATIONS[name]))
    assert result.stats == {f"conv+{name}->FusedConv": 1}
    assert op_types(result.model) == ["com.microsoft::FusedConv"]


def test_onnx_target_and_hardswish_are_left_alone() -> None:
    assert not FuseConvActivationPass(PassOptions(target="onnx"))(_model("Relu (c)")).modified
    result = FuseConvActivationPass(PassOptions(explain=True))(_model("HardSwish (c)"))
    assert not result.modified
    assert result.notes == [
        "conv+hardswish->FusedConv: HardSwish: ORT's FusedConv has no HardSwish activation"
    ]


def test_non_constant_clip_bound() -> None:
    text = CONV_ACT.format(activation="Clip (c, lo, hi)").replace(
        "float[N, 3, 8, 8] x)", "float[N, 3, 8, 8] x, float hi)"
    )
    model = parse(text, w=rng_array(4, 3, 3, 3), b=rng_array(4), lo=rng_array(1)[0] * 0)
    result = FuseConvActivationPass(PassOptions(explain=True))(model)
    assert result.notes == ["conv+clip->FusedConv: Clip: Clip bounds are not constant scalars"]


CUDA = PassOptions(explain=True, ort_providers=("cpu", "cuda"))


@pytest.mark.parametrize("name", sorted(set(ACTIVATIONS) - {"relu"}))
def test_for_cuda_only_relu_is_fused(name: str) -> None:
    """CUDA's FusedConv maps its activation to cuDNN's and takes Relu alone: any other fails
    when a CUDA session is made."""
    result = FuseConvActivationPass(CUDA)(_model(ACTIVATIONS[name]))
    assert not result.modified
    assert any("CUDA's FusedConv takes Relu only" in n for n in result.notes), result.notes
    relu = run_checked(FuseConvActivationPass(CUDA), _model(ACTIVATIONS["relu"]))
    assert op_types(relu.model) == ["com.microsoft::FusedConv"]


FUSED_CONV = """
<ir_version: 8, opset_import: ["" : {opset}, "com.microsoft" : 1]>
g (float[N, 3, 8, 8] x, float[N, 4, 6, 6] z) => (float[N, 4, 6, 6] y) {{
    y = com.microsoft.FusedConv <kernel_shape = [3, 3]{attributes}> ({inputs})
}}
"""


@pytest.mark.parametrize(
    ("attributes", "inputs", "opset", "ops"),
    [
        (', activation = "Sigmoid"', "x, w, b", 17, ["Conv", "Sigmoid"]),
        (', activation = "LeakyRelu", activation_params = [0.2]', "x, w, b", 17, None),
        (', activation = "Clip", activation_params = [0.0, 0.5]', "x, w, b", 17, None),
        (', activation = "Clip", activation_params = [-0.5, 0.5]', "x, w, b", 10, None),
        (', activation = "HardSigmoid", activation_params = [0.3, 0.4]', "x, w", 17, None),
        (', activation = "Tanh"', "x, w, b, z", 17, ["Conv", "Add", "Tanh"]),
        ("", "x, w, b, z", 17, ["Conv", "Add"]),
    ],
)
def test_a_fused_conv_cuda_refuses_is_put_back_as_conv_and_activation(
    attributes: str, inputs: str, opset: int, ops: list[str] | None
) -> None:
    """A FusedConv already in the model (written for the CPU, or saved by ORT's CPU optimizer)
    in a model for CUDA: Conv (+ Add of Z) + the activation, which computes the same."""
    model = parse(
        FUSED_CONV.format(attributes=attributes, inputs=inputs, opset=opset),
        w=rng_array(4, 3, 3, 3),
        b=rng_array(4, seed=2),
    )
    result = run_checked(FuseConvActivationPass(CUDA), model)
    assert result.stats == {"fusedconv->conv+activation": 1}
    types = [t for t in op_types(result.model) if t != "Constant"]
    assert "com.microsoft::FusedConv" not in types
    if ops is not None:
        assert types == ops
    assert not FuseConvActivationPass()(model.clone()).modified  # for the CPU it stays


FUSED_GEMM = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[N, 6] x) => (float[N, 4] y) {{
    y = com.microsoft.FusedGemm <transB = 1, alpha = 0.5, beta = 2.0{attributes}> (x, w, b)
}}
"""


@pytest.mark.parametrize(
    ("attributes", "ops"),
    [
        (', activation = "Tanh"', ["Gemm", "Tanh"]),
        (', activation = "LeakyRelu", activation_alpha = 0.2', ["Gemm", "LeakyRelu"]),
        (', activation = "HardSigmoid", activation_alpha = 0.3, activation_beta = 0.4', None),
        (', activation = "Selu", activation_alpha = 1.5, activation_gamma = 1.1', None),
    ],
)
def test_fused_gemm_is_put_back_as_gemm_and_activation_for_cuda(
    attributes: str, ops: list[str] | None
) -> None:
    """ORT's FusedGemm (its optimizer writes it; CPU kernel only) in a model for CUDA."""
    model = parse(
        FUSED_GEMM.format(attributes=attributes), w=rng_array(4, 6), b=rng_array(4, seed=2)
    )
    result = run_checked(FuseConvActivationPass(CUDA), model)
    assert result.stats == {"fusedgemm->gemm+activation": 1}
    if ops is not None:
        assert op_types(result.model) == ops
    assert not FuseConvActivationPass()(model.clone()).modified  # for the CPU it stays


def test_a_fused_gemm_with_an_activation_onnx_lacks_stays_and_says_why() -> None:
    model = parse(
        FUSED_GEMM.format(attributes=', activation = "ScaledTanh", activation_alpha = 0.5'),
        w=rng_array(4, 6),
        b=rng_array(4, seed=2),
    )
    result = FuseConvActivationPass(CUDA)(model)
    assert not result.modified
    assert any("no standard form here" in n for n in result.notes), result.notes
