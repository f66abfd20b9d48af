"""fuse-channel-affine: h * a + b between convolutions -> a depthwise 1x1 Conv (target ort)."""

from __future__ import annotations

import pytest

from onnxopt.passes.fuse_channel_affine import FuseChannelAffinePass
from onnxopt.passes.options import PassOptions
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

RULE = "h*a+b->depthwise Conv"
W = "float[4,4,1,1] w = {1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0}"
IO = {"inputs": "float[N,4,3,5] x", "outputs": "float[N,4,3,5] y"}


@pytest.mark.parametrize(
    ("constants", "body"),
    [
        # PP-LCNetV3's learnable affine block after an activation: scalars
        ("float a = {1.5}, float b = {-0.25}", "m = Mul(r, a)\n s = Add(m, b)"),
        # a BatchNormalization after an activation, exported as per-channel Mul and Add
        (
            "float[4,1,1] a = {1.5, 0.5, 2.0, -1.0}, float[1,4,1,1] b = {0.1, 0.2, 0.3, 0.4}",
            "m = Mul(a, r)\n s = Add(b, m)",
        ),
    ],
    ids=["scalar", "per-channel"],
)
def test_an_affine_between_convolutions_becomes_a_depthwise_conv(constants: str, body: str) -> None:
    text = model(
        f"<{W}, {constants}> {{ c = Conv(x, w)\n r = Relu(c)\n {body}\n y = Conv(s, w) }}", **IO
    )
    fused = assert_rewrites(
        FuseChannelAffinePass, text, {RULE: 1}, ["Conv", "Relu", "Conv", "Conv"], 2
    )
    depthwise = fused.graph.node(2)
    assert depthwise.attributes.get_int("group") == 4
    assert list(depthwise.attributes.get_ints("kernel_shape", ())) == [1, 1]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # fuse-conv-bn folds an affine right after a Conv into the Conv's weights
        (
            "c = Conv(x, w)\n m = Mul(c, a)\n s = Add(m, b)\n y = Conv(s, w)",
            "the affine follows a Conv",
        ),
        ("m = Mul(x, a)\n s = Add(m, b)\n y = Conv(s, w)", "reads a graph input"),
        (
            "c = Conv(x, w)\n r = Relu(c)\n m = Mul(r, a)\n y = Add(m, b)",
            "no Conv reads the result",
        ),
        (
            "c = Conv(x, w)\n r = Relu(c)\n m = Mul(r, a)\n s = Add(m, b)\n t = Conv(s, w)\n y = Add(t, m)",
            "the scaled activation has other users",
        ),
    ],
    ids=["after-conv", "graph-input", "no-conv-reader", "mul-shared"],
)
def test_affines_it_leaves_are_explained(body: str, reason: str) -> None:
    text = model(f"<{W}, float a = {{1.5}}, float b = {{-0.25}}> {{ {body} }}", **IO)
    assert_refuses(FuseChannelAffinePass, text, reason)


def test_only_for_target_ort() -> None:
    text = model(
        f"<{W}, float a = {{1.5}}, float b = {{-0.25}}> {{ c = Conv(x, w)\n r = Relu(c)\n"
        " m = Mul(r, a)\n s = Add(m, b)\n y = Conv(s, w) }",
        **IO,
    )
    result = FuseChannelAffinePass(PassOptions(target="onnx"))(load(text))
    assert not result.modified and "Mul" in op_types(result.model)
