"""promote-conv1d: wide or long-kernel 1-D Convs run as 2-D Convs of height 1 (target ort)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest

from onnxopt import api
from onnxopt.io import model_from_proto, to_proto
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.passes.promote_conv1d import PromoteConv1dPass
from onnxopt.validate import validate
from tests._pass_check import op_types


def conv_chain(
    layers: list[tuple[int, int, int, dict[str, object]]],
    activation: str = "Gelu",
    opset: int = 20,
    dtype: type = np.float32,
) -> onnx.ModelProto:
    """x [N, C, L] -> (Conv -> activation) per layer: (in, out, kernel, attributes)."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i, (cin, cout, taps, attrs) in enumerate(layers):
        group = int(attrs.get("group", 1))  # type: ignore[call-overload]
        weight = rng.standard_normal((cout, cin // group, taps)) / np.sqrt(cin // group * taps)
        weights += [
            onh.from_array(weight.astype(dtype), f"w{i}"),
            onh.from_array(rng.standard_normal(cout).astype(dtype), f"b{i}"),
        ]
        nodes += [
            oh.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}", **attrs),
            oh.make_node(activation, [f"c{i}"], [f"a{i}"]),
        ]
        prev = f"a{i}"
    nodes.append(oh.make_node("Identity", [prev], ["y"]))
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", elem, ["N", layers[0][0], "L"])],
        [oh.make_tensor_value_info("y", elem, None)],
        weights,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)


def _load(proto: onnx.ModelProto) -> ir.Model:
    model = model_from_proto(proto)
    InferShapesPass()(model)
    return model


# wav2vec2's feature encoder after its first layer: 512 channels, kernels 3 and 2, stride 2.
ENCODER = [
    (256, 256, 3, {"strides": [2]}),
    (256, 256, 3, {"strides": [2], "pads": [1, 1]}),
    (256, 256, 2, {"strides": [2], "dilations": [1]}),
]


def test_wide_conv_chain_becomes_2d_and_stays_2d_inside() -> None:
    original = _load(conv_chain(ENCODER))
    result = PromoteConv1dPass()(original.clone())
    assert dict(result.stats) == {"conv1d->conv2d": 3, "squeeze-past-Gelu": 3}
    convs = [n for n in result.model.graph if n.op_type == "Conv"]
    assert [list(n.inputs[1].shape) for n in convs] == [[256, 256, 1, 3]] * 2 + [[256, 256, 1, 2]]
    assert list(convs[1].attributes.get_ints("pads")) == [0, 1, 0, 1]
    assert list(convs[0].attributes.get_ints("strides")) == [1, 2]
    report = validate(original, result.model)
    assert report.passed and len(report.trials) == 2, report
    assert not PromoteConv1dPass()(result.model).modified

    # In the pipeline the Squeeze -> Unsqueeze pairs between the layers go: one of each is left.
    optimized = api.optimize(model_from_proto(conv_chain(ENCODER)))
    assert optimized.validated
    assert op_types(optimized.model) == [
        "Unsqueeze", "Conv", "Gelu", "Conv", "Gelu", "Conv", "Gelu", "Squeeze",
    ]  # fmt: skip
    again = api.optimize(optimized.model).model
    assert to_proto(again).SerializeToString() == to_proto(optimized.model).SerializeToString()


def test_long_grouped_kernel_is_promoted_and_opset_11_axes_are_attributes() -> None:
    """wav2vec2's positional convolution (kernel 128, 16 groups) and a Conformer depthwise one."""
    layers = [
        (256, 256, 31, {"group": 256, "pads": [15, 15]}),
        (256, 256, 32, {"group": 16, "pads": [16, 16]}),
    ]
    original = _load(conv_chain(layers, activation="Relu", opset=11))
    result = PromoteConv1dPass()(original.clone())
    assert dict(result.stats) == {"conv1d->conv2d": 2, "squeeze-past-Relu": 2}
    squeezes = [n for n in result.model.graph if n.op_type in ("Squeeze", "Unsqueeze")]
    assert all(list(n.attributes.get_ints("axes")) == [2] for n in squeezes)
    assert len(squeezes) == 4 and all(len(n.inputs) == 1 for n in squeezes)
    report = validate(original, result.model)
    assert report.passed, report


def test_conv_relu_still_becomes_fused_conv() -> None:
    optimized = api.optimize(model_from_proto(conv_chain(ENCODER[:1], activation="Relu")))
    assert op_types(optimized.model) == ["Unsqueeze", "FusedConv", "Squeeze"]
    assert optimized.validated


@pytest.mark.parametrize(
    ("layers", "reason"),
    [
        ([(128, 128, 3, {})], "128 -> 128 channels in 1 group(s), kernel 3"),
        ([(256, 256, 1, {})], "256 -> 256 channels in 1 group(s), kernel 1"),
        ([(256, 256, 3, {"group": 4})], "256 -> 256 channels in 4 group(s), kernel 3"),
        ([(1, 512, 10, {"strides": [5]})], "1 -> 512 channels in 1 group(s), kernel 10"),
        ([(1, 258, 256, {"strides": [128]})], "1 -> 258 channels in 1 group(s), kernel 256"),
    ],
    ids=["narrow", "pointwise", "grouped-short", "waveform", "stft"],
)
def test_shapes_measured_slower_stay_1d(
    layers: list[tuple[int, int, int, dict[str, object]]], reason: str
) -> None:
    model = _load(conv_chain(layers))
    result = PromoteConv1dPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any(reason in note and "measured slower" in note for note in result.notes), result.notes


def test_target_onnx_and_float16_stay_1d() -> None:
    portable = PromoteConv1dPass(PassOptions(target="onnx"))(_load(conv_chain(ENCODER)))
    assert not portable.modified
    half = PromoteConv1dPass(PassOptions(explain=True))(
        _load(conv_chain(ENCODER[:1], dtype=np.float16))
    )
    assert not half.modified
    assert any("float16" in note for note in half.notes), half.notes


def test_a_squeezed_output_read_twice_keeps_its_squeeze() -> None:
    proto = conv_chain(ENCODER[:1])
    proto.graph.node.append(oh.make_node("Tanh", ["c0"], ["t"]))
    proto.graph.output.append(oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None))
    original = _load(proto)
    result = PromoteConv1dPass()(original.clone())
    assert dict(result.stats) == {"conv1d->conv2d": 1}
    assert validate(original, result.model).passed
