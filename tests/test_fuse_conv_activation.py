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
