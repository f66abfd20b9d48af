"""Kernel micro-benchmark: the exported rotate-half RoPE chain vs com.microsoft.RotaryEmbedding, ORT CPU.

Both at ORT_ENABLE_ALL, 2 intra-op threads, timed interleaved by process CPU time (steady on a busy
machine); x is [1, N, S, 64] as in the zoo's LLaMA (N = 9 query / 3 key heads).

nice python benchmarks/rotary_micro.py
"""

import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

H = 64


def vi(name, shape):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def chain(n, s):
    """y = x * cos + Concat(-x2, x1) * sin, with cos/sin [1, 1, S, H] computed from the angles f."""
    ints = {
        "half": [H // 2],
        "zero": [0],
        "big": [2**63 - 1],
        "axis": [3],
        "one": [1],
    }
    init = [nh.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    nodes = [
        h.make_node("Concat", ["f", "f"], ["ff"], axis=-1),
        h.make_node("Cos", ["ff"], ["c3"]),
        h.make_node("Sin", ["ff"], ["s3"]),
        h.make_node("Unsqueeze", ["c3", "one"], ["c"]),
        h.make_node("Unsqueeze", ["s3", "one"], ["s"]),
        h.make_node("Mul", ["x", "c"], ["xc"]),
        h.make_node("Slice", ["x", "zero", "half", "axis", "one"], ["x1"]),
        h.make_node("Slice", ["x", "half", "big", "axis", "one"], ["x2"]),
        h.make_node("Neg", ["x2"], ["nx2"]),
        h.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
        h.make_node("Mul", ["rot", "s"], ["rs"]),
        h.make_node("Add", ["xc", "rs"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "chain", [vi("x", [1, n, s, H]), vi("f", [1, s, H // 2])], [vi("y", None)], init
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 20)])


def fused(n, s):
    init = [
        nh.from_array(np.array([0], np.int64), "pos"),
        nh.from_array(np.array([-1, H // 2], np.int64), "shape"),
    ]
    nodes = [
        h.make_node("Reshape", ["f", "shape"], ["f2"]),
        h.make_node("Cos", ["f2"], ["c"]),
        h.make_node("Sin", ["f2"], ["s"]),
        h.make_node(
            "RotaryEmbedding", ["x", "pos", "c", "s"], ["y"], domain="com.microsoft", interleaved=0
        ),
    ]
    graph = h.make_graph(
        nodes, "fused", [vi("x", [1, n, s, H]), vi("f", [1, s, H // 2])], [vi("y", None)], init
    )
    return h.make_model(
        graph, opset_imports=[h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)]
    )


def session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def main() -> None:
    rng = np.random.default_rng(0)
    print("N    S   chain us  fused us  speed-up")
    for n, s in ((9, 128), (3, 128), (9, 512), (9, 1)):
        feeds = {
            "x": rng.standard_normal((1, n, s, H)).astype(np.float32),
            "f": (np.arange(s)[None, :, None] * rng.random(H // 2)).astype(np.float32),
        }
        sessions = {"chain": session(chain(n, s)), "fused": session(fused(n, s))}
        outs = [sess.run(None, feeds)[0] for sess in sessions.values()]
        assert np.allclose(outs[0], outs[1], atol=1e-5)
        times = {k: [] for k in sessions}
        for _ in range(3000):
            for k, sess in sessions.items():
                t = time.process_time_ns()
                sess.run(None, feeds)
                times[k].append(time.process_time_ns() - t)
        a, b = (statistics.median(times[k]) / 1e3 for k in ("chain", "fused"))
        ratios = sorted(x / y for x, y in zip(times["chain"], times["fused"], strict=True))
        print(f"{n:<3} {s:<4} {a:8.1f} {b:9.1f}  {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
