"""Time a KV-cache decoder step of the zoo's full-size GPT-2 and LLaMA-style models on ORT CPU.

Each model (``onnxopt.zoo.transformers_models:gpt2`` — GPT-2 small, 12 layers — and ``:llama`` —
SmolLM-135M shape, 30 layers, 9 query / 3 KV heads) is exported with a cache by
``benchmarks/kv_sweep.py`` (TorchScript by default), optimized by onnxopt at -O2 (validated on
ORT at the timed sizes) and by onnxscript's optimizer + ORT fusions when it runs, then timed with
``onnxopt bench`` (interleaved rounds, ORT graph optimizations on, one thread, CPU clock) at

    decode: B=1, S=1, P=128        prompt: B=1, S=128, P=0

    nice PYTHONPATH=. python benchmarks/kv_decode_speed.py [--models gpt2,llama]
        [--exporter torchscript] [--budget 30] [--out DIR] [--position-ids]

(``--position-ids``: the step also takes ``position_ids [B, S]``, as Optimum's exports do;
``--merged``: the step is wrapped as Optimum's ``decoder_model_merged.onnx``, ``If(use_cache_branch)``
over two copies of it, see ``kv_sweep.merge_decoders``.)

Prints one markdown row per model and size: median ms of the original and each optimized file,
and each speed-up over the original with its 95% interval.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

from benchmarks import compare_tools, kv_sweep

MODELS = {
    "gpt2": "onnxopt.zoo.transformers_models:gpt2",
    "llama": "onnxopt.zoo.transformers_models:llama",
}
POINTS = {"decode": (1, 128, 1), "prompt": (1, 0, 128)}  # (B, P, S)
ROOT = Path(__file__).resolve().parent.parent


def _onnxopt(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "onnxopt", *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=compare_tools._env(), check=False, cwd=ROOT
    )


def run(
    name: str,
    exporter: str,
    budget: float,
    out: Path,
    positions: bool = False,
    merged: bool = False,
) -> list[str]:
    from onnxopt import io

    base = name
    if positions:
        name += "_pos"
    step = out / f"{name}_kv.{exporter}.onnx"
    if not step.exists():
        kv_sweep.export_kv(MODELS[base], exporter, step, positions=positions)
    original = step
    if merged:  # Optimum's decoder_model_merged form: If(use_cache_branch) over two copies
        name += "_merged"
        original = out / f"{name}_kv.{exporter}.onnx"
        if not original.exists():
            kv_sweep.save_merged(step, original)
    model = io.load_model(original).model
    feeds = {}
    for point, size in POINTS.items():
        (feed,) = kv_sweep.kv_inputs(model, (size,), ("ones",))
        feeds[point] = out / f"{name}_kv.{point}.npz"
        np.savez(feeds[point], **feed)
    optimized = out / f"{name}_kv.{exporter}.onnxopt.onnx"
    done = _onnxopt(
        "optimize", str(original), "-o", str(optimized), "--inputs", str(feeds["decode"])
    )
    if done.returncode != 0:
        return [f"| {name} | - | onnxopt failed: {compare_tools._last_line(done.stderr)} |"]
    compare = []
    other = out / f"{name}_kv.{exporter}.onnxscript.onnx"
    cell = compare_tools.run_tool("onnxscript", original, other)
    if cell.error is None:
        compare = ["--compare", f"onnxscript={other}"]
    rows = []
    for point, npz in feeds.items():
        done = _onnxopt(
            "bench", str(original), "--optimized", str(optimized), *compare,
            "--inputs", str(npz), "--ort-level", "all", "--threads", "1", "--clock", "cpu",
            "--budget", str(budget), "--no-memory", "--json",
        )  # fmt: skip
        if done.returncode != 0:
            rows.append(
                f"| {name} | {point} | bench failed: {compare_tools._last_line(done.stderr)} |"
            )
            continue
        report = json.loads(done.stdout)
        variants = report["points"][0]["groups"][0]["variants"]
        rows.append(_row(name, point, variants, cell.error))
    return rows


def _interval(speedup: dict[str, Any] | None) -> str:
    if not speedup:
        return "-"
    low, high = speedup.get("low"), speedup.get("high")
    span = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{speedup['median']:.3f}x{span}"


def _row(name: str, point: str, variants: list[dict[str, Any]], error: str | None) -> str:
    by_name = {v["name"]: v for v in variants}
    cells = [
        f"| {name} | {point} ({'B=1, S=1, P=128' if point == 'decode' else 'B=1, S=128, P=0'})"
    ]
    for label in ("original", "optimized", "onnxscript"):
        variant = by_name.get(label)
        if variant is None:
            cells.append(f"not run ({error})" if label == "onnxscript" and error else "-")
            continue
        cells.append(_ms(variant))
    cells.append(_interval(by_name.get("optimized", {}).get("speedup")))
    cells.append(_interval(by_name.get("onnxscript", {}).get("speedup")))
    return " | ".join(cells) + " |"


def _ms(variant: dict[str, Any]) -> str:
    latency = variant["latency"]
    return f"{latency['median'] * 1e3:.2f} (p90 {latency['p90'] * 1e3:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--exporter", default="torchscript", choices=("torchscript", "dynamo"))
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of timing per size")
    parser.add_argument("--out", type=Path, default=None, help="keep the exports here")
    parser.add_argument(
        "--position-ids", action="store_true", help="export with a position_ids [B, S] input"
    )
    parser.add_argument(
        "--merged", action="store_true", help="time the step as an Optimum merged decoder"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kv_decode_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"KV-cache step, {args.exporter} export, ORT CPU 1 thread; files in {out}\n")
    print(
        "| model | size | original ms | onnxopt ms | onnxscript ms | onnxopt speed-up "
        "| onnxscript speed-up |"
    )
    print("|---|---|---:|---:|---:|---|---|")
    for name in args.models.split(","):
        rows = run(name.strip(), args.exporter, args.budget, out, args.position_ids, args.merged)
        for row in rows:
            print(row, flush=True)


if __name__ == "__main__":
    main()
