"""Kernel micro-benchmark: one decomposed SDPA block (as exported) vs com.microsoft.MultiHeadAttention.

nice python benchmarks/attention_kernel_micro.py 128   # sequence length; B=1, 12 heads of 64
"""

import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

B, S, H, d = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 128, 12, 64
D = H * d


def vi(n, s):
    return h.make_tensor_value_info(n, TP.FLOAT, s)


inputs = [vi("q", [B, S, D]), vi("k", [B, S, D]), vi("v", [B, S, D]), vi("bias", [B, 1, S, S])]
init = [
    nh.from_array(np.array([0, 0, H, d], np.int64), "hs"),
    nh.from_array(np.array([0, 0, D], np.int64), "ms"),
    nh.from_array(np.array(d**-0.25, np.float32), "sc"),
    nh.from_array(np.array(0, np.float32), "z"),
]
nodes = [
    h.make_node("Reshape", ["q", "hs"], ["qr"]),
    h.make_node("Transpose", ["qr"], ["q4"], perm=[0, 2, 1, 3]),
    h.make_node("Reshape", ["k", "hs"], ["kr"]),
    h.make_node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
    h.make_node("Reshape", ["v", "hs"], ["vr"]),
    h.make_node("Transpose", ["vr"], ["v4"], perm=[0, 2, 1, 3]),
    h.make_node("Mul", ["q4", "sc"], ["qs"]),
    h.make_node("Mul", ["kt", "sc"], ["ks"]),
    h.make_node("MatMul", ["qs", "ks"], ["s"]),
    h.make_node("Add", ["s", "bias"], ["sb"]),
    h.make_node("Softmax", ["sb"], ["p"], axis=-1),
    h.make_node("IsNaN", ["p"], ["n"]),
    h.make_node("Where", ["n", "z", "p"], ["pc"]),
    h.make_node("MatMul", ["pc", "v4"], ["o4"]),
    h.make_node("Transpose", ["o4"], ["ot"], perm=[0, 2, 1, 3]),
    h.make_node("Reshape", ["ot", "ms"], ["y"]),
]
m1 = h.make_model(
    h.make_graph(nodes, "a", inputs, [vi("y", None)], init), opset_imports=[h.make_opsetid("", 17)]
)
n2 = [
    h.make_node(
        "MultiHeadAttention",
        ["q", "k", "v", "", "", "bias"],
        ["m"],
        domain="com.microsoft",
        num_heads=H,
    ),
    h.make_node("IsNaN", ["m"], ["n2"]),
    h.make_node("Where", ["n2", "z", "m"], ["y"]),
]
m2 = h.make_model(
    h.make_graph(n2, "b", inputs, [vi("y", None)], init[3:]),
    opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
)


def sess(m):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


s1, s2 = sess(m1), sess(m2)
r = np.random.default_rng(0)
f = {n: r.standard_normal((B, S, D)).astype(np.float32) for n in "qkv"}
f["bias"] = np.zeros((B, 1, S, S), np.float32)
a = s1.run(None, f)[0]
b = s2.run(None, f)[0]
print("maxdiff", np.abs(a - b).max())
t1 = []
t2 = []
for _i in range(300):
    x = time.perf_counter()
    s1.run(None, f)
    t1.append(time.perf_counter() - x)
    x = time.perf_counter()
    s2.run(None, f)
    t2.append(time.perf_counter() - x)
print(
    f"S={S} decomposed {statistics.median(t1) * 1e3:.2f} ms  mha {statistics.median(t2) * 1e3:.2f} ms  ratio {statistics.median([x / y for x, y in zip(t1, t2, strict=False)]):.3f}"
)
