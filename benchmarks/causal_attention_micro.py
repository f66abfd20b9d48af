"""Kernel micro-benchmark: causal self-attention with all its heads (GPT-2) on ORT CPU, three ways.

    python benchmarks/causal_attention_micro.py --sequence 128 [--rounds 50] [--denormals-are-zero]

Twelve layers of GPT-2-small's shape (hidden 768, 12 heads of 64), each ``x + attention(x)``, with
a [1, 1, S, S] causal mask of float32's lowest value (what transformers builds), timed interleaved
(a fresh random order each round, process CPU time, 2 threads, spinning off):

- ``attention``: com.microsoft.Attention(x, W_qkv, b_qkv, attention_bias=mask): what
  fuse-packed-attention makes, the Q/K/V projection inside the op;
- ``gqa``: MatMul + Add (the projection) and GroupQueryAttention(packed QKV, causal=1,
  kv_num_heads = num_heads, attention_bias=mask) with no fix-up for fully masked rows;
- ``gqa-fixup``: as ``gqa`` plus the fix-up fuse-group-query-attention writes: V's mean over the
  keys as a MatMul by a row of 1/T, sliced off the packed projection, and a Where on row flags;
- ``gqa-reducemean``: the same fix-up with ReduceMean over axis 1 instead of the MatMul.

Printed: each variant's median CPU ms and the median per-round ratio against ``attention`` (> 1:
faster). ``--denormals-are-zero`` sets ORT's ``session.set_denormal_as_zero``: the masked
probabilities exp(-88 or less) are denormal floats, which is what makes the masked kernels slow.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gqa_inputs import gqa_lengths

MS = "com.microsoft"
VARIANTS = ("attention", "gqa", "gqa-fixup", "gqa-reducemean")
D, HEADS, LAYERS = 768, 12, 12


def build(variant: str, S: int) -> bytes:
    rng = np.random.default_rng(0)
    inputs = [
        h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", D]),
        h.make_tensor_value_info("mask", TP.FLOAT, ["B", 1, "S", "S"]),
    ]
    init: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    if variant != "attention":
        inputs += [
            h.make_tensor_value_info("flags", TP.BOOL, ["B", "S", 1]),
            h.make_tensor_value_info("row", TP.FLOAT, [1, 1, "S"]),
        ]
        lengths, constants = gqa_lengths("x")
        init += [
            *constants,
            nh.from_array(np.array([1], np.int64), "axis1"),
            nh.from_array(np.array([2 * D], np.int64), "v_start"),
            nh.from_array(np.array([3 * D], np.int64), "v_end"),
            nh.from_array(np.array([2], np.int64), "last_axis"),
        ]
        nodes += lengths
    x = "x"
    for layer in range(LAYERS):
        w, b = f"w{layer}", f"b{layer}"
        init += [
            nh.from_array((rng.standard_normal((D, 3 * D)) * 0.03).astype(np.float32), w),
            nh.from_array((rng.standard_normal(3 * D) * 0.1).astype(np.float32), b),
        ]
        y = f"a{layer}"
        if variant == "attention":
            nodes.append(
                h.make_node("Attention", [x, w, b, "", "", "mask"], [y], domain=MS, num_heads=HEADS)
            )
        else:
            qkv = f"qkv{layer}"
            nodes += [
                h.make_node("MatMul", [x, w], [f"xw{layer}"]),
                h.make_node("Add", [f"xw{layer}", b], [qkv]),
                h.make_node(
                    "GroupQueryAttention",
                    [qkv, "", "", "", "", "seqlens_k", "total", "", "", "", "mask"],
                    [y],
                    domain=MS,
                    num_heads=HEADS,
                    kv_num_heads=HEADS,
                ),
            ]
            if variant != "gqa":
                mean = f"mean{layer}"
                if variant == "gqa-fixup":
                    nodes.append(h.make_node("MatMul", ["row", qkv], [mean]))
                else:
                    nodes.append(h.make_node("ReduceMean", [qkv, "axis1"], [mean], keepdims=1))
                nodes += [
                    h.make_node("Slice", [mean, "v_start", "v_end", "last_axis"], [f"vm{layer}"]),
                    h.make_node("Where", ["flags", f"vm{layer}", y], [f"fixed{layer}"]),
                ]
                y = f"fixed{layer}"
        nodes.append(h.make_node("Sum", [y, x], [f"r{layer}"]))
        x = f"r{layer}"
    graph = h.make_graph(
        nodes, variant, inputs, [h.make_tensor_value_info(x, TP.FLOAT, None)], init
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(MS, 1)])
    return model.SerializeToString()


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--denormals-are-zero", action="store_true")
    args = parser.parse_args()
    S = args.sequence
    variants = args.variants.split(",")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if args.denormals_are_zero:
        options.add_session_config_entry("session.set_denormal_as_zero", "1")
    sessions = {
        v: ort.InferenceSession(build(v, S), options, providers=["CPUExecutionProvider"])
        for v in variants
    }
    rng = np.random.default_rng(1)
    feeds = {
        "x": (rng.standard_normal((1, S, D)) * 0.1).astype(np.float32),
        "mask": np.triu(np.full((S, S), np.finfo(np.float32).min, np.float32), 1)[None, None],
        "flags": np.zeros((1, S, 1), bool),
        "row": np.full((1, 1, S), 1.0 / S, np.float32),
    }
    used = {v: {i.name: feeds[i.name] for i in s.get_inputs()} for v, s in sessions.items()}
    outputs = {v: sessions[v].run(None, used[v])[0] for v in variants}
    for v in variants[1:]:
        np.testing.assert_allclose(outputs[v], outputs[variants[0]], rtol=1e-4, atol=1e-4)
    times: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for v in order:
            start = time.process_time()
            sessions[v].run(None, used[v])
            times[v].append(time.process_time() - start)
    base = times[variants[0]]
    print(f"| variant (S={S}) | CPU ms | vs {variants[0]} |")
    print("|---|---:|---:|")
    for v in variants:
        ratio = statistics.median(a / b for a, b in zip(base, times[v], strict=True))
        print(f"| {v} | {statistics.median(times[v]) * 1e3:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
