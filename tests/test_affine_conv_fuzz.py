"""Seeded differential fuzzing of fuse-affine-conv and fuse-affine-matmul: random affine chains
before random Convs, Gemms and MatMuls.

Each seed builds a chain of Mul/Div/Add/Sub by constants (scalars, per-channel vectors in every
spelling, and shapes that are not per-channel) and BatchNormalizations, read by a Conv of random
rank, group, kernel, strides, dilations, padding (explicit or auto_pad) and bias, or by a Gemm
(transB, alpha, beta, C of several shapes or none) or a MatMul of random rank (with or without its
bias Add), sometimes with an intermediate read elsewhere too, then checks on ONNX Runtime that the
optimized model computes the same outputs, at two batch sizes where the batch is dynamic, and that
a second run changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnxopt
from onnxopt.io import model_from_proto

CONV_PASSES = ["infer-shapes", "fuse-affine-conv", "eliminate-dead-code"]
PRODUCT_PASSES = ["infer-shapes", "fuse-affine-matmul", "eliminate-dead-code"]


class Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.extra: list[str] = []  # intermediates that are graph outputs too

    def const(self, array: np.ndarray) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(onh.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def numbers(self, shape: tuple[int, ...]) -> np.ndarray:
        rng = self.rng
        values = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        if rng.random() < 0.05:
            values = values * 0  # a zero divisor now and then
        return np.asarray(values, dtype=np.float32)

    def constant_shape(self, shape: list[int], axis: int) -> tuple[int, ...]:
        """Per-channel along ``axis`` of an activation of ``shape`` in one of its spellings, or
        a shape that is not (one number per position, the channels on the wrong axis, a rank
        above the activation's)."""
        rank, channels = len(shape), shape[axis]
        ones = [1] * rank
        along = ones.copy()
        along[axis] = channels
        kind = self.rng.choice(
            ["scalar", "one", "trimmed", "full", "wrong-axis", "positions", "raise"],
            p=[0.2, 0.1, 0.25, 0.2, 0.1, 0.1, 0.05],
        )
        wrong = ones.copy()
        wrong[(axis + 1) % rank] = channels
        return {
            "scalar": (),
            "one": (1,),
            "trimmed": tuple(along[axis:]),  # [C, 1, 1] for axis 1, [K] for the last
            "full": tuple(along),
            "wrong-axis": tuple(wrong),
            "positions": (1, *shape[1:]),
            "raise": (1,) * (rank + 1),
        }[str(kind)]

    def chain(self, shape: list[int], axis: int) -> str:
        """An activation of ``shape`` (x, maybe through a Relu), then 1-3 affine ops."""
        value = "x"
        if self.rng.random() < 0.7:
            self.nodes.append(oh.make_node("Relu", ["x"], ["r"]))
            value = "r"
        for step in range(int(self.rng.integers(1, 4))):
            out = f"a{step}"
            ops = ["Mul", "Div", "Add", "Sub", "BatchNormalization"][: 5 if len(shape) > 1 else 4]
            op = str(self.rng.choice(ops))
            if op == "BatchNormalization":
                channels = shape[1]
                stats = [self.numbers((channels,)) for _ in range(3)]
                stats.append(self.rng.uniform(0.5, 2, channels).astype(np.float32))
                names = [self.const(s) for s in stats]
                self.nodes.append(oh.make_node(op, [value, *names], [out], epsilon=1e-3))
            else:
                c = self.const(self.numbers(self.constant_shape(shape, axis)))
                first = self.rng.random() < 0.6 or op == "Div"
                self.nodes.append(oh.make_node(op, [value, c] if first else [c, value], [out]))
            if self.rng.random() < 0.15:
                self.extra.append(out)  # also a graph output: the chain cannot fold past it
            value = out
        return value

    def model(self, x_dims: list[int | str], output: str = "y") -> onnx.ModelProto:
        x_info = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_dims)
        outputs = [
            oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
            for name in [output, *self.extra]
        ]
        graph = oh.make_graph(self.nodes, "fuzz", [x_info], outputs, self.inits)
        return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def random_conv_model(seed: int) -> onnx.ModelProto:
    b = Builder(seed)
    rng = b.rng
    rank = int(rng.choice([3, 4, 4, 5]))
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.integers(1, 3))
    out_channels = group * int(rng.integers(1, 3))
    kernel = [int(rng.integers(1, 4)) for _ in range(rank - 2)]
    spatial = [int(rng.integers(5, 8)) for _ in range(rank - 2)]
    value = b.chain([2, channels, *spatial], 1)
    inputs = [value, b.const(b.numbers((out_channels, channels // group, *kernel)))]
    if rng.random() < 0.6:
        inputs.append(b.const(b.numbers((out_channels,))))
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
    b.nodes.append(oh.make_node("Conv", inputs, ["y"], **attrs))
    batch: int | str = "N" if rng.random() < 0.5 else 2
    return b.model([batch, channels, *spatial])


def random_product_model(seed: int) -> onnx.ModelProto:
    b = Builder(seed)
    rng = b.rng
    features, width = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    gemm = rng.random() < 0.5
    rank = 2 if gemm else int(rng.choice([1, 2, 3, 4]))
    shape = [int(d) for d in rng.integers(2, 4, size=rank - 1)] + [features]
    value = b.chain(shape, rank - 1)
    if gemm:
        trans_b = int(rng.integers(0, 2))
        weight = b.numbers((width, features) if trans_b else (features, width))
        inputs = [value, b.const(weight)]
        c_shape = rng.choice(["none", "vector", "row", "full", "scalar"])
        if c_shape != "none":
            dims = {"vector": (width,), "row": (1, width), "full": (shape[0], width)}
            inputs.append(b.const(b.numbers(dims.get(str(c_shape), ()))))
        attrs = {"transB": trans_b}
        if rng.random() < 0.4:
            attrs.update(alpha=float(rng.uniform(0.5, 2)), beta=float(rng.uniform(0.5, 2)))
        b.nodes.append(oh.make_node("Gemm", inputs, ["y"], **attrs))
    else:
        output = "y" if rng.random() < 0.4 else "p"
        b.nodes.append(
            oh.make_node("MatMul", [value, b.const(b.numbers((features, width)))], [output])
        )
        if output == "p":
            bias = b.const(b.numbers((width,) if rng.random() < 0.7 else (1, width)))
            b.nodes.append(
                oh.make_node("Add", ["p", bias] if rng.random() < 0.5 else [bias, "p"], ["y"])
            )
    batch: list[int | str] = ["N"] if rank > 1 and rng.random() < 0.5 else shape[:1]
    return b.model([*batch, *shape[1:]] if rank > 1 else shape)


def check_seed(make: Callable[[int], onnx.ModelProto], passes: list[str], seed: int) -> None:
    proto = make(seed)
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return  # a constant that broadcasts the activation to a shape the layer refuses
    try:
        result = onnxopt.optimize(model_from_proto(proto), passes=passes)
    except onnxopt.validate.CannotValidate:
        return  # ORT refuses the original too (a window larger than the padded input)
    report = result.report.validation
    assert report is not None and report.passed, (seed, report, onnx.printer.to_text(proto))
    again = onnxopt.optimize(result.model, passes=passes, check=False)
    totals = {name: stats for name, _, _, stats in again.report.pass_totals()}
    assert not totals.get(passes[1]), (seed, totals)


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_affine_conv(seed: int) -> None:
    check_seed(random_conv_model, CONV_PASSES, seed)


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_affine_matmul(seed: int) -> None:
    check_seed(random_product_model, PRODUCT_PASSES, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(16, 400))
def test_fuzz_affine_conv_many(seed: int) -> None:
    check_seed(random_conv_model, CONV_PASSES, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(16, 400))
def test_fuzz_affine_matmul_many(seed: int) -> None:
    check_seed(random_product_model, PRODUCT_PASSES, seed)
