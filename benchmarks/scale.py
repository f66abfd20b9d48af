"""How optimize time and memory grow with graph size, and with weight size.

1. Node count: synthetic graphs of 10k / 50k / 200k nodes (repeating blocks of element-wise ops,
   MatMuls, reshapes, duplicated and dead nodes), optimized with `--no-validate` in a fresh process.
2. Weight size: a decoder-shaped stack of MatMuls whose weights live in external data (~3 GB by
   default), optimized with `--no-validate`; peak RSS is compared with the weights' size.

    .venv/bin/python benchmarks/scale.py --nodes 10000,50000,200000 --big-gb 3

Prints a markdown table; figures are wall time and peak RSS of the `onnxopt optimize` process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain_model(nodes: int) -> onnx.ModelProto:
    """Blocks of 10 nodes: MatMul, Add, Relu, dup Relu, Add, Reshape pair, Identity, dead Sigmoid."""
    width = 16
    weight = numpy_helper.from_array(np.eye(width, dtype=np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(width, np.float32), "b")
    shape_flat = numpy_helper.from_array(np.array([0, -1], np.int64), "flat")
    shape_back = numpy_helper.from_array(np.array([0, 2, width // 2], np.int64), "back")
    out = "x"
    graph_nodes = []
    for i in range(nodes // 10):
        p = f"b{i}_"
        graph_nodes += [
            helper.make_node("MatMul", [out, "w"], [p + "mm"]),
            helper.make_node("Add", [p + "mm", "b"], [p + "add"]),
            helper.make_node("Relu", [p + "add"], [p + "r1"]),
            helper.make_node("Relu", [p + "add"], [p + "r2"]),
            helper.make_node("Add", [p + "r1", p + "r2"], [p + "sum"]),
            helper.make_node("Reshape", [p + "sum", "back"], [p + "rs1"]),
            helper.make_node("Reshape", [p + "rs1", "flat"], [p + "rs2"]),
            helper.make_node("Identity", [p + "rs2"], [p + "id"]),
            helper.make_node("Sigmoid", [p + "id"], [p + "dead"]),
            helper.make_node("Mul", [p + "id", "b"], [p + "out"]),
        ]
        out = p + "out"
    graph = helper.make_graph(
        graph_nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", width])],
        [weight, bias, shape_flat, shape_back],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def big_model(folder: Path, gigabytes: float) -> Path:
    """A stack of [hidden, hidden] MatMuls with distinct random weights in one external data file."""
    hidden = 4096
    layer_bytes = hidden * hidden * 4
    layers = max(1, int(gigabytes * 1e9 // layer_bytes))
    data_path = folder / "big.onnx.data"
    inits = []
    nodes = []
    rng = np.random.default_rng(0)
    offset = 0
    with data_path.open("wb") as f:
        for i in range(layers):
            block = rng.standard_normal((hidden, hidden), dtype=np.float32)
            f.write(block.tobytes())
            tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[hidden, hidden])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", data_path.name),
                ("offset", str(offset)),
                ("length", str(layer_bytes)),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += layer_bytes
            inits.append(tensor)
            src = "x" if i == 0 else f"h{i - 1}"
            nodes.append(helper.make_node("MatMul", [src, f"w{i}"], [f"m{i}"]))
            nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}"]))
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", hidden])],
        [helper.make_tensor_value_info(f"h{layers - 1}", TensorProto.FLOAT, ["N", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / "big.onnx"
    path.write_bytes(model.SerializeToString())
    return path


_CHILD = """
import resource, runpy, sys
sys.argv = ["onnxopt", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("onnxopt", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
usage = resource.getrusage(resource.RUSAGE_SELF)
print("MAXRSS", usage.ru_maxrss, usage.ru_utime + usage.ru_stime, file=sys.stderr)
sys.exit(code)
"""


def run_optimize(model: Path, output: Path, *extra: str) -> tuple[float, int, int]:
    """(CPU seconds, peak RSS bytes, exit code) of one `onnxopt optimize` process.

    CPU time, not wall time: it does not count waiting for a core on a shared machine.
    """
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            "optimize",
            str(model),
            "-o",
            str(output),
            "--no-validate",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    lines = proc.stderr.strip().splitlines()
    last = lines[-1].split() if lines and lines[-1].startswith("MAXRSS") else ["", "0", "nan"]
    peak_kib, seconds = int(last[1]), float(last[2])
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
    return seconds, peak_kib * 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10000,50000,200000")
    parser.add_argument(
        "--big-gb", type=float, default=3.0, help="0 to skip the external-weights model"
    )
    args = parser.parse_args()
    rows = [
        "| model | nodes | weights | optimize CPU time | peak RSS | µs / node |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="onnxopt-scale-") as tmp:
        folder = Path(tmp)
        for count in (int(n) for n in args.nodes.split(",") if n):
            path = folder / f"chain{count}.onnx"
            path.write_bytes(chain_model(count).SerializeToString())
            seconds, peak, code = run_optimize(path, folder / f"chain{count}.opt.onnx")
            status = "" if code == 0 else f" (exit {code})"
            rows.append(
                f"| chain{status} | {count:,} | - | {seconds:.1f} s | {peak / 2**20:.0f} MiB | {seconds / count * 1e6:.0f} |"
            )
            print(rows[-1], file=sys.stderr)
        if args.big_gb > 0:
            path = big_model(folder, args.big_gb)
            weights = (folder / "big.onnx.data").stat().st_size
            seconds, peak, code = run_optimize(path, folder / "big.opt.onnx")
            status = "" if code == 0 else f" (exit {code})"
            rows.append(
                f"| external weights{status} | - | {weights / 2**30:.2f} GiB | {seconds:.1f} s | {peak / 2**20:.0f} MiB | - |"
            )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
