"""Seeded differential fuzzing of fuse-parallel-matmuls: random linear chains of one input, summed.

Each seed builds two to four summands over one activation of rank 2 or 3. A summand is a chain of
up to four linear ops read from the input up: MatMuls by constant matrices of random width (low
rank ones among them, as LoRA's A and B), at rank 2 Gemms (transB, alpha, beta, a C of one or N
entries) and BatchNormalizations, and Mul, Div, Add, Sub by a scalar or per-feature constant,
with the constant first or second; the last product gives the common width. Sometimes a chain
reads another input (a Relu of x), a value inside a chain is read elsewhere too, or a weight is
shared by two chains, or a summand is read a second time through a scaling (DoRA's
``(m - 1) * base``). The summands are added in a random order and association, some by Sub.
ONNX Runtime must give the same outputs after fuse-parallel-matmuls, at two sizes of each dynamic
dim, and a second run must change nothing. Across the seeds both merges and refusals must occur.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from tests._pass_fuzz import check_range

PASSES = ["infer-shapes", "fuse-parallel-matmuls", "eliminate-dead-code"]


def random_sums(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(array: np.ndarray | float) -> str:
        name = f"c{len(inits)}"
        inits.append(onh.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def node(op: str, inputs: list[str], **attributes: object) -> str:
        out = f"{op.lower()}{len(nodes)}"
        nodes.append(oh.make_node(op, inputs, [out], **attributes))
        return out

    rank = int(rng.choice([2, 3]))
    width, out_width = int(rng.choice([4, 6, 8])), int(rng.choice([4, 6]))
    sources = ["x", node("Relu", ["x"])] if rng.random() < 0.15 else ["x"]
    shared: list[str] = []
    inside: list[str] = []

    def elementwise(value: str, features: int) -> str:
        op = str(rng.choice(["Mul", "Div", "Add", "Sub"]))
        if rng.random() < 0.3:
            constant = const(rng.uniform(0.5, 2.0) * rng.choice([-1, 1]))
        else:
            shape = (features,) if rng.random() < 0.7 else (1,) * (rank - 1) + (features,)
            constant = const(rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape))
        first = op in ("Mul", "Add") and rng.random() < 0.5
        return node(op, [constant, value] if first else [value, constant])

    def product(value: str, features: int, out: int) -> str:
        if rank == 2 and rng.random() < 0.4:
            trans = int(rng.random() < 0.5)
            weight = rng.normal(0, 0.5, (out, features) if trans else (features, out))
            inputs = [value, const(weight)]
            if rng.random() < 0.6:
                inputs.append(const(rng.normal(0, 0.3, (out,) if rng.random() < 0.5 else (1, out))))
            alpha, beta = float(rng.choice([1.0, 0.5])), float(rng.choice([1.0, 2.0]))
            return node("Gemm", inputs, transB=trans, alpha=alpha, beta=beta)
        if shared and (features, out) == (width, out_width) and rng.random() < 0.1:
            return node("MatMul", [value, shared[0]])
        weight = const(rng.normal(0, 0.5, (features, out)))
        if features == width and out == out_width:
            shared.append(weight)
        return node("MatMul", [value, weight])

    summands = []
    for _ in range(int(rng.integers(2, 5))):
        value = str(rng.choice(sources))
        features = width
        if rank == 2 and rng.random() < 0.15:
            stats = [rng.uniform(0.5, 1.5, width), rng.normal(0, 0.2, width),
                     rng.normal(0, 0.2, width), rng.uniform(0.5, 2, width)]  # fmt: skip
            value = node("BatchNormalization", [value, *map(const, stats)])
        if rng.random() < 0.2:
            value = elementwise(value, features)
        if rng.random() < 0.4:  # a low-rank or wide first product (LoRA's A)
            middle = int(rng.choice([1, 2, 12]))
            value = product(value, features, middle)
            inside.append(value)
            features = middle
            if rng.random() < 0.2:
                value = elementwise(value, features)
        value = product(value, features, out_width)
        if rng.random() < 0.5:
            value = elementwise(value, out_width)
        summands.append(value)
    if rng.random() < 0.25:  # DoRA: a summand read twice, once rescaled ((m - 1) * base)
        summands.append(elementwise(str(rng.choice(summands)), out_width))
    order = [summands[i] for i in rng.permutation(len(summands))]
    extra = [str(rng.choice(inside))] if inside and rng.random() < 0.15 else []
    while len(order) > 1:
        i = int(rng.integers(0, len(order) - 1))
        op = "Sub" if rng.random() < 0.3 else "Add"
        order[i : i + 2] = [node(op, [order[i], order[i + 1]])]
    nodes.append(oh.make_node("Identity", [order[0]], ["y"]))
    dims = ["N", width] if rank == 2 else ["N", "S", width]
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, dims)
    outputs = [oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
               for name in ("y", *extra)]  # fmt: skip
    graph = oh.make_graph(nodes, "sums", [x], outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_fuzz_parallel_matmuls() -> None:
    check_range(random_sums, range(24), PASSES, "fuse-parallel-matmuls")


@pytest.mark.slow
def test_fuzz_parallel_matmuls_many() -> None:
    check_range(random_sums, range(24, 600), PASSES, "fuse-parallel-matmuls")
