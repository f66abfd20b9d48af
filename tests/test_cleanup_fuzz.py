"""Seeded differential fuzzing of eliminate-noops + merge-consecutive-ops on random shape-op chains.

Each seed builds a chain of Transpose/Reshape/(Un)Squeeze/Slice/Concat/Cast/Expand/Pad/Tile and
x+0, x*1 style ops with random parameters (no-ops, mergeable pairs and near misses alike), in the
attribute forms (opsets 9 and 11) or the input forms (opsets 13 and 17), sometimes with a symbolic batch dim, then
checks on ONNX Runtime that the optimized model computes the same outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnxopt
from onnxopt.io import model_from_proto

PASSES = ["infer-shapes", "eliminate-noops", "merge-consecutive-ops", "eliminate-dead-code"]
INT64_MAX = 2**63 - 1
# No float16: ORT's CPU provider runs ops without fp16 kernels (Tile, Pad, Neg...) in float32 via
# casts it inserts even with optimizations off, so fp16 precision depends on the graph's shape.
FLOAT_TYPES = {1: np.float32, 11: np.float64}
INT_TYPES = {6: np.int32, 7: np.int64, 3: np.int8, 2: np.uint8}


class Chain:
    def __init__(self, rng: np.random.Generator, opset: int) -> None:
        self.rng = rng
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def negative_axes(self) -> bool:
        """Write an axis as negative now and then (allowed from opset 11)."""
        return self.opset >= 11 and self.rng.random() < 0.3

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.initializers.append(onh.from_array(np.asarray(array), name))
        return name

    def ints(self, values: list[int]) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def add(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name("v")
        self.nodes.append(oh.make_node(op, inputs, [out], **attrs))
        return out


def _axes(chain: Chain, op: str, value: str, axes: list[int]) -> str:
    if chain.opset >= 13:
        return chain.add(op, [value, chain.ints(axes)])
    return chain.add(op, [value], axes=axes)


KINDS = [
    "transpose",
    "reshape",
    "unsqueeze",
    "squeeze",
    "slice",
    "concat",
    "cast",
    "arith",
    "expand",
    "identity",
    "pad",
    "tile",
]


def step(chain: Chain, value: str, array: np.ndarray, kind: str) -> tuple[str, np.ndarray]:
    """Append one ``kind`` op; ``array`` is a zeros stand-in that tracks shape and dtype."""
    rng = chain.rng
    rank = array.ndim
    if kind == "squeeze" and 1 not in array.shape:
        kind = "unsqueeze"  # pair it with the Unsqueeze before, when there is one
    if kind == "transpose" and rank > 0:
        perm = list(range(rank)) if rng.random() < 0.3 else [int(p) for p in rng.permutation(rank)]
        return chain.add("Transpose", [value], perm=perm), np.transpose(array, perm)
    if kind == "reshape" and rank > 0:
        shape = list(array.shape)
        choice = rng.integers(3)
        if choice == 0:  # same shape written with 0s and a -1
            target = [0 if rng.random() < 0.5 else d for d in shape]
            target[int(rng.integers(rank))] = -1
        elif choice == 1 and rank > 1:  # merge two adjacent dims
            i = int(rng.integers(rank - 1))
            target = [*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :]]
        else:
            target = [1, *shape]
        out_shape = [
            d if t == 0 else t for t, d in zip(target, shape + [0] * len(target), strict=False)
        ]
        if -1 in target:
            known = int(np.prod([d for d in out_shape if d != -1]))
            out_shape[target.index(-1)] = array.size // known if known else 0
        return chain.add("Reshape", [value, chain.ints(target)]), array.reshape(out_shape)
    if kind == "unsqueeze" and rank < 5:
        count = int(rng.integers(1, 3))
        axes = sorted(int(a) for a in rng.choice(rank + count, size=count, replace=False))
        signed = [a - (rank + count) if chain.negative_axes() else a for a in axes]
        return _axes(chain, "Unsqueeze", value, signed), np.expand_dims(array, tuple(axes))
    if kind == "squeeze":
        ones = [i for i, d in enumerate(array.shape) if d == 1]
        if not ones:
            return value, array
        if rng.random() < 0.3:
            return chain.add("Squeeze", [value]), np.squeeze(array)
        axes = [ones[0]] if len(ones) == 1 or rng.random() < 0.5 else ones
        signed = [a - rank if chain.negative_axes() else a for a in axes]
        return _axes(chain, "Squeeze", value, signed), np.squeeze(array, tuple(axes))
    if kind == "slice" and rank > 0:
        axes = sorted(
            int(a) for a in rng.choice(rank, size=int(rng.integers(1, rank + 1)), replace=False)
        )
        starts, ends, steps = [], [], []
        index: list[slice] = [slice(None)] * rank
        for axis in axes:
            dim = array.shape[axis]
            start = 0 if rng.random() < 0.4 else int(rng.integers(-dim - 1, dim + 2))
            end = INT64_MAX if rng.random() < 0.4 else int(rng.integers(-dim - 1, dim + 2))
            stride = 1 if chain.opset < 10 or rng.random() < 0.6 else int(rng.integers(1, 3))
            starts.append(start)
            ends.append(end)
            steps.append(stride)
            index[axis] = slice(start, end, stride)
        sliced = array[tuple(index)]
        if sliced.size == 0:
            return value, array  # empty tensors make later Reshape -1 ambiguous
        if chain.opset < 10:
            return chain.add("Slice", [value], starts=starts, ends=ends, axes=axes), sliced
        inputs = [value, chain.ints(starts), chain.ints(ends), chain.ints(axes), chain.ints(steps)]
        return chain.add("Slice", inputs), sliced
    if kind == "concat" and rank > 0:
        axis = int(rng.integers(rank))
        if rng.random() < 0.3:
            return chain.add("Concat", [value], axis=axis), array
        inner = chain.add("Concat", [value, value], axis=axis)
        outer_axis = axis if rng.random() < 0.7 else int(rng.integers(rank))
        joined = np.concatenate([array, array], axis)
        if outer_axis != axis:  # a near miss: the inner Concat joins along another axis
            parts, out = [inner, inner], np.concatenate([joined, joined], outer_axis)
        elif rng.random() < 0.5:
            parts, out = [value, inner], np.concatenate([array, joined], axis)
        else:
            parts, out = [inner, value], np.concatenate([joined, array], axis)
        return chain.add(
            "Concat", parts, axis=outer_axis - rank if chain.negative_axes() else outer_axis
        ), out
    if kind == "cast":
        types = {**FLOAT_TYPES, **INT_TYPES}
        to = int(rng.choice(list(types)))
        if array.dtype.kind == "f" and to in INT_TYPES and to != 7:
            to = 7  # keep random-normal floats in range: int64 only
        return chain.add("Cast", [value], to=to), array.astype(types[to])
    if kind == "arith" and array.dtype.kind in "fi" and array.dtype != np.uint8:
        op = str(rng.choice(["Add", "Sub", "Mul", "Div"]))
        neutral = 0 if op in ("Add", "Sub") else 1
        if array.dtype.kind == "i" and op == "Div":
            op = "Mul"
            neutral = 1
        shape = [
            d if rng.random() < 0.6 else 1
            for d in array.shape[rank - int(rng.integers(rank + 1)) :]
        ]
        if rng.random() < 0.2:
            shape = [2, *[1] * (rank - len(shape)), *shape]  # enlarges: not a no-op
        constant = np.full(shape, neutral if rng.random() < 0.85 else 2, dtype=array.dtype)
        inputs = [value, chain.const(constant)]
        if op in ("Add", "Mul") and rng.random() < 0.5:
            inputs.reverse()
        return chain.add(op, inputs), array + np.zeros(shape, dtype=array.dtype)
    if kind == "expand":
        shape = [d if rng.random() < 0.6 else 1 for d in array.shape]
        if rng.random() < 0.3:
            shape = [2, *shape]
        return chain.add("Expand", [value, chain.ints(shape)]), array * np.ones(
            shape, dtype=array.dtype
        )
    if kind == "identity":
        return chain.add(str(rng.choice(["Identity", "Dropout"])), [value]), array
    if kind == "pad" and rank > 0:
        pads = (
            [int(p) for p in rng.integers(0, 2, size=2 * rank)]
            if rng.random() < 0.5
            else [0] * 2 * rank
        )
        padded = np.pad(array, list(zip(pads[:rank], pads[rank:], strict=True)))
        if chain.opset < 11:
            return chain.add("Pad", [value], pads=pads), padded
        return chain.add("Pad", [value, chain.ints(pads)]), padded
    if kind == "tile" and rank > 0:
        repeats = [1 if rng.random() < 0.8 else 2 for _ in range(rank)]
        return chain.add("Tile", [value, chain.ints(repeats)]), np.tile(array, repeats)
    return value, array


def random_model(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    opset = int(rng.choice([9, 11, 13, 17]))
    chain = Chain(rng, opset)
    x_shape = [int(d) for d in rng.integers(1, 4, size=int(rng.integers(1, 4)))]
    dynamic = rng.random() < 0.3
    array = np.zeros(x_shape, dtype=np.float32)
    value = "x"
    outputs: list[tuple[str, np.ndarray]] = []
    kind = ""
    for _ in range(int(rng.integers(3, 9))):
        # Repeating the previous kind often makes the consecutive pairs the merges look for.
        kind = kind if kind and rng.random() < 0.4 else str(rng.choice(KINDS))
        value, array = step(chain, value, array, kind)
        if array.size > 4096:
            break
        if rng.random() < 0.15 and value != "x":
            outputs.append((value, array))
    if value == "x":
        value = chain.add("Relu", [value])
    outputs.append((value, array))
    infos = {}
    for name, out in outputs:
        dtype = onnx.helper.np_dtype_to_tensor_dtype(out.dtype)
        infos.setdefault(name, oh.make_tensor_value_info(name, dtype, None))
    x_dims: list[int | str] = ["N", *x_shape[1:]] if dynamic else list(x_shape)
    x_info = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_dims)
    graph = oh.make_graph(chain.nodes, "fuzz", [x_info], list(infos.values()), chain.initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)


def check_seed(seed: int) -> None:
    proto = random_model(seed)
    original = model_from_proto(proto)
    try:
        result = onnxopt.optimize(original, passes=PASSES)
    except onnxopt.validate.CannotValidate:
        return  # the random chain is not valid for every size of a dynamic dim
    assert result.report.validation is not None
    assert result.report.validation.passed, (
        seed,
        result.report.validation,
        onnx.printer.to_text(proto),
    )


@pytest.mark.parametrize("seed", range(12))
def test_fuzz_cleanup_passes(seed: int) -> None:
    check_seed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12, 600))
def test_fuzz_cleanup_passes_many(seed: int) -> None:
    check_seed(seed)
