"""Seeded differential fuzzing of fuse-parallel-convs: random Conv branches of one input, summed.

Each seed builds two to four branches over one activation of spatial rank 1 or 2: Convs of random
kernel (odd, even, 1-wide, non-square), padding (symmetric, or any split that keeps the output
size), dilation, stride, group and bias, some a LoRA adapter (such a Conv down to one to three
channels, mostly of one group, then a 1x1 Conv back up), some followed by a BatchNormalization, and at stride 1
with as many output as input channels an identity branch (the input itself or a
BatchNormalization of it); sometimes a branch is read elsewhere too. The branches are summed in a
random order and association, some by Sub, some scaled first by a per-channel Mul. ONNX Runtime
must give the same outputs after fuse-parallel-convs and fuse-conv-bn, at two batch sizes, and a
second run must change nothing. Across the seeds both merges and refusals must occur (the
generator is not allowed to test only one side).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from tests._pass_fuzz import check_range

PASSES = ["infer-shapes", "fuse-parallel-convs", "fuse-conv-bn", "eliminate-dead-code"]


def _padding(rng: np.random.Generator, k: int, d: int, stride: int) -> tuple[int, int]:
    """Begin and end pads that give every branch the same output size."""
    room = d * (k - 1)
    if stride != 1:  # the same floor for every odd kernel: symmetric only
        return room // 2, room // 2
    begin = int(rng.integers(0, room + 1))
    return begin, room - begin


def random_branches(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(array: np.ndarray) -> str:
        name = f"c{len(inits)}"
        inits.append(onh.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def batch_norm(value: str, channels: int) -> str:
        stats = [rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.2, channels),
                 rng.normal(0, 0.2, channels), rng.uniform(0.5, 2, channels)]  # fmt: skip
        out = f"bn{len(nodes)}"
        nodes.append(oh.make_node("BatchNormalization", [value, *map(const, stats)], [out]))
        return out

    spatial = int(rng.choice([1, 2]))
    channels = int(rng.choice([2, 4]))
    stride = int(rng.choice([1, 1, 2]))
    identity = stride == 1 and rng.random() < 0.5
    out_channels = channels if identity or rng.random() < 0.5 else int(rng.choice([2, 6]))
    group = channels if out_channels == channels and rng.random() < 0.3 else 1
    dilation = int(rng.choice([1, 1, 2])) if stride == 1 else 1
    odd = [1, 3, 5] if stride != 1 else [1, 2, 3, 4, 5]
    summands = []
    for _ in range(int(rng.integers(1 if identity else 2, 4))):
        kernel = [int(rng.choice(odd)) for _ in range(spatial)]
        pads = [_padding(rng, k, dilation, stride) for k in kernel]
        adapter = rng.random() < 0.2  # a LoRA adapter: down to 1-3 channels, a 1x1 Conv back
        width = int(rng.integers(1, 4)) if adapter else out_channels
        groups = 1 if adapter and rng.random() < 0.8 else group
        width = width * groups if adapter else width
        weight = rng.normal(0, 0.4, (width, channels // groups, *kernel))
        inputs = ["x", const(weight)] + ([const(rng.normal(0, 0.2, width))]
                                          if rng.random() < 0.6 else [])  # fmt: skip
        out = f"conv{len(nodes)}"
        nodes.append(oh.make_node(
            "Conv", inputs, [out], group=groups, strides=[stride] * spatial,
            dilations=[dilation] * spatial, pads=[p[0] for p in pads] + [p[1] for p in pads],
        ))  # fmt: skip
        if adapter:
            up = const(rng.normal(0, 0.4, (out_channels, width, *(1,) * spatial)))
            inputs = [out, up] + ([const(rng.normal(0, 0.2, out_channels))]
                                  if rng.random() < 0.5 else [])  # fmt: skip
            out = f"up{len(nodes)}"
            nodes.append(oh.make_node("Conv", inputs, [out]))
        summands.append(batch_norm(out, out_channels) if rng.random() < 0.3 else out)
        if rng.random() < 0.2:  # a layer scale, per channel or one number
            shape = (out_channels, *(1,) * spatial) if rng.random() < 0.7 else ()
            scaled = f"mul{len(nodes)}"
            nodes.append(oh.make_node("Mul", [summands[-1], const(rng.uniform(0.2, 2, shape))],
                                      [scaled]))  # fmt: skip
            summands[-1] = scaled
    if identity:
        summands.append(batch_norm("x", channels) if rng.random() < 0.5 else "x")
    order = [summands[i] for i in rng.permutation(len(summands))]
    read_elsewhere = [name for name in order if name != "x"]
    extra = [str(rng.choice(read_elsewhere))] if rng.random() < 0.15 else []
    while len(order) > 1:
        i = int(rng.integers(0, len(order) - 1))
        out = f"sum{len(nodes)}"
        op = "Sub" if rng.random() < 0.3 else "Add"
        nodes.append(oh.make_node(op, [order[i], order[i + 1]], [out]))
        order[i : i + 2] = [out]
    nodes.append(oh.make_node("Relu", [order[0]], ["y"]))
    size = [int(rng.choice([5, 6, 7])) for _ in range(spatial)]
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", channels, *size])
    outputs = [oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
               for name in ("y", *extra)]  # fmt: skip
    graph = oh.make_graph(nodes, "branches", [x], outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_fuzz_parallel_convs() -> None:
    check_range(random_branches, range(24), PASSES, "fuse-parallel-convs")


@pytest.mark.slow
def test_fuzz_parallel_convs_many() -> None:
    check_range(random_branches, range(24, 600), PASSES, "fuse-parallel-convs")
