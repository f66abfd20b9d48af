"""What ``onnxopt optimize`` itself costs: wall time and peak memory per phase (load, each pass, validation, save).

Each model runs in a fresh child process, once without validation (the bare optimizer, what the
other tools do) and once with it (the default). Within the child, ``onnxopt.optimize`` reports
every phase through its progress callback; at each phase change the script reads the clock and the
process's peak resident set (``VmHWM``), then resets the peak (``/proc/self/clear_refs``), so each
phase gets its own peak. Figures are growth over the interpreter with onnxopt (and, for validation,
onnxruntime) already imported, like ``benchmarks/compare_tools.py``.

    PYTHONPATH=. .venv/bin/python benchmarks/optimizer_cost.py zoo/bert.torchscript.onnx --json cost.json
    PYTHONPATH=. .venv/bin/python benchmarks/optimizer_cost.py zoo/*.onnx --phases   # per-pass rows too
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


class _Phases:
    """Clock and peak RSS between successive progress calls."""

    def __init__(self, baseline: int) -> None:
        self.baseline = baseline
        self.rows: list[dict[str, Any]] = []
        self.current = "start"
        self.started = time.perf_counter()
        self.cpu_started = time.process_time()
        self.peak = 0
        _reset_peak()

    def __call__(self, name: str) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        peak = _status("VmHWM") - self.baseline
        self.peak = max(self.peak, peak)
        self.rows.append(
            {
                "phase": self.current,
                "seconds": now - self.started,
                "cpu": cpu - self.cpu_started,
                "peak": peak,
            }
        )
        self.current, self.started, self.cpu_started = name, now, cpu
        _reset_peak()


def child(model: str, validate: bool) -> None:
    import logging

    logging.disable(logging.WARNING)
    import onnxopt
    from onnxopt import io

    if validate:
        import onnxruntime  # noqa: F401  (an import, not the optimizer's work)
    baseline = _status("VmRSS")
    phases = _Phases(baseline)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = onnxopt.optimize(model, check=validate, progress=phases)
    with tempfile.TemporaryDirectory(prefix="optimizer-cost-") as tmp:
        phases("save")
        io.save_model(result.model, Path(tmp) / "out.onnx")
        phases("end")
        total, cpu_total = time.perf_counter() - start, time.process_time() - cpu_start
    # Merge repeated passes (fixed-point iterations) into one row each, in first-seen order.
    merged: dict[str, dict[str, Any]] = {}
    for row in phases.rows[1:]:  # the first row is the gap before "load"
        entry = merged.setdefault(
            row["phase"], {"phase": row["phase"], "seconds": 0.0, "cpu": 0.0, "peak": 0}
        )
        entry["seconds"] += row["seconds"]
        entry["cpu"] += row["cpu"]
        entry["peak"] = max(entry["peak"], row["peak"])
    print(
        json.dumps(
            {
                "seconds": total,
                "cpu": cpu_total,
                "peak": phases.peak,
                "phases": list(merged.values()),
                "validated": result.validated if validate else None,
                "nodes": result.report.after.nodes,
            }
        )
    )


def measure(model: Path, validate: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--child", str(model), "1" if validate else "0"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _mib(count: int) -> str:
    return f"{count / 2**20:.0f} MiB"


def _wall_cpu(run: dict[str, Any], digits: int = 2) -> str:
    cpu = run.get("cpu")  # older --json files have no CPU figures
    return (
        f"{run['seconds']:.{digits}f}" + (f" / {cpu:.{digits}f}" if cpu is not None else "") + " s"
    )


GROUPS = {"load": "load", "validate": "validate", "save": "save"}


def table(results: list[dict[str, Any]], phases: bool) -> str:
    lines = [
        "| model | file | onnxopt (no validation): wall / CPU | peak RSS (× file) | load | passes "
        "| save | with validation: wall / CPU | validation alone | peak RSS with validation (× file) "
        "| nodes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        bare, full, size = r["bare"], r["full"], r["file_bytes"]
        by_phase = {p["phase"]: p for p in bare["phases"]}
        passes = sum(p["seconds"] for p in bare["phases"] if p["phase"] not in GROUPS)
        validation = next((p for p in full["phases"] if p["phase"] == "validate"), None)
        lines.append(
            f"| {r['model']} | {_mib(size)} | {_wall_cpu(bare)} "
            f"| {_mib(bare['peak'])} "
            f"({bare['peak'] / size:.2f}×) | {by_phase['load']['seconds']:.2f} s | {passes:.2f} s | "
            f"{by_phase['save']['seconds']:.2f} s | {_wall_cpu(full)} | "
            f"{validation['seconds'] if validation else 0:.2f} s | {_mib(full['peak'])} "
            f"({full['peak'] / size:.2f}×) | {bare['nodes']} |"
        )
    if phases:
        for r in results:
            lines += [
                "",
                f"{r['model']}: per phase (no validation; validation from the second run)",
            ]
            lines += ["", "| phase | wall s | CPU s | peak RSS growth |", "|---|---:|---:|---:|"]
            rows = [*r["bare"]["phases"]]
            rows += [p for p in r["full"]["phases"] if p["phase"] == "validate"]
            for p in sorted(rows, key=lambda p: -p["seconds"]):
                lines.append(
                    f"| {p['phase']} | {p['seconds']:.3f} | {p.get('cpu', float('nan')):.3f} "
                    f"| {_mib(p['peak'])} |"
                )
    return "\n".join(lines) + "\n"


def comparison(results: list[dict[str, Any]], others: list[dict[str, Any]]) -> str:
    """onnxopt beside the other tools (``compare_tools.py --no-latency --json`` cells)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for cell in others:
        if cell["tool"] not in ("onnxopt", "onnxopt-validated"):
            by_model.setdefault(cell["model"], []).append(cell)
    tools = sorted({c["tool"] for cells in by_model.values() for c in cells})
    header = (
        "| model | file | nodes before | onnxopt nodes | min other (tool) | onnxopt wall / CPU "
    )
    header += "| with validation | onnxopt peak | "
    header += " | ".join(f"{t}: wall / CPU, peak" for t in tools) + " |"
    lines = [header, "|" + "---|" * (8 + len(tools))]
    for r in results:
        cells = {c["tool"]: c for c in by_model.get(r["model"], [])}
        bare, full, size = r["bare"], r["full"], r["file_bytes"]
        counted = [(c["nodes"], t) for t, c in cells.items() if c.get("nodes") is not None]
        low = min(counted) if counted else None
        mark = "" if low is None or bare["nodes"] <= low[0] else " (above)"
        before = next((c["nodes_before"] for c in cells.values()), "?")
        row = [
            r["model"],
            _mib(size),
            str(before),
            f"**{bare['nodes']}**{mark}"
            if low is not None and bare["nodes"] <= low[0]
            else str(bare["nodes"]) + mark,
            f"{low[0]} ({low[1]})" if low else "-",
            _wall_cpu(bare, 1),
            _wall_cpu(full, 1),
            f"{bare['peak'] / size:.2f}×",
        ]
        for tool in tools:
            cell = cells.get(tool)
            if cell is None:
                row.append("-")
            elif cell.get("error"):
                row.append("failed")
            else:
                cpu = cell.get("cpu_seconds")
                cpu_text = f" / {cpu:.1f}" if cpu is not None else ""
                row.append(f"{cell['seconds']:.1f}{cpu_text} s, {cell['peak_growth'] / size:.1f}×")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--phases", action="store_true", help="Also print per-phase tables")
    parser.add_argument("--no-validate-run", action="store_true", help="Skip the validated run")
    parser.add_argument("--json", type=Path, help="Write the raw figures here")
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="*",
        help="Print the tables from earlier --json files instead of measuring (MODELS ignored)",
    )
    parser.add_argument(
        "--others",
        type=Path,
        nargs="*",
        default=[],
        help="compare_tools.py --no-latency --json files: add a table against the other tools",
    )
    args = parser.parse_args()
    results = []
    for earlier in args.from_json or []:
        results += json.loads(earlier.read_text(encoding="utf-8"))
    for model in args.models if args.from_json is None else []:
        print(f"{model.name} ...", file=sys.stderr, flush=True)
        bare = measure(model, validate=False)
        full = bare if args.no_validate_run else measure(model, validate=True)
        results.append(
            {
                "model": model.name.removesuffix(".onnx"),
                "file_bytes": model.stat().st_size,
                "bare": bare,
                "full": full,
            }
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(table(results, args.phases))
    if args.others:
        others = [c for path in args.others for c in json.loads(path.read_text(encoding="utf-8"))]
        print(comparison(results, others))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3] == "1")
    else:
        main()
