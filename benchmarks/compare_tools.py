"""Compare onnxopt with other ONNX optimizers on the same models; writes a markdown table.

For every model and tool, the tool runs in a child process (so that its wall time and peak memory
are its own, and a crash costs one cell, not the run); then ``onnxopt bench --optimized`` times the
result against the original on ONNX Runtime CPU, interleaved, at ORT_DISABLE_ALL (the rewrites' own
effect) and ORT_ENABLE_ALL (what a deployment sees), and checks its outputs against the original and,
for models built from a factory, against eager PyTorch.

Tools (optional benchmark dependencies, never imported by onnxopt): onnxopt, onnxsim, onnxslim,
onnxoptimizer, onnxscript (optimizer + ORT fusions), ORT's transformer optimizer.

Models: ``--models`` files or folders; by default the exported zoo in ``zoo/`` when present, else
models/default.onnx, a few of the onnx wheel's light_* models and BERT-tiny exported on the fly from
a transformers config (``--hf bert_base,distilbert,gpt2`` adds full-size ones).

    .venv/bin/python benchmarks/compare_tools.py --out benchmarks/results.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TOOLS = ("onnxopt", "onnxsim", "onnxslim", "onnxoptimizer", "onnxscript", "ort-transformers")
LIGHT = ("light_resnet50", "light_squeezenet", "light_densenet121", "light_inception_v1")
TOOL_TIMEOUT = 1800


# --- the tools, each run in a child process -----------------------------------------------------


def _vm(field_name: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _save_proto(model: Any, path: str) -> None:
    import onnx

    if model.ByteSize() > 1_800_000_000:
        onnx.save(model, path, save_as_external_data=True, location=Path(path).name + ".data")
    else:
        onnx.save(model, path)


def _run_onnxopt(src: str, dst: str) -> None:
    import onnxopt
    from onnxopt import io

    result = onnxopt.optimize(src, check=False)
    io.save_model(result.model, dst)


def _run_onnxopt_validated(src: str, dst: str) -> None:
    """What ``onnxopt optimize`` does by default: the same, plus validation on ORT before saving."""
    import onnxopt
    from onnxopt import io

    result = onnxopt.optimize(src, check=True)
    if not result.validated:
        raise RuntimeError("onnxopt's validation failed")
    io.save_model(result.model, dst)


def _run_onnxsim(src: str, dst: str) -> None:
    import onnx
    import onnxsim

    model, ok = onnxsim.simplify(onnx.load(src))
    if not ok:
        raise RuntimeError("onnxsim's own check failed")
    _save_proto(model, dst)


def _run_onnxslim(src: str, dst: str) -> None:
    import onnxslim

    onnxslim.slim(src, output_model=dst)


def _run_onnxoptimizer(src: str, dst: str) -> None:
    import onnx
    import onnxoptimizer

    _save_proto(onnxoptimizer.optimize(onnx.load(src)), dst)


def _run_onnxscript(src: str, dst: str) -> None:
    import onnx_ir as ir
    import onnxscript.optimizer

    model = ir.load(src)
    model = onnxscript.optimizer.optimize(model)
    try:
        from onnxscript.rewriter import ort_fusions
    except ImportError:
        ort_fusions = None
    if ort_fusions is not None:
        model, _counts = ort_fusions.optimize_for_ort(model)
    ir.save(model, dst)


def _run_ort_transformers(src: str, dst: str) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    # Its default options for the model type its file name suggests (ORT basic optimizations, then
    # its Python fusions; "bert" otherwise); num_heads/hidden_size 0: detected from the graph.
    name = Path(src).name.lower()
    model_type = next((t for t in ("gpt2", "vit") if t in name), "bert")
    optimized = optimize_model(src, model_type=model_type, num_heads=0, hidden_size=0)
    optimized.save_model_to_file(dst)


RUNNERS = {
    "onnxopt": _run_onnxopt,
    "onnxopt-validated": _run_onnxopt_validated,
    "onnxsim": _run_onnxsim,
    "onnxslim": _run_onnxslim,
    "onnxoptimizer": _run_onnxoptimizer,
    "onnxscript": _run_onnxscript,
    "ort-transformers": _run_ort_transformers,
}


IMPORTS = {
    # onnxopt's package imports its API lazily, on the first optimize(): import it here, or its
    # imports (0.3-0.6 s) would count as its work where no other tool's do
    "onnxopt": ("onnxopt.api",),
    "onnxopt-validated": ("onnxopt.api", "onnxruntime"),
    "onnxsim": ("onnx", "onnxsim"),
    "onnxslim": ("onnxslim",),
    "onnxoptimizer": ("onnx", "onnxoptimizer"),
    "onnxscript": ("onnx_ir", "onnxscript.optimizer", "onnxscript.rewriter.ort_fusions"),
    "ort-transformers": ("onnxruntime.transformers.optimizer",),
}


def _child(tool: str, src: str, dst: str) -> None:
    """Child process: import, then time the tool from reading SRC to writing DST; print JSON."""
    import importlib
    import logging

    logging.disable(logging.WARNING)
    for name in IMPORTS[tool]:  # imports are not the tool's work: keep them out of time and memory
        try:
            importlib.import_module(name)
        except ImportError:
            if name != "onnxscript.rewriter.ort_fusions":
                raise
    baseline = _vm("VmRSS")
    start, cpu_start = time.perf_counter(), time.process_time()
    RUNNERS[tool](src, dst)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_growth": _vm("VmHWM") - baseline})
    )


# --- the parent: run tools, bench results, write the table ---------------------------------------


@dataclass
class Cell:
    tool: str
    nodes: int | None = None
    seconds: float | None = None
    cpu_seconds: float | None = None
    peak_growth: int | None = None
    ratios: dict[str, dict[str, float | None]] = field(default_factory=dict)
    err_original: float | None = None
    agrees: bool | None = None
    err_eager: float | None = None
    error: str | None = None


def _count_nodes(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def count(graph: Any) -> int:
        total = 0
        for node in graph.node:
            total += 1
            for attr in node.attribute:
                if attr.HasField("g"):
                    total += count(attr.g)
                for sub in attr.graphs:
                    total += count(sub)
        return total

    return count(model.graph) + sum(len(f.node) for f in model.functions)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_tool(tool: str, src: Path, dst: Path) -> Cell:
    cell = Cell(tool)
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", tool, str(src), str(dst)],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            env=_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        cell.error = f"timed out after {TOOL_TIMEOUT} s"
        return cell
    if done.returncode != 0 or not dst.exists():
        cell.error = _last_line(done.stderr) or f"exit status {done.returncode}"
        return cell
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    cell.seconds, cell.peak_growth = stats["seconds"], stats["peak_growth"]
    cell.cpu_seconds = stats.get("cpu_seconds")
    cell.nodes = _count_nodes(dst)
    return cell


def bench(
    original: Path, candidate: Path, torch_spec: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "onnxopt",
        "bench",
        str(original),
        "--optimized",
        str(candidate),
    ]
    command += [
        "--ort-level",
        "disable,all",
        "--budget",
        str(args.budget),
        "--threads",
        str(args.threads),
    ]
    command += ["--clock", args.clock, "--no-memory", "--json"]
    if torch_spec:
        command += ["--torch", torch_spec]
    done = subprocess.run(
        command, capture_output=True, text=True, env=_env(), check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(_last_line(done.stderr) or f"bench exit status {done.returncode}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def fill_from_bench(cell: Cell, report: dict[str, Any]) -> None:
    variants = report["points"][0]["groups"][0]["variants"]
    for variant in variants:
        if variant["name"] != "optimized":
            continue
        cell.ratios[variant["ort_level"]] = variant["speedup"]
        if variant["ort_level"] == "disable":
            agreement = variant["vs_original"]
            cell.err_original = agreement["max_abs"]
            cell.agrees = agreement["passed"]
            if variant["vs_eager"] is not None:
                cell.err_eager = variant["vs_eager"]["max_abs"]


@dataclass
class ModelCase:
    name: str
    path: Path
    torch: str | None  # factory for the eager reference


def default_models(workdir: Path, hf: list[str], small: bool = True) -> list[ModelCase]:
    """The exported zoo when there is one; else default.onnx, light_* models and BERT-tiny; plus ``hf``."""
    zoo = ROOT / "zoo"
    if small and zoo.is_dir() and any(zoo.rglob("*.onnx")):
        return [ModelCase(p.stem, p, None) for p in sorted(zoo.rglob("*.onnx"))]
    import onnx

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    cases = []
    if small:
        cases.append(ModelCase("default", ROOT / "models" / "default.onnx", None))
        cases += [
            ModelCase(n, light / f"{n}.onnx", None) for n in LIGHT if (light / f"{n}.onnx").exists()
        ]
    sys.path.insert(0, str(HERE))
    import hf_models

    for name in ["bert_tiny", *hf] if small else hf:
        path = workdir / f"{name}.onnx"
        if not path.exists():
            print(f"exporting {name} ...", file=sys.stderr)
            hf_models.export(name, path)
        cases.append(ModelCase(name, path, f"{HERE / 'hf_models.py'}:{name}"))
    return cases


def _ratio(interval: dict[str, float | None] | None) -> str:
    if not interval:
        return "-"
    text = f"{interval['median']:.2f}"
    if interval.get("low") is not None and interval.get("high") is not None:
        text += f" [{interval['low']:.2f}, {interval['high']:.2f}]"
    return text


def _mib(count: int | None) -> str:
    return "-" if count is None else f"{count / 2**20:.0f} MiB"


def _times(count: int | None, path: Path) -> str:
    return "-" if count is None else f"{count / path.stat().st_size:.1f}×"


def _err(value: float | None, agrees: bool | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.1e}"
    return text if agrees is not False else f"**{text}** (off)"


def combined(cells: list[Cell]) -> Cell:
    """One cell for repeated runs of a tool on a model: the first failure, else the medians of
    time, CPU time and peak memory (node counts are the same every run: the tools are
    deterministic)."""
    failed = next((c for c in cells if c.error), None)
    if failed is not None:
        return failed
    first = cells[0]

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    peak = median([c.peak_growth for c in cells])
    return Cell(
        first.tool,
        nodes=first.nodes,
        seconds=median([c.seconds for c in cells]),
        cpu_seconds=median([c.cpu_seconds for c in cells]),
        peak_growth=None if peak is None else int(peak),
    )


def markdown(
    rows: list[tuple[ModelCase, int, Cell]], args: argparse.Namespace, seconds: float
) -> str:
    import onnxruntime as ort

    lines = [
        "| model | tool | nodes | optimize time | optimizer peak RSS (× file) | speed-up @DISABLE_ALL | "
        "speed-up @ENABLE_ALL | max err vs original | max err vs eager |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, nodes_before, cell in rows:
        if cell.error:
            lines.append(
                f"| {case.name} | {cell.tool} | {nodes_before} → ? | failed: {cell.error.replace('|', '/')} ||||||"
            )
            continue
        lines.append(
            f"| {case.name} | {cell.tool} | {nodes_before} → {cell.nodes} | "
            f"{cell.seconds:.2f} s | {_mib(cell.peak_growth)} ({_times(cell.peak_growth, case.path)}) | {_ratio(cell.ratios.get('disable'))} | "
            f"{_ratio(cell.ratios.get('all'))} | {_err(cell.err_original, cell.agrees)} | {_err(cell.err_eager)} |"
        )
    if args.no_latency:  # keep nodes, time and memory; the latency and error columns are empty
        lines = ["|".join(line.split("|")[:6]) + "|" for line in lines]
        lines[0] += " CPU time |"
        lines[1] += "---:|"
        for index, (_case, _before, cell) in enumerate(rows, start=2):
            lines[index] += (
                f" {cell.cpu_seconds:.2f} s |" if cell.cpu_seconds is not None else " - |"
            )
        repeated = (
            f" (median of {args.repeat} runs, the tools taking turns)" if args.repeat > 1 else ""
        )
        repeat_flag = f" --repeat {args.repeat}" if args.repeat > 1 else ""
        lines += [
            "",
            f"Optimize time{repeated}: reading the model, optimizing and writing it, in a fresh "
            "process; peak RSS: "
            "its resident-memory growth over the interpreter with the tool imported, and that growth "
            f"as a multiple of the model's file size. Generated in {seconds / 60:.0f} min by "
            f"`benchmarks/compare_tools.py --no-latency{repeat_flag}`.",
        ]
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"Speed-up: median of paired per-round time ratios original/optimized with its 95% interval "
        f"(`onnxopt bench`, ORT {ort.__version__} CPU, {args.threads} thread(s), {args.clock} clock, "
        f"{args.budget:g} s per model and tool, batch 1, sequence 128 for text models). > 1: faster. Optimize time: reading the "
        "model, optimizing and writing it, in a fresh process; peak RSS: its resident-memory growth over "
        "the interpreter with the tool imported. Errors: max |difference| on the benchmark inputs, "
        f"ORT optimizations off. Generated in {seconds / 60:.0f} min by `benchmarks/compare_tools.py`.",
    ]
    return "\n".join(lines) + "\n"


def _write_json(path: Path, rows: list[tuple[ModelCase, int, Cell]]) -> None:
    cells = [
        {"model": case.name, "file_bytes": case.path.stat().st_size, "nodes_before": before}
        | vars(cell)
        for case, before, cell in rows
    ]
    path.write_text(json.dumps(cells, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="*", type=Path, help="ONNX files or folders (default: see above)"
    )
    parser.add_argument(
        "--hf", default="", help="Also export these full-size models: bert_base,distilbert,gpt2"
    )
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help=f"Comma-separated subset of {', '.join(TOOLS)}"
    )
    parser.add_argument(
        "--budget", type=float, default=10.0, help="Seconds of timing per model and tool"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="Skip `onnxopt bench` (no speed-ups or accuracy): node counts, optimize time, peak RSS",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="cpu",
        help="bench --clock (cpu: steadier on a shared machine)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="Run each tool this many times per model, in turns, and report the medians of its "
        "time and memory (a shared machine's single runs can differ by 2x)",
    )
    parser.add_argument("--no-small", action="store_true", help="Only the --hf models")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the optimized models in --workdir"
    )
    parser.add_argument(
        "--workdir", type=Path, help="Where exported and optimized models go (default: temp)"
    )
    parser.add_argument("--out", type=Path, help="Write the markdown table here (default: stdout)")
    parser.add_argument("--json", type=Path, help="Also write every cell as JSON here")
    args = parser.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in tools if t not in RUNNERS]
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compare-tools-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.models:
            paths = [
                q for p in args.models for q in (sorted(p.rglob("*.onnx")) if p.is_dir() else [p])
            ]
            cases = [ModelCase(p.stem, p, None) for p in paths]
        else:
            cases = default_models(
                workdir, [h for h in args.hf.split(",") if h], small=not args.no_small
            )
        rows: list[tuple[ModelCase, int, Cell]] = []
        for case in cases:
            nodes_before = _count_nodes(case.path)
            runs: dict[str, list[Cell]] = {tool: [] for tool in tools}
            outputs = {tool: workdir / f"{case.name}.{tool}.onnx" for tool in tools}
            for _ in range(args.repeat):
                for tool in tools:
                    if runs[tool] and runs[tool][-1].error:
                        continue  # a failure is reported, not retried
                    print(f"{case.name}: {tool} ...", file=sys.stderr, flush=True)
                    runs[tool].append(run_tool(tool, case.path, outputs[tool]))
            for tool in tools:
                out = outputs[tool]
                cell = combined(runs[tool])
                if cell.error is None and not args.no_latency:
                    try:
                        fill_from_bench(cell, bench(case.path, out, case.torch, args))
                    except (RuntimeError, KeyError, IndexError, json.JSONDecodeError) as exc:
                        cell.error = f"bench: {exc}"
                rows.append((case, nodes_before, cell))
                if args.json:  # after every cell, so that a long run that is stopped keeps its rows
                    _write_json(args.json, rows)
                for leftover in (out, out.with_name(out.name + ".data")):
                    if not args.keep and leftover.exists():
                        leftover.unlink()
        table = markdown(rows, args, time.perf_counter() - start)

    if args.out:
        args.out.write_text(table, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(table)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
