"""Seeded differential fuzzing of fuse-affine-conv: random affine chains before random Convs.

Each seed builds a chain of Mul/Div/Add/Sub by constants (scalars, per-channel vectors in every
spelling, and shapes that are not per-channel) and BatchNormalizations, read by a Conv of random
rank, group, kernel, strides, dilations, padding (explicit or auto_pad) and bias, sometimes with an
intermediate read elsewhere too, then checks on ONNX Runtime that the optimized model computes
the same outputs, at two batch sizes where the batch is dynamic, and that a second run changes
nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnxopt
from onnxopt.io import model_from_proto

PASSES = ["infer-shapes", "fuse-affine-conv", "eliminate-dead-code"]


def _constant_shape(
    rng: np.random.Generator, rank: int, channels: int, sizes: list[int]
) -> tuple[int, ...]:
    kind = rng.choice(
        ["scalar", "one", "channel", "batched", "short", "bare", "spatial", "raise"],
        p=[0.2, 0.1, 0.25, 0.2, 0.05, 0.05, 0.1, 0.05],
    )
    spatial = (1,) * (rank - 2)
    return {
        "scalar": (),
        "one": (1,),
        "channel": (channels, *spatial),
        "batched": (1, channels, *spatial),
        "short": (channels, *spatial[:-1]) if rank > 3 else (channels, 1),  # broadcasts wrongly
        "bare": (channels,),  # along the last axis: not per-channel unless it is 1
        "spatial": (1, 1, *sizes),  # one number per position
        "raise": (1,) * (rank + 1),
    }[str(kind)]


def random_model(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([3, 4, 4, 5]))
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.integers(1, 3))
    out_channels = group * int(rng.integers(1, 3))
    kernel = [int(rng.integers(1, 4)) for _ in range(rank - 2)]
    spatial = [int(rng.integers(5, 8)) for _ in range(rank - 2)]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(array: np.ndarray) -> str:
        name = f"c{len(inits)}"
        inits.append(onh.from_array(array.astype(np.float32), name))
        return name

    def numbers(shape: tuple[int, ...]) -> np.ndarray:
        values = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        if rng.random() < 0.05:
            values = values * 0  # a zero divisor now and then
        return np.asarray(values, dtype=np.float32)

    value = "x"
    if rng.random() < 0.7:
        nodes.append(oh.make_node("Relu", ["x"], ["r"]))
        value = "r"
    extra: list[str] = []
    for step in range(int(rng.integers(1, 4))):
        out = f"a{step}"
        op = str(rng.choice(["Mul", "Div", "Add", "Sub", "BatchNormalization"]))
        if op == "BatchNormalization":
            stats = [numbers((channels,)) for _ in range(3)] + [rng.uniform(0.5, 2, channels)]
            names = [const(np.asarray(s)) for s in stats]
            nodes.append(oh.make_node(op, [value, *names], [out], epsilon=1e-3))
        else:
            c = const(numbers(_constant_shape(rng, rank, channels, spatial)))
            operands = [value, c] if rng.random() < 0.6 or op == "Div" else [c, value]
            nodes.append(oh.make_node(op, operands, [out]))
        if rng.random() < 0.15:
            extra.append(out)  # also a graph output: the chain cannot fold past it
        value = out
    weight = const(numbers((out_channels, channels // group, *kernel)))
    inputs = [value, weight]
    if rng.random() < 0.6:
        inputs.append(const(numbers((out_channels,))))
    attrs: dict[str, object] = {"group": group}
    if rng.random() < 0.5:
        attrs["strides"] = [int(rng.integers(1, 3)) for _ in kernel]
    if rng.random() < 0.3:
        attrs["dilations"] = [int(rng.integers(1, 3)) for _ in kernel]
    padding = str(rng.choice(["none", "zeros", "pads", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if padding == "zeros":
        attrs["pads"] = [0] * (2 * len(kernel))
    elif padding == "pads":
        attrs["pads"] = [int(rng.integers(0, 2)) for _ in range(2 * len(kernel))]
    elif padding != "none":
        attrs["auto_pad"] = padding
        attrs.pop("dilations", None)  # SAME with dilations: not every runtime agrees
    nodes.append(oh.make_node("Conv", inputs, ["y"], **attrs))
    batch: int | str = "N" if rng.random() < 0.5 else 2
    x_info = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, channels, *spatial])
    outputs = [
        oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in ["y", *extra]
    ]
    graph = oh.make_graph(nodes, "fuzz", [x_info], outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def check_seed(seed: int) -> None:
    proto = random_model(seed)
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return  # a constant that broadcasts the activation to a shape the Conv refuses
    try:
        result = onnxopt.optimize(model_from_proto(proto), passes=PASSES)
    except onnxopt.validate.CannotValidate:
        return  # ORT refuses the original too (a window larger than the padded input)
    report = result.report.validation
    assert report is not None and report.passed, (seed, report, onnx.printer.to_text(proto))
    again = onnxopt.optimize(result.model, passes=PASSES, check=False)
    totals = {name: stats for name, _, _, stats in again.report.pass_totals()}
    assert not totals.get("fuse-affine-conv"), (seed, totals)


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_affine_conv(seed: int) -> None:
    check_seed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(16, 600))
def test_fuzz_affine_conv_many(seed: int) -> None:
    check_seed(seed)
