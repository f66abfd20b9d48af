"""Kernel micro-benchmark: ways to run one attention layer's QKV projection + attention on ORT CPU.

    nice python benchmarks/attention_layouts_micro.py --sequence 128 --hidden 768 --heads 12

Variants (all with the same additive mask [B, 1, S, S] as attention_bias, or with ``--no-mask``
none, as ViT and Whisper's encoder have; the same scale):

- ``split``:   MatMul(x, Wqkv) + Split + MultiHeadAttention(q, k, v)   (what fuse-attention +
               merge-qkv-projections emit)
- ``three``:   three MatMuls + MultiHeadAttention(q, k, v)             (no QKV merge)
- ``packed``:  MatMul(x, Wqkv in [D, H, 3, d] column order) + Reshape [B, S, H, 3, d] +
               MultiHeadAttention(packed QKV): ORT 1.32 says "not implemented for CPU"
- ``attention``: com.microsoft.Attention(x, Wqkv, bias, attention_bias=mask): one op, weight prepacked

Each is a one-layer model timed interleaved (random order each round, process CPU time); reported
are medians and the median paired ratio against ``split`` (> 1: faster than ``split``).
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


def build(variant: str, S: int, D: int, H: int, bias_zero: bool, mask: bool = True) -> bytes:
    d = D // H
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((D, D)).astype(np.float32) * 0.05 for _ in range(3)]
    b = [
        (np.zeros(D) if bias_zero else rng.standard_normal(D) * 0.1).astype(np.float32)
        for _ in range(3)
    ]
    inputs = [h.make_tensor_value_info("x", TP.FLOAT, [1, S, D])]
    if mask:
        inputs.append(h.make_tensor_value_info("mask", TP.FLOAT, [1, 1, S, S]))
    tail = ["", "", "mask"] if mask else []
    init: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    scale = float(d**-0.5)
    if variant in ("split", "three"):
        if variant == "split":
            init += [
                nh.from_array(np.concatenate(w, 1), "w"),
                nh.from_array(np.concatenate(b), "b"),
                nh.from_array(np.array([D, D, D], np.int64), "sizes"),
            ]
            nodes += [
                h.make_node("MatMul", ["x", "w"], ["xw"]),
                h.make_node("Add", ["xw", "b"], ["xwb"]),
                h.make_node("Split", ["xwb", "sizes"], ["q", "k", "v"], axis=-1),
            ]
        else:
            for name, wi, bi in zip("qkv", w, b, strict=True):
                init += [nh.from_array(wi, f"w{name}"), nh.from_array(bi, f"b{name}")]
                nodes += [
                    h.make_node("MatMul", ["x", f"w{name}"], [f"{name}m"]),
                    h.make_node("Add", [f"{name}m", f"b{name}"], [name]),
                ]
        nodes.append(
            h.make_node(
                "MultiHeadAttention",
                ["q", "k", "v", *tail],
                ["y"],
                domain=MS,
                num_heads=H,
                scale=scale,
            )
        )
    elif variant == "packed":
        # columns ordered (head, q/k/v, d) so that the product reshapes to [B, S, H, 3, d]
        stacked = np.stack([wi.reshape(D, H, d) for wi in w], axis=2).reshape(D, 3 * D)
        bias = np.stack([bi.reshape(H, d) for bi in b], axis=1).reshape(3 * D)
        init += [
            nh.from_array(stacked, "w"),
            nh.from_array(bias, "b"),
            nh.from_array(np.array([0, 0, H, 3, d], np.int64), "shape"),
        ]
        nodes += [
            h.make_node("MatMul", ["x", "w"], ["xw"]),
            h.make_node("Add", ["xw", "b"], ["xwb"]),
            h.make_node("Reshape", ["xwb", "shape"], ["qkv"]),
            h.make_node(
                "MultiHeadAttention",
                ["qkv", "", "", *tail],
                ["y"],
                domain=MS,
                num_heads=H,
                scale=scale,
            ),
        ]
    elif variant in ("gqa", "gqa-packed"):
        # GroupQueryAttention with kv_num_heads == num_heads and causal=0: MHA's math (the mask
        # alone decides); seqlens_k / total_sequence_length read from the input's shape.
        lengths, constants = gqa_lengths("x")
        init += constants
        nodes += lengths
        if variant == "gqa":
            for name, wi, bi in zip("qkv", w, b, strict=True):
                init += [nh.from_array(wi, f"w{name}"), nh.from_array(bi, f"b{name}")]
                nodes += [
                    h.make_node("MatMul", ["x", f"w{name}"], [f"{name}m"]),
                    h.make_node("Add", [f"{name}m", f"b{name}"], [name]),
                ]
            qkv = ["q", "k", "v"]
        else:
            init += [
                nh.from_array(np.concatenate(w, 1), "w"),
                nh.from_array(np.concatenate(b), "b"),
            ]
            nodes += [
                h.make_node("MatMul", ["x", "w"], ["xw"]),
                h.make_node("Add", ["xw", "b"], ["xwb"]),
            ]
            qkv = ["xwb", "", ""]
        nodes.append(
            h.make_node(
                "GroupQueryAttention",
                [*qkv, "", "", "seqlens_k", "total", "", "", "", "mask" if mask else ""],
                ["y"],
                domain=MS,
                num_heads=H,
                kv_num_heads=H,
                scale=scale,
                causal=0,
            )
        )
    elif variant == "attention":
        init += [nh.from_array(np.concatenate(w, 1), "w"), nh.from_array(np.concatenate(b), "b")]
        nodes.append(
            h.make_node(
                "Attention",
                ["x", "w", "b", *tail],
                ["y"],
                domain=MS,
                num_heads=H,
                scale=scale,
            )
        )
    else:
        raise ValueError(variant)
    graph = h.make_graph(
        nodes, variant, inputs, [h.make_tensor_value_info("y", TP.FLOAT, None)], init
    )
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=9
    )
    return model.SerializeToString()


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser()
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--variants", default="split,three,attention")
    parser.add_argument("--zero-bias", action="store_true", help="projection biases of zero")
    parser.add_argument("--no-mask", action="store_true", help="no attention_bias (ViT, Whisper)")
    args = parser.parse_args()
    S, D, H = args.sequence, args.hidden, args.heads
    variants = args.variants.split(",")
    rng = np.random.default_rng(1)
    mask = np.zeros((1, 1, S, S), np.float32)
    mask[..., S - S // 8 :] = np.finfo(np.float32).min  # some padded keys
    feeds = {"x": rng.standard_normal((1, S, D)).astype(np.float32)}
    if not args.no_mask:
        feeds["mask"] = mask
    sessions = {}
    for v in variants:
        o = ort.SessionOptions()
        o.intra_op_num_threads = args.threads
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[v] = ort.InferenceSession(
            build(v, S, D, H, args.zero_bias, mask=not args.no_mask),
            o,
            providers=["CPUExecutionProvider"],
        )
    outputs = {v: s.run(None, feeds)[0] for v, s in sessions.items()}
    for v in variants:
        diff = np.abs(outputs[v] - outputs[variants[0]]).max()
        print(f"{v}: max |diff| vs {variants[0]} {diff:.2e}")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(10):
        for s in sessions.values():
            s.run(None, feeds)
    for _ in range(args.rounds):
        order = variants[:]
        random.shuffle(order)
        for v in order:
            t = time.process_time()
            sessions[v].run(None, feeds)
            times[v].append(time.process_time() - t)
    base = variants[0]
    for v in variants:
        ratio = statistics.median(a / b for a, b in zip(times[base], times[v], strict=True))
        print(
            f"S={S} D={D} H={H}{' no mask' if args.no_mask else ''} {v:10s} median {statistics.median(times[v]) * 1e3:7.3f} ms  "
            f"{base}/{v} {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
