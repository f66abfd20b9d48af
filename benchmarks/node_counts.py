"""Node counts and model sizes after onnxopt, onnxsim and onnxslim (core issue: "at most what they reach").

Models: the light_* models shipped in onnx's wheel (real CNN architectures whose weights are stored as
``ConstantOfShape`` of a scalar, a few bytes each), and BERT exported from ``transformers.BertModel``
with seeded random weights by both PyTorch exporters (TorchScript ``dynamo=False``, opset 17, and
``dynamo=True``), with dynamic batch and sequence dims: a tiny one (2 layers, hidden 32) and, with
``--full``, bert-base (12 layers, hidden 768); ``--gpt2`` adds a small GPT-2.

Each tool runs in its own subprocess with a timeout, one model at a time: onnxopt at its default level
(``onnxopt.optimize``, which also validates the result on ONNX Runtime against the original),
``onnxsim.simplify`` and ``onnxslim.slim``. onnxopt also runs with ``fold_may_grow=True``, which lets
constant folding write bigger tensors than it removes (what onnxsim and onnxslim do to the light_*
weights); the default never grows the file.

"const" counts nodes whose inputs are all constant (here: ``ConstantOfShape`` weights, which every
runtime folds when it loads the model); the other nodes are the ones that compute at inference time.

    PYTHONPATH=. .venv/bin/python benchmarks/node_counts.py [--full] [--gpt2] [--models a,b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import onnx

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ROOT = Path(__file__).resolve().parent.parent

# Runs one tool on one model in a fresh interpreter; prints one JSON line.
_RUNNER = r"""
import json, sys, time, onnx
tool, src, root = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
extra = {}
if tool.startswith("onnxopt"):
    sys.path.insert(0, root)
    from onnxopt import api, io
    growth = {"fold_may_grow": True, "fold_limit_bytes": 1 << 30} if tool == "onnxopt-grow" else {}
    result = api.optimize(src, **growth)
    proto = io.to_proto(result.model)
    extra = {"validated": result.validated}
elif tool == "onnxsim":
    import onnxsim
    proto, ok = onnxsim.simplify(onnx.load(src))
    extra = {"validated": bool(ok)}
elif tool == "onnxslim":
    import onnxslim
    proto = onnxslim.slim(onnx.load(src))
else:
    proto = onnx.load(src)
seconds = time.perf_counter() - start
graph = proto.graph
constant = {i.name for i in graph.initializer}
const_nodes = 0
for node in graph.node:
    if node.op_type == "Constant" or (node.input and all(not i or i in constant for i in node.input)):
        const_nodes += 1
        constant.update(node.output)
ops = {}
for node in graph.node:
    ops[node.op_type] = ops.get(node.op_type, 0) + 1
print(json.dumps({"nodes": len(graph.node), "const": const_nodes, "bytes": proto.ByteSize(),
                  "seconds": round(seconds, 2), "ops": ops, **extra}))
"""

# Exports BERT (and GPT-2) from transformers with seeded weights; argv: kind, size, exporter, path.
_EXPORTER = r"""
import sys, torch, transformers
kind, size, exporter, path = sys.argv[1:5]
torch.manual_seed(0)
if kind == "bert":
    config = transformers.BertConfig() if size == "base" else transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64)
    inner = transformers.BertModel(config).eval()
    outputs = ["last_hidden_state", "pooler_output"]
else:
    config = transformers.GPT2Config() if size == "base" else transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    inner = transformers.GPT2Model(config).eval()
    config.use_cache = False
    outputs = ["last_hidden_state"]

class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = inner
    def forward(self, input_ids, attention_mask):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False) \
            if kind == "gpt2" else self.inner(input_ids=input_ids, attention_mask=attention_mask)
        return tuple(getattr(out, name) for name in outputs)

