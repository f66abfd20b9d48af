"""How close does a model get to its limit? Original vs optimized vs the same model's dense work alone.

    PYTHONPATH=. .venv/bin/python benchmarks/dense_floor.py zoo/bert.dynamo.onnx OPT/bert.dynamo.onnx ...

Arguments are ORIGINAL OPTIMIZED pairs. For each pair a third model, the *floor*, is built from the
optimized one: only its dense weight products (MatMul / Gemm / FusedMatMul / FusedGemm whose second
operand is a weight, the Q/K/V projection inside a packed com.microsoft.Attention as one MatMul with
its packed weight, and Conv with a weight), each with its own weight, attributes and the activation
shape it sees in the real run, reading one random input per distinct shape. Nothing else: no
attention scores, softmax, normalization, activations, residual adds, shape arithmetic or output
copies. ORT cannot run the model faster than that without other GEMM kernels, so

    limit = t(original) / t(floor),   achieved = t(original) / t(optimized),
    headroom taken = (achieved - 1) / (limit - 1).

The three run interleaved in one process (a fresh random order each round), ORT_ENABLE_ALL,
``--threads`` intra-op threads with spinning off, ``--clock cpu`` (process CPU time) by default, at
batch 1 and 128 for every other dynamic dim (raw shapes otherwise: ViT 224², Whisper 80 × 3000).
All three run with their inputs and outputs bound once to preallocated buffers (IO binding), so no
run pays an output allocation or copy (GPT-2's logits are 25 MB): this compares computation only,
where ``onnxopt bench`` times ``session.run`` as an application calls it. Ratios are medians of
per-round ratios with 95% intervals.

ORT's profiler (``profile_kernels.py``) answers the same question from summed kernel times, but its
per-kernel timing costs the original's hundreds of small kernels more than the optimized model's
few: GPT-2 TorchScript's kernels sum to 115.5 ms per run profiled against a 96 ms unprofiled run.
This measures whole runs instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's onnxopt

from onnxopt.bench.providers import session_options  # noqa: E402
from onnxopt.bench.stats import paired_speedup  # noqa: E402
from onnxopt.bench.timing import CLOCKS, interleave, warm_up  # noqa: E402

MS = "com.microsoft"
GEMMS = {("", "MatMul"), ("", "Gemm"), (MS, "FusedMatMul"), (MS, "FusedGemm")}
SEQUENCE = 128


def _feeds(session: Any, sequence: int) -> dict[str, np.ndarray]:
    """Batch 1, ``sequence`` for other dynamic dims; token ids in [0, 100), masks all ones."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        shape = [
            d if isinstance(d, int) and d > 0 else (1 if axis == 0 else sequence)
            for axis, d in enumerate(spec.shape)
        ]
        if "int" in spec.type:
            dtype = np.int64 if "int64" in spec.type else np.int32
            if "mask" in spec.name:
                feeds[spec.name] = np.ones(shape, dtype)
            else:
                feeds[spec.name] = rng.integers(0, 100, shape).astype(dtype)
        elif "float16" in spec.type:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float16)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _dense_nodes(
    model: onnx.ModelProto, weights: dict[str, onnx.TensorProto]
) -> list[tuple[onnx.NodeProto, str]]:
    """(node, weight name) of every dense weight product in the main graph."""
    found: list[tuple[onnx.NodeProto, str]] = []
    for node in model.graph.node:
        key = (node.domain or "", node.op_type)
        if len(node.input) < 2 or node.input[1] not in weights:
            continue
        rank = len(weights[node.input[1]].dims)
        if (
            (key in GEMMS and rank == 2)
            or (key == ("", "Conv") and rank >= 3)
            or (key == (MS, "Attention") and rank == 2)
        ):
            found.append((node, node.input[1]))
    return found


def _activation_shapes(
    model: onnx.ModelProto,
    dense: list[tuple[onnx.NodeProto, str]],
    feeds: dict[str, np.ndarray],
    weights: dict[str, onnx.TensorProto],
) -> dict[str, tuple[tuple[int, ...], int]]:
    """Shape and element type of each dense node's activation input, from one run of the model."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in probe.graph.output}
    # an activation's type is its weight's
    wanted = {node.input[0]: weights[weight].data_type for node, weight in dense}
    for name in sorted(set(wanted) - declared - set(feeds)):
        probe.graph.output.append(helper.make_tensor_value_info(name, wanted[name], None))
    options = session_options("disable", 2)  # the shapes only; the run's speed does not matter
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(names, feeds), strict=True)) | dict(feeds)
    return {
        name: (tuple(values[name].shape), helper.np_dtype_to_tensor_dtype(values[name].dtype))
        for name in {node.input[0] for node, _ in dense}
    }


def floor_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The optimized model's dense weight products alone, each on the activation shape it sees."""
    weights = {t.name: t for t in model.graph.initializer}
    dense = _dense_nodes(model, weights)
    if not dense:
        raise ValueError(
            "no dense weight products (MatMul / Gemm / Attention / Conv with a weight)"
        )
    shapes = _activation_shapes(model, dense, feeds, weights)
    inputs: dict[tuple[tuple[int, ...], int], str] = {}
    nodes: list[onnx.NodeProto] = []
    used: set[str] = set()
    outputs: list[onnx.ValueInfoProto] = []
    for index, (node, weight) in enumerate(dense):
        shape, dtype = shapes[node.input[0]]
        source = inputs.setdefault((shape, dtype), f"x{len(inputs)}")
        out = f"y{index}"
        if node.op_type == "Attention":
            # The packed projection: x @ W_qkv, as the kernel computes it before the heads.
            nodes.append(helper.make_node("MatMul", [source, weight], [out]))
            used.add(weight)
        else:
            rest = list(node.input[1:])
            nodes.append(
                helper.make_node(
                    node.op_type,
                    [source, *rest],
                    [out],
                    domain=node.domain,
                    **{a.name: helper.get_attribute_value(a) for a in node.attribute},
                )
            )
            used.update(name for name in rest if name)
        outputs.append(helper.make_tensor_value_info(out, dtype, None))
    missing = sorted(name for name in used if name not in weights)
    if missing:
        raise ValueError(f"dense node reads a non-weight input: {missing[0]}")
    graph = helper.make_graph(
        nodes,
        "dense_floor",
        [helper.make_tensor_value_info(name, d, list(s)) for (s, d), name in inputs.items()],
        outputs,
        [weights[name] for name in sorted(used)],
    )
    floor = helper.make_model(graph, opset_imports=list(model.opset_import))
    floor.ir_version = model.ir_version
    return floor


