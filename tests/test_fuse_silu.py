"""fuse-silu: x * Sigmoid(x) -> com.microsoft QuickGelu(alpha=1) (ort) or Swish (onnx, opset 24+)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

from onnxopt import api
from onnxopt.io import model_from_proto, to_proto
from onnxopt.passes.fuse_silu import FuseSiluPass
from onnxopt.passes.options import PassOptions
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

RULE = "x*sigmoid(x)->QuickGelu/Swish"


@pytest.mark.parametrize(
    "body",
    [
        "{ s = Sigmoid(x)\n m = Mul(x, s)\n y = Relu(m) }",
        "{ s = Sigmoid(x)\n m = Mul(s, x)\n y = Relu(m) }",
    ],
    ids=["x-first", "sigmoid-first"],
)
def test_silu_becomes_quick_gelu(body: str) -> None:
    fused = assert_rewrites(
        FuseSiluPass,
        model(body, inputs="float[N,3,4] x", outputs="float[N,3,4] y"),
        {RULE: 1},
        ["QuickGelu", "Relu"],
        2,
    )
    node = fused.graph.node(0)
    assert node.domain == "com.microsoft" and node.attributes.get_float("alpha") == 1.0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "{ s = Sigmoid(x)\n m = Mul(x, s)\n y = Add(m, s) }",
            "the Sigmoid's result is used elsewhere",
        ),
        ("{ r = Relu(x)\n s = Sigmoid(r)\n y = Mul(x, s) }", None),
    ],
    ids=["sigmoid-shared", "sigmoid-of-another-value"],
)
def test_near_misses_stay(body: str, reason: str | None) -> None:
    if reason is not None:
        assert_refuses(FuseSiluPass, model(body), reason)
    else:
        result = FuseSiluPass()(load(model(body)))
        assert not result.modified and "QuickGelu" not in op_types(result.model)


def test_target_onnx_uses_swish_from_opset_24_and_says_why_not_before() -> None:
    body = "{ s = Sigmoid(x)\n y = Mul(x, s) }"
    early = FuseSiluPass(PassOptions(target="onnx", explain=True))(load(model(body, opset=17)))
    assert not early.modified
    assert any("Swish needs opset 24, the model imports 17" in n for n in early.notes)
    late = FuseSiluPass(PassOptions(target="onnx"))(load(model(body, opset=24)))
    assert op_types(late.model) == ["Swish"]
    assert late.model.graph.node(0).domain == ""


def test_conv_silu_blocks_optimize_bit_identically() -> None:
    """YOLOv5/v8's Conv + SiLU, as the exporters write it: every pair fuses, ORT's outputs are
    bit-identical, and a second optimize run changes nothing."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(3):
        weights.append(
            onh.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"w{i}")
        )
        nodes += [
            oh.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            oh.make_node("Sigmoid", [f"c{i}"], [f"s{i}"]),
            oh.make_node("Mul", [f"c{i}", f"s{i}"], [f"y{i}"]),
        ]
        prev = f"y{i}"
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", 4, "H", "W"])],
        [oh.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, None)],
        weights,
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    result = api.optimize(model_from_proto(proto))
    assert result.validated
    assert [n.op_type for n in result.model.graph] == ["Conv", "QuickGelu"] * 3
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs = [
        ort.InferenceSession(
            p.SerializeToString(), options, providers=["CPUExecutionProvider"]
        ).run(None, {"x": x})[0]
        for p in (proto, to_proto(result.model))
    ]
    assert np.array_equal(runs[0], runs[1])
    again = api.optimize(result.model).model
    assert to_proto(again).SerializeToString() == to_proto(result.model).SerializeToString()


def test_scaled_sigmoid_becomes_quick_gelu_with_its_alpha_bit_identically() -> None:
    # CLIP's quick_gelu: x * sigmoid(1.702 * x), the factor on either side of the Mul.
    for scale in ("c = Mul(x, k)", "c = Mul(k, x)"):
        body = (
            "<float k = {1.702}> { " + scale + "\n s = Sigmoid(c)\n m = Mul(x, s)\n y = Relu(m) }"
        )
        fused = assert_rewrites(
            FuseSiluPass,
            model(body, inputs="float[N,3,4] x", outputs="float[N,3,4] y"),
            {RULE: 1},
            ["QuickGelu", "Relu"],
            2,
        )
        alpha = fused.graph.node(0).attributes.get_float("alpha")
        assert alpha == float(np.float32(1.702))
    proto = load(model(body, inputs="float[N,3,4] x", outputs="float[N,3,4] y"))
    x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32) * 6
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs = [
        ort.InferenceSession(
            to_proto(m).SerializeToString(), options, providers=["CPUExecutionProvider"]
        ).run(None, {"x": x})[0]
        for m in (proto, fused)
    ]
    assert np.array_equal(runs[0], runs[1])


def test_scaled_sigmoid_refusals_say_why() -> None:
    shared = (
        "<float k = {1.702}> { c = Mul(x, k)\n s = Sigmoid(c)\n m = Mul(x, s)\n y = Add(m, c) }"
    )
    assert_refuses(FuseSiluPass, model(shared), "the scaled input of the Sigmoid is used elsewhere")
    wide = "<double k = {1.702}> { c = Mul(x, k)\n s = Sigmoid(c)\n m = Mul(x, s)\n y = Relu(m) }"
    assert_refuses(
        FuseSiluPass,
        model(wide, inputs="double[N,3,4] x", outputs="double[N,3,4] y"),
        "float32 only",
    )