model = Wrapper().eval()
ids = torch.randint(0, min(config.vocab_size, 100), (2, 8))
mask = torch.ones(2, 8, dtype=torch.int64)
names = {"input_names": ["input_ids", "attention_mask"], "output_names": outputs}
with torch.no_grad():
    if exporter == "ts":
        dims = {0: "batch", 1: "seq"}
        torch.onnx.export(model, (ids, mask), path, opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": dims, "attention_mask": dims}, **names)
    else:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
        shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
        program = torch.onnx.export(model, (ids, mask), dynamic_shapes=shapes, dynamo=True, **names)
        program.save(path)
"""

TOOLS = ("onnxopt", "onnxopt-grow", "onnxsim", "onnxslim")


def _run(argv: list[str], timeout: int) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout}s"


def measure(tool: str, path: Path, timeout: int) -> dict[str, object]:
    done = _run([sys.executable, "-c", _RUNNER, tool, str(path), str(ROOT)], timeout)
    if isinstance(done, str):
        return {"error": done}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def export(kind: str, size: str, exporter: str, workdir: Path, timeout: int) -> Path | str:
    """Export once into ``workdir`` (reused when present); the path or an error line."""
    path = workdir / f"{kind}_{size}_{exporter}.onnx"
    if path.exists():
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.onnx")
    done = _run([sys.executable, "-c", _EXPORTER, kind, size, exporter, str(partial)], timeout)
    if isinstance(done, str):
        return done
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"export exit {done.returncode}"
    proto = onnx.load(str(partial))  # external data (if any) is inlined: one self-contained file
    onnx.save(proto, str(path))
    for leftover in workdir.glob(f"{partial.name}*"):
        leftover.unlink()
    return path


def _cell(found: object, render: Callable[[dict[str, object]], str]) -> str:
    if not isinstance(found, dict):
        return "–"
    if "error" in found:
        return "error"
    return render(found)


def _nodes(found: dict[str, object]) -> str:
    text = f"{found['nodes']}"
    if found.get("const"):
        text += f" ({found['const']} const)"
    if found.get("validated") is False:
        text += " ✗"
    return text


def _size(found: dict[str, object]) -> str:
    size = int(found["bytes"])  # type: ignore[call-overload]
    if size >= 10 * 1024 * 1024:
        return f"{size / 1024 / 1024:.0f} MiB"
    return f"{size / 1024:.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--full", action="store_true", help="also bert-base (12 layers, 768)")
    parser.add_argument("--gpt2", action="store_true", help="also GPT-2 (tiny; base with --full)")
    parser.add_argument("--no-light", action="store_true", help="skip the light_* models")
    parser.add_argument("--workdir", default="/tmp/onnxopt-node-counts", help="exported models")
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--json", dest="json_out", default="")
    parser.add_argument(
        "--ops", action="store_true", help="print op histograms where onnxopt loses"
    )
    parser.add_argument(
        "--reuse", default="", help="a previous --json: reuse its onnxsim/onnxslim/original results"
    )
    args = parser.parse_args()

    models: list[tuple[str, Path | str]] = []
    if not args.no_light:
        models += [(p.stem, p) for p in sorted(LIGHT.glob("light_*.onnx"))]
    sizes = ["tiny", "base"] if args.full else ["tiny"]
    kinds = ["bert", "gpt2"] if args.gpt2 else ["bert"]
    workdir = Path(args.workdir)
    for kind in kinds:
        for size in sizes:
            for exporter in ("ts", "dynamo"):
                name = f"{kind}_{size}_{exporter}"
                if args.models and name not in args.models.split(","):
                    continue
                models.append((name, export(kind, size, exporter, workdir, args.timeout)))
    if args.models:
        models = [(n, p) for n, p in models if n in args.models.split(",")]
    tools = [t for t in args.tools.split(",") if t]

    print(
        f"| model | original | {' | '.join(tools)} | original size | "
        f"{' | '.join(f'{t} size' for t in tools)} |"
    )
    print("|---" * (3 + 2 * len(tools)) + "|")
    previous = {}
    if args.reuse and Path(args.reuse).exists():
        previous = {row["model"]: row for row in json.loads(Path(args.reuse).read_text())}
    rows = []
    for name, path in models:
        if isinstance(path, str):
            print(f"| {name} | export failed: {path} |", flush=True)
            continue
        start = time.perf_counter()
        old = previous.get(name, {})
        row: dict[str, object] = {"model": name}
        for tool in ["original", *tools]:
            reusable = not tool.startswith("onnxopt") and "error" not in old.get(tool, {"error": 1})
            row[tool] = old[tool] if reusable else measure(tool, path, args.timeout)
        rows.append(row)
        print(
            f"| {name} | {_cell(row['original'], _nodes)} | "
            f"{' | '.join(_cell(row[t], _nodes) for t in tools)} | {_cell(row['original'], _size)} | "
            f"{' | '.join(_cell(row[t], _size) for t in tools)} |",
            flush=True,
        )
        print(f"<!-- {name}: {time.perf_counter() - start:.0f}s -->", file=sys.stderr, flush=True)
        if args.ops:
            _print_op_diff(row, tools)
    errors = [
        f"{row['model']} {tool}: {row[tool]['error']}"  # type: ignore[index]
        for row in rows
        for tool in tools
        if isinstance(row.get(tool), dict) and "error" in row[tool]  # type: ignore[operator]
    ]
    for line in errors:
        print(line, file=sys.stderr)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


def _print_op_diff(row: dict[str, object], tools: list[str]) -> None:
    ours = row.get("onnxopt")
    if not isinstance(ours, dict) or "ops" not in ours:
        return
    for other in ("onnxsim", "onnxslim"):
        theirs = row.get(other)
        if not isinstance(theirs, dict) or "ops" not in theirs:
            continue
        a, b = ours["ops"], theirs["ops"]
        diff = {op: a.get(op, 0) - b.get(op, 0) for op in sorted(set(a) | set(b))}
        diff = {op: d for op, d in diff.items() if d}
        if diff:
            print(f"    {row['model']} onnxopt - {other}: {diff}", file=sys.stderr)


if __name__ == "__main__":
    main()
