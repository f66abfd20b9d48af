"""Kernel micro-benchmark: the exported rotate-half RoPE chain vs com.microsoft.RotaryEmbedding, ORT CPU.

Both at ORT_ENABLE_ALL, 2 intra-op threads, timed interleaved by process CPU time (steady on a busy
machine); x is [1, N, S, 64] as in the zoo's LLaMA (N = 9 query / 3 key heads). In a model the
cos/sin tables are computed once and shared by every layer, so they are inputs here: what is timed is
the per-layer work (7 ops vs 1).

``--rotary-dim R`` (R < 64): partial rotary as Phi / GPT-NeoX / StableLM export it, only x[..., :R]
rotates: the chain gains the two Slices of x and the Concat that puts x[..., R:] back (10 ops),
the fused op gets ``rotary_embedding_dim=R, num_heads=N`` and [S, R/2] caches.

nice python benchmarks/rotary_micro.py [--rotary-dim 32]
"""

import argparse
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


def chain(n, s, r=H):
    """y = x * cos + Concat(-x2, x1) * sin, with cos/sin [1, 1, S, r] given (r < H: on x[..., :r],
    then Concat with x[..., r:])."""
    ints = {"half": [r // 2], "zero": [0], "big": [2**63 - 1], "axis": [3], "one": [1], "r": [r]}
    init = [nh.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    x = "x" if r == H else "xr"
    nodes = [
        h.make_node("Mul", [x, "c"], ["xc"]),
        h.make_node("Slice", [x, "zero", "half", "axis", "one"], ["x1"]),
        h.make_node("Slice", [x, "half", "big", "axis", "one"], ["x2"]),
        h.make_node("Neg", ["x2"], ["nx2"]),
        h.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
        h.make_node("Mul", ["rot", "s"], ["rs"]),
        h.make_node("Add", ["xc", "rs"], ["y" if r == H else "yr"]),
    ]
    if r < H:
        nodes[:0] = [
            h.make_node("Slice", ["x", "zero", "r", "axis", "one"], ["xr"]),
            h.make_node("Slice", ["x", "r", "big", "axis", "one"], ["xp"]),
        ]
        nodes.append(h.make_node("Concat", ["yr", "xp"], ["y"], axis=-1))
    inputs = [vi("x", [1, n, s, H]), vi("c", [1, 1, s, r]), vi("s", [1, 1, s, r])]
    graph = h.make_graph(nodes, "chain", inputs, [vi("y", None)], init)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 20)])


def fused(n, s, r=H):
    init = [nh.from_array(np.array([0], np.int64), "pos")]
    partial = {"rotary_embedding_dim": r, "num_heads": n} if r < H else {}
    node = h.make_node(
        "RotaryEmbedding",
        ["x", "pos", "c", "s"],
        ["y"],
        domain="com.microsoft",
        interleaved=0,
        **partial,
    )
    inputs = [vi("x", [1, n, s, H]), vi("c", [s, r // 2]), vi("s", [s, r // 2])]
    graph = h.make_graph([node], "fused", inputs, [vi("y", None)], init)
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rotary-dim", type=int, default=H, help=f"rotated dims (even, <= {H})")
    r = parser.parse_args().rotary_dim
    rng = np.random.default_rng(0)
    print(f"head {H}, rotary dim {r}")
    print("N    S   chain us  fused us  speed-up")
    for n, s in ((9, 128), (3, 128), (9, 512), (9, 1)):
        angles = (np.arange(s)[:, None] * rng.random(r // 2)).astype(np.float32)
        cos, sin = np.cos(angles), np.sin(angles)
        x = rng.standard_normal((1, n, s, H)).astype(np.float32)
        table = {
            "c": np.concatenate([cos, cos], -1)[None, None],
            "s": np.concatenate([sin, sin], -1)[None, None],
        }
        feeds = {"chain": {"x": x, **table}, "fused": {"x": x, "c": cos, "s": sin}}
        sessions = {"chain": session(chain(n, s, r)), "fused": session(fused(n, s, r))}
        outs = [sess.run(None, feeds[k])[0] for k, sess in sessions.items()]
        assert np.allclose(outs[0], outs[1], atol=1e-5)
        times = {k: [] for k in sessions}
        for _ in range(3000):
            for k, sess in sessions.items():
                t = time.process_time_ns()
                sess.run(None, feeds[k])
                times[k].append(time.process_time_ns() - t)
        a, b = (statistics.median(times[k]) / 1e3 for k in ("chain", "fused"))
        ratios = sorted(x / y for x, y in zip(times["chain"], times["fused"], strict=True))
        print(f"{n:<3} {s:<4} {a:8.1f} {b:9.1f}  {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
