"""Does ONNX Runtime run nodes in the order the file lists them? And does reordering change its peak?

    PYTHONPATH=. python benchmarks/ort_execution_order.py

1. Execution order: ORT's profiler records one event per kernel run; sorting them by start time
   gives the order ORT actually used, for each ``SessionOptions.execution_order``.
2. Peak memory: each configuration runs in a fresh subprocess with the CPU arena and memory
   patterns off, so every tensor is a separate malloc (large ones are mmap'd and returned to the
   OS when freed) and the process's peak RSS during ``run`` tracks the live tensors. ORT's graph
   optimizations are off in both measurements, so the graph runs as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"
ORDERS = ("DEFAULT", "PRIORITY_BASED")
N = 4 * 1024 * 1024  # 16 MiB input; each branch builds a 64 MiB temporary


def two_branches(finish_each_branch: bool) -> onnx.ModelProto:
    """Two independent branches; the file lists them interleaved or one after the other."""
    nodes = {
        "p": oh.make_node("Concat", ["x", "x", "x", "x"], ["p"], name="p", axis=0),
        "q": oh.make_node("Concat", ["x", "x", "x", "x"], ["q"], name="q", axis=0),
        "p2": oh.make_node("ReduceMax", ["p"], ["p2"], name="p2", keepdims=1),
        "q2": oh.make_node("ReduceMax", ["q"], ["q2"], name="q2", keepdims=1),
        "y": oh.make_node("Add", ["p2", "q2"], ["y"], name="y"),
    }
    order = ["p", "p2", "q", "q2", "y"] if finish_each_branch else ["p", "q", "p2", "q2", "y"]
    graph = oh.make_graph(
        [nodes[n] for n in order],
        "two_branches",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [N])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def executed_order(path: Path, execution_order: str, level: str) -> list[str]:
    options = ort.SessionOptions()
    options.execution_order = getattr(ort.ExecutionOrder, execution_order)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = {
            i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
            for i in session.get_inputs()
        }
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return [e["name"].removesuffix("_kernel_time") for e in sorted(kernels, key=lambda e: e["ts"])]


CHILD = r"""
import resource, sys, numpy as np, onnxruntime as ort
path, order = sys.argv[1], sys.argv[2]
o = ort.SessionOptions()
o.execution_order = getattr(ort.ExecutionOrder, order)
o.enable_cpu_mem_arena = False
o.enable_mem_pattern = False
o.intra_op_num_threads = 1
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no CSE/folding: the graph as written
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32) for i in s.get_inputs()}
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the high-water mark to the current RSS
before = status("VmRSS")
s.run(None, feeds)
print(status("VmHWM") - before)
"""


def peak_kib(path: Path, execution_order: str) -> int:
    """Growth of the high-water RSS during one run (KiB), in a fresh process."""
    # A fixed mmap threshold: every tensor over 64 KiB is its own mapping, returned to the OS on free.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", CHILD, str(path), execution_order]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        print("## two branches (x: 16 MiB, each branch a 64 MiB temporary)\n")
        print("| file order | execution_order | ORT ran | peak RSS growth during run |")
        print("|---|---|---|---|")
        for finish in (False, True):
            path = root / f"branches_{finish}.onnx"
            onnx.save(two_branches(finish), path)
            for order in ORDERS:
                ran = executed_order(path, order, "ORT_DISABLE_ALL")
                label = "one branch after the other" if finish else "interleaved"
                print(
                    f"| {label} | {order} | {' '.join(ran)} | {peak_kib(path, order) / 1024:.0f} MiB |",
                    flush=True,
                )
        print("\n## light models: input file vs reordered files (ORT graph optimizations off)\n")
        print(
            "| model | execution_order | ORT follows the file? | peak RSS growth: input | reorder-for-memory | file-order schedule |"
        )
        print("|---|---|---|---|---|---|")
        from onnxopt import io
        from onnxopt.analysis.memory import build_dataflow, tensor_sizes
        from onnxopt.analysis.schedule import schedule_for_memory
        from onnxopt.passes.reorder_for_memory import ReorderForMemoryPass, apply_order

        for name in ("inception_v1", "squeezenet", "resnet50", "densenet121"):
            source = LIGHT / f"light_{name}.onnx"
            model = io.load_model(source).model
            ReorderForMemoryPass()(model)  # guarded: never worse for ORT's default walk
            guarded = root / f"{name}_pass.onnx"
            io.save_model(model, guarded)
            model = io.load_model(source).model
            flow = build_dataflow(model.graph, tensor_sizes(model))
            schedule = schedule_for_memory(flow, ort_guard=False)
            apply_order(model.graph, [flow.nodes[i] for i in schedule.order])
            free = root / f"{name}_free.onnx"
            io.save_model(model, free)
            for order in ORDERS:
                follows = []
                for path in (source, guarded, free):
                    file_order = [
                        n.name for n in onnx.load(path, load_external_data=False).graph.node
                    ]
                    ran = executed_order(path, order, "ORT_DISABLE_ALL")
                    named = set(ran) & set(file_order)
                    follows.append(
                        [n for n in ran if n in named] == [n for n in file_order if n in named]
                    )
                peaks = [peak_kib(p, order) / 1024 for p in (source, guarded, free)]
                print(
                    f"| {name} | {order} | {'yes' if all(follows) else 'no'} | {peaks[0]:.1f} MiB "
                    f"| {peaks[1]:.1f} MiB | {peaks[2]:.1f} MiB |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
