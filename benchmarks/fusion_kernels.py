"""Is each fused op actually faster on ONNX Runtime CPU than what it replaces? Kernel-level A/B.

Each pair (unfused subgraph, fused op) is built as a one-op model with BERT-base / LLaMA-like
shapes, timed interleaved in one process (order flipped each round). Whichever session runs first
in a round pays the thread pool's wake-up, so the per-round ratio alternates with the order; the
figure is fused/unfused compared at the same position (ratio of medians), the two positions
combined by geometric mean (< 1: the fusion pays). This decided which fusions run by default and
which are opt-in (levels.py).

    nice python benchmarks/fusion_kernels.py --levels ORT_DISABLE_ALL,ORT_ENABLE_ALL --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto

MS = "com.microsoft"
rng = np.random.default_rng(0)


def _tensor(name: str, *shape: int) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _scalar(name: str, value: float | list[int], dtype: type = np.float32) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int]],
    inits: list[onnx.TensorProto],
    opset: int,
) -> bytes:
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [oh.make_opsetid("", opset), oh.make_opsetid(MS, 1)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def cases() -> dict[str, tuple[bytes, bytes]]:
    """name -> (unfused model, fused model)."""
    hidden, ffn, seq = 768, 3072, 128
    pair = {"a": [1, seq, hidden], "b": [1, seq, hidden]}
    wide = {"x": [1, seq, ffn]}
    ln = [_tensor("g", hidden), _tensor("be", hidden)]
    node = oh.make_node
    ln_decomposed = [
        node("ReduceMean", ["a", "ax"], ["m"]), node("Sub", ["a", "m"], ["d"]), node("Pow", ["d", "two"], ["sq"]),
        node("ReduceMean", ["sq", "ax"], ["v"]), node("Add", ["v", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]),
        node("Div", ["d", "sd"], ["n"]), node("Mul", ["n", "g"], ["s"]), node("Add", ["s", "be"], ["y"]),
    ]  # fmt: skip
    constants = [_scalar("ax", [-1], np.int64), _scalar("two", 2.0), _scalar("eps", 1e-5)]
    erf_gelu = [
        node("Add", ["x", "bias"], ["s"]), node("Div", ["s", "r2"], ["d"]), node("Erf", ["d"], ["e"]),
        node("Add", ["e", "one"], ["p"]), node("Mul", ["s", "p"], ["m"]), node("Mul", ["m", "half"], ["y"]),
    ]  # fmt: skip
    gelu_constants = [
        _tensor("bias", ffn),
        _scalar("r2", 1.4142135),
        _scalar("one", 1.0),
        _scalar("half", 0.5),
    ]
    rms_decomposed = [
        node("Add", ["a", "b"], ["s"]), node("Pow", ["s", "two"], ["sq"]), node("ReduceMean", ["sq", "ax"], ["ms"]),
        node("Add", ["ms", "eps"], ["v"]), node("Sqrt", ["v"], ["r0"]), node("Reciprocal", ["r0"], ["r"]),
        node("Mul", ["s", "r"], ["n"]), node("Mul", ["g", "n"], ["y"]),
    ]  # fmt: skip
    conv_in = {"x": [1, 64, 56, 56]}
    conv_w = [_tensor("w", 64, 64, 3, 3), _tensor("cb", 64)]
    return {
        "LayerNorm: decomposed -> LayerNormalization": (
            _model(ln_decomposed, {"a": pair["a"]}, ln + constants, 18),
            _model([node("LayerNormalization", ["a", "g", "be"], ["y"], axis=-1)], {"a": pair["a"]}, ln, 18),
        ),
        "SkipLN: Add+LayerNormalization -> SkipLayerNormalization": (
            _model([node("Add", ["a", "b"], ["s"]), node("LayerNormalization", ["s", "g", "be"], ["y"])], pair, ln, 17),
            _model([node("SkipLayerNormalization", ["a", "b", "g", "be"], ["y"], domain=MS)], pair, ln, 17),
        ),
        "Gelu: erf form -> com.microsoft Gelu": (
            _model(erf_gelu, wide, gelu_constants, 17),
            _model([node("Add", ["x", "bias"], ["s"]), node("Gelu", ["s"], ["y"], domain=MS)], wide, [_tensor("bias", ffn)], 17),
        ),
        "Gelu: com.microsoft Gelu -> ONNX Gelu (opset 20)": (
            _model([node("Add", ["x", "bias"], ["s"]), node("Gelu", ["s"], ["y"], domain=MS)], wide, [_tensor("bias", ffn)], 20),
            _model([node("Add", ["x", "bias"], ["s"]), node("Gelu", ["s"], ["y"])], wide, [_tensor("bias", ffn)], 20),
        ),
        "BiasGelu: Add+ONNX Gelu -> BiasGelu": (
            _model([node("Add", ["x", "bias"], ["s"]), node("Gelu", ["s"], ["y"])], wide, [_tensor("bias", ffn)], 20),
            _model([node("BiasGelu", ["x", "bias"], ["y"], domain=MS)], wide, [_tensor("bias", ffn)], 20),
        ),
        "RMSNorm: Add+decomposed -> Add+SimplifiedLayerNormalization": (
            _model(rms_decomposed, pair, [_tensor("g", hidden), *constants], 18),
            _model([node("Add", ["a", "b"], ["s"]), node("SimplifiedLayerNormalization", ["s", "g"], ["y"], axis=-1)], pair, [_tensor("g", hidden)], 18),
        ),
        "SkipRMS: Add+SimplifiedLayerNormalization -> SkipSimplifiedLayerNormalization": (
            _model([node("Add", ["a", "b"], ["s"]), node("SimplifiedLayerNormalization", ["s", "g"], ["y"], axis=-1)], pair, [_tensor("g", hidden)], 18),
            _model([node("SkipSimplifiedLayerNormalization", ["a", "b", "g"], ["y"], domain=MS)], pair, [_tensor("g", hidden)], 18),
        ),
        "FusedConv: Conv+Relu -> FusedConv": (
            _model([node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["y"])], conv_in, conv_w, 17),
            _model([node("FusedConv", ["x", "w", "cb"], ["y"], domain=MS, pads=[1, 1, 1, 1], activation="Relu")], conv_in, conv_w, 17),
        ),
    }  # fmt: skip


def _session(model: bytes, level: str, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="ORT_DISABLE_ALL,ORT_ENABLE_ALL")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--only", default="", help="run the fusions whose name contains this")
    args = parser.parse_args()
    print(
        "| fusion | "
        + " | ".join(f"{lv} fused/unfused [by position]" for lv in args.levels.split(","))
        + " |"
    )
    print("|---|" + "---|" * len(args.levels.split(",")))
    for name, (unfused, fused) in cases().items():
        if args.only not in name:
            continue
        cells = []
        for level in args.levels.split(","):
            sessions = [
                _session(unfused, level, args.threads),
                _session(fused, level, args.threads),
            ]
            feeds = {
                i.name: rng.standard_normal(i.shape).astype(np.float32)
                for i in sessions[0].get_inputs()
            }
            # times[variant][position]: whichever session runs first in a round pays the thread
            # pool's wake-up, so a pair's ratio alternates with the order. Compare each variant
            # with the other at the same position, then combine the two positions.
            times: list[list[list[float]]] = [[[], []], [[], []]]
            for r in range(args.rounds):
                order = (0, 1) if r % 2 else (1, 0)
                for position, i in enumerate(order):
                    start = time.perf_counter()
                    sessions[i].run(None, feeds)
                    times[i][position].append(time.perf_counter() - start)
            per_position = [
                statistics.median(times[1][p]) / statistics.median(times[0][p]) for p in (0, 1)
            ]
            medians_us = [1e6 * statistics.median(times[i][0] + times[i][1]) for i in (0, 1)]
            cells.append(
                f"{float(np.sqrt(per_position[0] * per_position[1])):.2f}"
                f" [first {per_position[0]:.2f}, second {per_position[1]:.2f};"
                f" {medians_us[0]:.0f} -> {medians_us[1]:.0f} µs]"
            )
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
