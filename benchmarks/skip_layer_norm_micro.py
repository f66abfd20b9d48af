"""Kernel micro-benchmark: Add + LayerNormalization vs com.microsoft.SkipLayerNormalization on ORT CPU.

nice python benchmarks/skip_layer_norm_micro.py
"""

import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

S, D = 128, 768


def vi(n, s):
    return h.make_tensor_value_info(n, TP.FLOAT, s)


init = [nh.from_array(np.ones(D, np.float32), "g"), nh.from_array(np.zeros(D, np.float32), "b")]
m1 = h.make_model(
    h.make_graph(
        [
            h.make_node("Add", ["x", "r"], ["a"]),
            h.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1, epsilon=1e-12),
        ],
        "a",
        [vi("x", [1, S, D]), vi("r", [1, S, D])],
        [vi("y", [1, S, D])],
        init,
    ),
    opset_imports=[h.make_opsetid("", 17)],
)
m2 = h.make_model(
    h.make_graph(
        [
            h.make_node(
                "SkipLayerNormalization",
                ["x", "r", "g", "b"],
                ["y"],
                domain="com.microsoft",
                epsilon=1e-12,
            )
        ],
        "b",
        [vi("x", [1, S, D]), vi("r", [1, S, D])],
        [vi("y", [1, S, D])],
        init,
    ),
    opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
)


def sess(m, level):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.graph_optimization_level = level
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


ss = {
    "add+ln(noopt)": sess(m1, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    "skipln": sess(m2, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
}
f = {
    "x": np.random.randn(1, S, D).astype(np.float32),
    "r": np.random.randn(1, S, D).astype(np.float32),
}
T = {k: [] for k in ss}
for _i in range(300):
    for k, s in ss.items():
        t = time.perf_counter()
        s.run(None, f)
        T[k].append(time.perf_counter() - t)
for k in T:
    print(k, f"{statistics.median(T[k]) * 1e6:.0f} us")