def _session(model: onnx.ModelProto | str, threads: int) -> Any:
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(
        source, session_options("all", threads), providers=["CPUExecutionProvider"]
    )


def _bound_run(session: Any, feeds: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """Inputs and outputs bound to preallocated host buffers: a run allocates and copies nothing."""
    import onnxruntime as ort

    binding = session.io_binding()
    keep: list[Any] = []
    for spec in session.get_inputs():
        value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(feeds[spec.name]))
        binding.bind_ortvalue_input(spec.name, value)
        keep.append(value)
    for spec in session.get_outputs():
        binding.bind_output(spec.name, "cpu")
    session.run_with_iobinding(
        binding
    )  # sizes every output; later runs write into the same buffers
    for spec, value in zip(session.get_outputs(), binding.get_outputs(), strict=True):
        binding.bind_ortvalue_output(spec.name, value)
        keep.append(value)
    return (lambda: session.run_with_iobinding(binding)), keep


def _floor_feeds(floor: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        spec.name: rng.standard_normal(
            [d.dim_value for d in spec.type.tensor_type.shape.dim]
        ).astype(helper.tensor_dtype_to_np_dtype(spec.type.tensor_type.elem_type))
        for spec in floor.graph.input
    }


def measure(
    original: Path, optimized: Path, *, budget: float, threads: int, clock: str, sequence: int
) -> dict[str, Any]:
    model = onnx.load(str(optimized))
    probe = _session(str(original), threads)
    feeds = _feeds(probe, sequence)
    floor = floor_model(model, feeds)
    del model
    sessions = [probe, _session(str(optimized), threads), _session(floor, threads)]
    bound = [
        _bound_run(sessions[0], feeds),
        _bound_run(sessions[1], feeds),
        _bound_run(sessions[2], _floor_feeds(floor)),
    ]
    runs = [run for run, _ in bound]
    warm_up(runs, count=3, seconds=budget / 5)
    timing = interleave(
        runs, [(0, 1), (0, 2)], budget_seconds=budget, timer=CLOCKS[clock], min_rounds=10
    )
    del bound
    achieved = paired_speedup(timing.samples[0], timing.samples[1])
    limit = paired_speedup(timing.samples[0], timing.samples[2])
    share = paired_speedup(timing.samples[2], timing.samples[1])  # floor / optimized
    taken = (achieved.median - 1) / (limit.median - 1) if limit.median > 1 else math.nan
    medians = [float(np.median(s)) * 1e3 for s in timing.samples]
    return {
        "original": str(original),
        "optimized": str(optimized),
        "rounds": timing.rounds,
        "ms": {"original": medians[0], "optimized": medians[1], "floor": medians[2]},
        "achieved": [achieved.median, achieved.low, achieved.high],
        "limit": [limit.median, limit.low, limit.high],
        "floor_share_of_optimized": share.median,
        "headroom_taken": taken,
        "dense_nodes": len(floor.graph.node),
    }


def _interval(values: list[float]) -> str:
    return f"{values[0]:.3f} [{values[1]:.2f}, {values[2]:.2f}]"


def render(rows: list[dict[str, Any]], clock: str, threads: int, budget: float) -> str:
    lines = [
        "| model | original ms | optimized ms | floor ms | achieved | limit | dense share of optimized | headroom taken |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ms = row["ms"]
        lines.append(
            f"| {Path(row['original']).name} | {ms['original']:.1f} | {ms['optimized']:.1f} | "
            f"{ms['floor']:.1f} | {_interval(row['achieved'])} | {_interval(row['limit'])} | "
            f"{row['floor_share_of_optimized']:.0%} | {row['headroom_taken']:.0%} |"
        )
    lines.append("")
    lines.append(
        f"ORT_ENABLE_ALL, {threads} threads, {clock} clock, {budget:g} s of interleaved rounds per "
        "model; medians of per-round ratios with 95% intervals; `benchmarks/dense_floor.py`."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "pairs", nargs="+", type=Path, help="ORIGINAL OPTIMIZED [ORIGINAL OPTIMIZED ...]"
    )
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of timing per model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--sequence", type=int, default=SEQUENCE)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give ORIGINAL OPTIMIZED pairs")
    rows = []
    for original, optimized in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        print(f"{original.name} ...", file=sys.stderr, flush=True)
        rows.append(
            measure(
                original,
                optimized,
                budget=args.budget,
                threads=args.threads,
                clock=args.clock,
                sequence=args.sequence,
            )
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(render(rows, args.clock, args.threads, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
