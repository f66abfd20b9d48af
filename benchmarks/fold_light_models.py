"""Node counts and file sizes after onnxopt, onnxsim and onnxslim on the light_* models in onnx's wheel.

The light_* models store every weight as ConstantOfShape of a scalar (a few bytes each). onnxsim and
onnxslim fold them into full tensors; onnxopt's folding never grows the file, so those stay (tool
``onnxopt-grow`` runs onnxopt with ``fold_may_grow=True``, which folds them too). Each tool
runs in its own subprocess (bounded memory, a timeout) one model at a time.

    .venv/bin/python benchmarks/fold_light_models.py [--models light_resnet50,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import onnx

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ROOT = Path(__file__).resolve().parent.parent

_RUNNER = r"""
import json, sys, onnx
tool, src = sys.argv[1], sys.argv[2]
if tool in ("onnxopt", "onnxopt-grow"):
    sys.path.insert(0, sys.argv[3])
    from onnxopt import api, io
    result = api.optimize(src, fold_may_grow=tool == "onnxopt-grow")
    proto = io.to_proto(result.model)
    extra = {"validated": result.validated}
elif tool == "onnxsim":
    import onnxsim
    proto, ok = onnxsim.simplify(onnx.load(src))
    extra = {"validated": bool(ok)}
else:
    import onnxslim
    proto = onnxslim.slim(onnx.load(src))
    extra = {}
nodes = len(proto.graph.node)
ops = {}
for n in proto.graph.node:
    ops[n.op_type] = ops.get(n.op_type, 0) + 1
print(json.dumps({"nodes": nodes, "bytes": proto.ByteSize(), "constant_of_shape": ops.get("ConstantOfShape", 0), **extra}))
"""


def measure(tool: str, path: Path, timeout: int) -> dict[str, object]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, tool, str(path), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all light_*)")
    parser.add_argument(
        "--files", default="", help="comma-separated model paths instead of light_*"
    )
    parser.add_argument("--tools", default="onnxopt,onnxsim,onnxslim")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", dest="json_out", default="")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n] or sorted(
        p.stem for p in LIGHT.glob("light_*.onnx")
    )
    paths = [LIGHT / f"{n}.onnx" for n in names]
    if args.files:
        paths = [Path(f) for f in args.files.split(",") if f]
    tools = [t for t in args.tools.split(",") if t]
    rows = []
    print(
        f"| model | nodes before | {' | '.join(f'{t} nodes' for t in tools)} | file before | {' | '.join(f'{t} file' for t in tools)} |"
    )
    print("|---" * (2 + 2 * len(tools) + 1) + "|")
    for path in paths:
        name = path.stem
        original = onnx.load(path, load_external_data=False)
        row: dict[str, object] = {
            "model": name,
            "nodes": len(original.graph.node),
            "bytes": original.ByteSize(),
        }
        for tool in tools:
            row[tool] = measure(tool, path, args.timeout)
        rows.append(row)

        def cell(tool: str, key: str, row: dict[str, object] = row) -> str:
            found = row[tool]
            assert isinstance(found, dict)
            if "error" in found:
                return "error"
            value = found[key]
            return f"{value / 1024:.0f} KiB" if key == "bytes" else str(value)

        print(
            f"| {name} | {row['nodes']} | {' | '.join(cell(t, 'nodes') for t in tools)} | "
            f"{int(row['bytes']) / 1024:.0f} KiB | {' | '.join(cell(t, 'bytes') for t in tools)} |",  # type: ignore[call-overload]
            flush=True,
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
