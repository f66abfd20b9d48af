"""Kernel micro-benchmark: one LLaMA layer's grouped-query attention on ORT CPU, four ways.

    nice python benchmarks/gqa_micro.py --sequence 128 --rounds 300
    nice python benchmarks/gqa_micro.py --sequence 512 --rounds 100

The inputs are what the -O2 graph of the LLaMA export holds at the attention (after rotary):
``q`` [B, S, H*d] (MultiHeadAttention's query), ``k`` [B, Nkv, S, d] (RotaryEmbedding's output),
``v`` [B, S, Nkv*d] (the V projection) and the additive causal + padding mask [B, 1, S, S].

- ``mha``:  what fuse-attention emits today: V split into heads, K and V repeated to H heads
            (Unsqueeze + Expand + Reshape each, the exporter's repeat_kv), MultiHeadAttention.
- ``gqa``:  com.microsoft.GroupQueryAttention(q, k, v, seqlens_k, total_sequence_length,
            attention_bias=mask) with ``causal=0``: the mask alone decides (exactly MHA's math);
            K moved to [B, S, Nkv*d] (Transpose + Reshape), seqlens_k / total_sequence_length
            read from K's shape at run time.
- ``gqa-causal``: the same with ``causal=1`` (the op skips keys after the query): differs from
            the export on fully masked (left-padding) rows, where the export averages every V row.
- ``gqa-causal-fixed``: ``gqa-causal`` plus the fix-up fuse-group-query-attention emits for a
            provably causal mask: rows whose mask is all "masked" get the mean of V (per head).

Numerics are checked against ``mha`` on random inputs with left padding and fully masked rows
(batch 3, one sequence all padding). Timing: B=1, no padding, interleaved rounds in a random order
per round, process CPU time and wall time; medians and the median paired ratio t(mha)/t(variant).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gqa_inputs import gqa_lengths

MS = "com.microsoft"
LOWEST = float(np.finfo(np.float32).min)


def build(variant: str, H: int, Nkv: int, d: int) -> bytes:
    inputs = [
        h.make_tensor_value_info("q", TP.FLOAT, ["B", "S", H * d]),
        h.make_tensor_value_info("k", TP.FLOAT, ["B", Nkv, "S", d]),
        h.make_tensor_value_info("v", TP.FLOAT, ["B", "S", Nkv * d]),
        h.make_tensor_value_info("mask", TP.FLOAT, ["B", 1, "S", "S"]),
    ]
    rep = H // Nkv
    init = [
        nh.from_array(np.array([0, 0, Nkv, d], np.int64), "heads_kv"),
        nh.from_array(np.array([0, 0, -1], np.int64), "merge"),
        nh.from_array(np.array([2], np.int64), "axis2"),
        nh.from_array(np.array([3], np.int64), "axis3"),
        nh.from_array(np.array([1, 1, rep, 1, 1], np.int64), "rep"),
        nh.from_array(np.array([0, H, -1, d], np.int64), "heads_q"),
        nh.from_array(np.array([1], np.int32), "one32"),
        nh.from_array(np.array([0, 1, Nkv, 1, d], np.int64), "kv5"),
        nh.from_array(np.array([1, 1, 1, rep, 1], np.int64), "rep5"),
        nh.from_array(np.array([0, 1, H, d], np.int64), "heads1"),
        nh.from_array(np.array([0, 0, H, d], np.int64), "heads_out"),
        nh.from_array(np.array([0, 0, -1], np.int64), "merge_out"),
        nh.from_array(np.array(-1e30, np.float32), "floor"),
    ]
    scale = float(d**-0.5)
    if variant == "mha":
        nodes = [
            h.make_node("Reshape", ["v", "heads_kv"], ["vr"]),
            h.make_node("Transpose", ["vr"], ["v4"], perm=[0, 2, 1, 3]),
        ]
        for name in ("k", "v4"):
            nodes += [
                h.make_node("Unsqueeze", [name, "axis2"], [f"{name}_u"]),
                h.make_node("Expand", [f"{name}_u", "rep"], [f"{name}_e"]),
                h.make_node("Reshape", [f"{name}_e", "heads_q"], [f"{name}_h"]),
            ]
        nodes.append(
            h.make_node(
                "MultiHeadAttention",
                ["q", "k_h", "v4_h", "", "", "mask"],
                ["y"],
                domain=MS,
                num_heads=H,
                scale=scale,
            )
        )
    else:
        nodes = [
            h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
            h.make_node("Reshape", ["kt", "merge"], ["k3"]),
            *gqa_lengths("k3")[0],  # its constant "one32" is among the initializers
            h.make_node(
                "GroupQueryAttention",
                ["q", "k3", "v", "", "", "seqlens_k", "total", "", "", "", "mask"],
                ["y"],
                domain=MS,
                num_heads=H,
                kv_num_heads=Nkv,
                scale=scale,
                causal=1 if variant.startswith("gqa-causal") else 0,
            ),
        ]
        if variant == "gqa-causal-fixed":
            nodes[-1].output[0] = "g"
            nodes += [
                h.make_node("ReduceMax", ["mask"], ["rowmax"], axes=[3], keepdims=0),
                h.make_node("Less", ["rowmax", "floor"], ["masked"]),  # [B, h, S]
                h.make_node("Transpose", ["masked"], ["masked_t"], perm=[0, 2, 1]),
                h.make_node("Unsqueeze", ["masked_t", "axis3"], ["masked4"]),  # [B, S, h, 1]
                h.make_node("ReduceMean", ["v"], ["vmean"], axes=[1], keepdims=1),
                h.make_node("Reshape", ["vmean", "kv5"], ["vm5"]),
                h.make_node("Expand", ["vm5", "rep5"], ["vm5e"]),
                h.make_node("Reshape", ["vm5e", "heads1"], ["vm4"]),  # [B, 1, H, d]
                h.make_node("Reshape", ["g", "heads_out"], ["g4"]),
                h.make_node("Where", ["masked4", "vm4", "g4"], ["y4"]),
                h.make_node("Reshape", ["y4", "merge_out"], ["y"]),
            ]
    graph = h.make_graph(
        nodes, variant, inputs, [h.make_tensor_value_info("y", TP.FLOAT, None)], init
    )
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8
    )
    return model.SerializeToString()


def session(blob: bytes, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def feeds(B: int, S: int, H: int, Nkv: int, d: int, seed: int, pad: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keep = np.ones((B, S), bool)
    if pad:
        keep[-1, : S // 2] = False  # left padding
        if B > 2:
            keep[0, :] = False  # all padding: every row fully masked
    causal = np.tril(np.ones((S, S), bool))
    allowed = causal[None] & keep[:, None, :]
    mask = np.where(allowed, 0.0, LOWEST).astype(np.float32)[:, None]
    return {
        "q": rng.standard_normal((B, S, H * d)).astype(np.float32),
        "k": rng.standard_normal((B, Nkv, S, d)).astype(np.float32),
        "v": rng.standard_normal((B, S, Nkv * d)).astype(np.float32),
        "mask": mask,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    H, Nkv, d, S = args.heads, args.kv_heads, args.head_size, args.sequence
    variants = ["mha", "gqa", "gqa-causal", "gqa-causal-fixed"]
    sessions = {v: session(build(v, H, Nkv, d), args.threads) for v in variants}

    for B, S_check, seed in ((3, 7, 0), (2, 16, 1), (1, 1, 2), (3, S, 3)):
        f = feeds(B, S_check, H, Nkv, d, seed, pad=True)
        ref = sessions["mha"].run(None, f)[0]
        for v in variants[1:]:
            out = sessions[v].run(None, f)[0]
            diff = float(np.abs(out - ref).max())
            print(f"numerics B={B} S={S_check} {v}: max |diff| vs mha = {diff:.3g}")

    f = feeds(1, S, H, Nkv, d, 4, pad=False)
    for s in sessions.values():
        for _ in range(5):
            s.run(None, f)
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for v in order:
            c, w = time.process_time(), time.perf_counter()
            sessions[v].run(None, f)
            cpu[v].append(time.process_time() - c)
            wall[v].append(time.perf_counter() - w)
    print(f"S={S} B=1 H={H} Nkv={Nkv} d={d} threads={args.threads} rounds={args.rounds}")
    for v in variants:
        ratio_w = statistics.median(a / b for a, b in zip(wall["mha"], wall[v], strict=True))
        ratio_c = statistics.median(a / b for a, b in zip(cpu["mha"], cpu[v], strict=True))
        print(
            f"  {v:<11} wall {statistics.median(wall[v]) * 1e3:7.3f} ms  cpu "
            f"{statistics.median(cpu[v]) * 1e3:7.3f} ms  speed-up vs mha: wall {ratio_w:.3f}x "
            f"cpu {ratio_c:.3f}x"
        )


if __name__ == "__main__":
    main()
