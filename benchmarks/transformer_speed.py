"""Speed of the full-size transformer zoo after each optimizer, all timed in the same interleaved rounds.

    nice .venv/bin/python benchmarks/transformer_speed.py --zoo zoo --budget 40 --out speed.md

For every exported model (``zoo/<model>.<exporter>.onnx``, written by ``make models``): each tool
optimizes it in a child process (``compare_tools.run_tool``), then one ``onnxopt bench`` run times the
original, onnxopt's output and every other tool's output (``--compare``) in the same rounds, in a
fresh random order each round, at ORT_ENABLE_ALL (what a deployment runs) with 2 intra-op threads.
Each speed-up is the median of per-round ratios original/variant with its 95% interval (sessions
recreated during the run, block bootstrap). Because all variants share each round, a slow phase of
a busy machine hits them all: their ratios are comparable with one another.

The table also gives the geometric mean of onnxopt's speed-ups and, per model, onnxopt's ratio to
the best other tool (> 1: onnxopt is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import compare_tools  # noqa: E402  (the tool runners, each in a child process)

MODELS = ("bert", "distilbert", "gpt2", "llama", "vit", "whisper-encoder")
EXPORTERS = ("torchscript", "dynamo")
OTHERS = ("ort-transformers", "onnxscript")


def bench(original: Path, files: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """One interleaved run: original vs every file; returns {label: speed-up interval dict}."""
    command = [sys.executable, "-m", "onnxopt", "bench", str(original)]
    command += ["--optimized", str(files["onnxopt"])]
    for label, path in files.items():
        if label != "onnxopt":
            command += ["--compare", f"{label}={path}"]
    command += ["--ort-level", "all", "--threads", str(args.threads), "--budget", str(args.budget)]
    command += ["--clock", args.clock, "--no-memory", "--json"]
    done = subprocess.run(
        command, capture_output=True, text=True, env=compare_tools._env(), check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(compare_tools._last_line(done.stderr) or f"exit {done.returncode}")
    report = json.loads(done.stdout)
    found: dict[str, Any] = {}
    for variant in report["points"][0]["groups"][0]["variants"]:
        if variant["name"] == "original":
            continue
        label = "onnxopt" if variant["name"] == "optimized" else variant["name"]
        found[label] = {
            "speedup": variant["speedup"],
            "agrees": (variant["vs_original"] or {}).get("passed"),
        }
    return found


def optimize_variant(source: Path, out: Path, flags: str) -> str | None:
    """``onnxopt optimize`` with extra flags (validated, as a user runs it); an error line or None."""
    command = [sys.executable, "-m", "onnxopt", "optimize", str(source), "-o", str(out)]
    command += [*shlex.split(flags), "--no-reference"]
    done = subprocess.run(
        command, capture_output=True, text=True, env=compare_tools._env(), check=False, cwd=ROOT
    )
    return None if done.returncode == 0 else compare_tools._last_line(done.stderr)


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    ratio = entry["speedup"]
    text = f"{ratio['median']:.3f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
    return text if entry["agrees"] is not False else f"{text} (outputs differ)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--zoo", type=Path, default=ROOT / "zoo", help="folder of exported models")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--tools", default=",".join(OTHERS), help="other tools to compare with")
    parser.add_argument("--budget", type=float, default=40.0, help="seconds of timing per model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--workdir", type=Path, help="keep the optimized models here")
    parser.add_argument("--out", type=Path, help="write the markdown table here")
    parser.add_argument(
        "--prepare", action="store_true", help="only optimize into --workdir (no timing)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="also time onnxopt run with these optimize flags, e.g. "
        "'no-qkv-merge=--disable merge-qkv-projections' (repeatable)",
    )
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    others = [*variants, *(t for t in args.tools.split(",") if t)]
    start = time.perf_counter()
    rows: list[str] = []
    onnxopt_ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="transformer-speed-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for model in args.models.split(","):
            for exporter in args.exporters.split(","):
                source = args.zoo / f"{model}.{exporter}.onnx"
                if not source.exists():
                    print(f"skipping {source}: not exported", file=sys.stderr)
                    continue
                files: dict[str, Path] = {}
                notes: list[str] = []
                for tool in others if args.prepare else ["onnxopt", *others]:
                    out = workdir / f"{model}.{exporter}.{tool}.onnx"
                    print(f"{model} {exporter}: {tool} ...", file=sys.stderr, flush=True)
                    if out.exists() and args.workdir:
                        files[tool] = out
                        continue
                    if tool in variants:
                        error = optimize_variant(source, out, variants[tool])
                    else:
                        error = compare_tools.run_tool(tool, source, out).error
                    if error:
                        notes.append(f"{tool} failed: {error}")
                    else:
                        files[tool] = out
                if args.prepare:
                    continue
                if "onnxopt" not in files:
                    rows.append(f"| {model} | {exporter} | failed | | | {'; '.join(notes)} |")
                    continue
                print(f"{model} {exporter}: timing {len(files)} variants", file=sys.stderr)
                try:
                    found = bench(source, files, args)
                except RuntimeError as exc:
                    rows.append(f"| {model} | {exporter} | bench failed: {exc} | | | |")
                    continue
                mine = found["onnxopt"]["speedup"]["median"]
                onnxopt_ratios.append(mine)
                best = max(
                    (
                        found[t]["speedup"]["median"]
                        for t in others
                        if t in found and t not in variants
                    ),
                    default=None,
                )
                versus = "-" if best is None else f"{mine / best:.3f}"
                cells = " | ".join(_cell(found.get(t)) for t in others)
                rows.append(
                    f"| {model} | {exporter} | {_cell(found['onnxopt'])} | {cells} | {versus} |"
                )
                print(rows[-1], file=sys.stderr, flush=True)
    import onnxruntime as ort

    header = "| model | exporter | onnxopt | " + " | ".join(others) + " | onnxopt / best other |"
    lines = [header, "|---|---|" + "---:|" * (len(others) + 2), *rows]
    if onnxopt_ratios:
        gmean = math.exp(sum(math.log(r) for r in onnxopt_ratios) / len(onnxopt_ratios))
        lines.append("")
        lines.append(
            f"Geometric mean of onnxopt's speed-ups over {len(onnxopt_ratios)} exports: {gmean:.3f}×."
        )
    lines.append(
        f"ORT {ort.__version__} CPU, ORT_ENABLE_ALL, {args.threads} threads, {args.clock} clock, "
        f"{args.budget:g} s of interleaved rounds per model, batch 1 × 128 tokens (ViT 224², Whisper "
        f"80 × 3000); medians of per-round ratios original/variant, 95% intervals. "
        f"{(time.perf_counter() - start) / 60:.0f} min, `benchmarks/transformer_speed.py`."
    )
    table = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
