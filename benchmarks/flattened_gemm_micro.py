"""Kernel micro-benchmark: a linear layer on [B, S, K] as Reshape + Gemm + Reshape (GPT-2's Conv1D,
addmm between views) against one rank-3 MatMul (+ Add for the bias), what fuse-matmul writes.

    python benchmarks/flattened_gemm_micro.py [--rounds 300] [--sequence 128]

ORT CPU, ORT_ENABLE_ALL, 2 threads, the two sessions interleaved (order alternating each round),
thread CPU time per run; prints each form's median and the median of per-round ratios
(Reshape+Gemm+Reshape / MatMul, > 1: MatMul faster) for GPT-2's three weight shapes, with and
without a bias.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import ModelProto
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

SHAPES = ((768, 2304), (768, 3072), (3072, 768))  # GPT-2 small: c_attn, c_fc, c_proj


def _models(k: int, n: int, bias: bool) -> tuple[ModelProto, ModelProto]:
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), "W"),
        nh.from_array(rng.standard_normal(n).astype(np.float32), "b"),
        nh.from_array(np.array([-1, k], np.int64), "flat"),
        nh.from_array(np.array([n], np.int64), "n"),
    ]

    def model(nodes: list, used: set[str]) -> ModelProto:  # type: ignore[type-arg]
        graph = h.make_graph(
            nodes,
            "g",
            [h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", k])],
            [h.make_tensor_value_info("y", TP.FLOAT, ["B", "S", n])],
            [i for i in inits if i.name in used],
        )
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])

    gemm_inputs = ["x2", "W", "b"] if bias else ["x2", "W"]
    viewed = model(
        [
            h.make_node("Shape", ["x"], ["lead"], end=-1),
            h.make_node("Concat", ["lead", "n"], ["target"], axis=0),
            h.make_node("Reshape", ["x", "flat"], ["x2"]),
            h.make_node("Gemm", gemm_inputs, ["g"]),
            h.make_node("Reshape", ["g", "target"], ["y"]),
        ],
        {"W", "flat", "n", "b"} if bias else {"W", "flat", "n"},
    )
    if bias:
        nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["y"])]
    else:
        nodes = [h.make_node("MatMul", ["x", "W"], ["y"])]
    return viewed, model(nodes, {"W", "b"} if bias else {"W"})


def _session(model: ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--sequence", type=int, default=128)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    for k, n in SHAPES:
        feed = {"x": rng.standard_normal((1, args.sequence, k)).astype(np.float32)}
        for bias in (True, False):
            viewed, matmul = (_session(m) for m in _models(k, n, bias))
            diff = np.abs(viewed.run(None, feed)[0] - matmul.run(None, feed)[0]).max()
            times: dict[str, list[float]] = {"viewed": [], "matmul": []}
            pairs = [("viewed", viewed), ("matmul", matmul)]
            for i in range(args.rounds):
                for name, session in pairs if i % 2 else pairs[::-1]:
                    start = time.thread_time()
                    session.run(None, feed)
                    times[name].append(time.thread_time() - start)
            ratio = statistics.median(
                a / b for a, b in zip(times["viewed"], times["matmul"], strict=True) if b > 0
            )
            print(
                f"[1, {args.sequence}, {k}] x [{k}, {n}] {'bias' if bias else 'no bias':7}"
                f" Reshape+Gemm+Reshape {statistics.median(times['viewed']) * 1e6:7.0f} us"
                f"  MatMul{'+Add' if bias else ''} {statistics.median(times['matmul']) * 1e6:7.0f} us"
                f"  ratio {ratio:.3f}  max diff {diff:.1e}"
            )


if __name__ == "__main__":
    main()
