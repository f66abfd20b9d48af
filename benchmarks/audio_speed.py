"""Speech encoders with a convolutional front end (wav2vec2, HuBERT): export, optimize, time.

    nice .venv/bin/python benchmarks/audio_speed.py --workdir audio --budget 40

Each model is built from its transformers config (the base size: 12 layers, hidden 768, seven
1-D Convs of 512 channels over the waveform and a 128-tap positional Conv in 16 groups) with
seeded random weights, exported by both PyTorch exporters with dynamic batch and sample count,
optimized by ``onnxopt optimize`` (validated; ``--dim samples=16000``, since the front end needs
at least 400 samples) and again with ``--disable promote-conv1d``, and then the original and both
outputs are timed in the same interleaved rounds of one ``onnxopt bench`` run at 1 x 16000
samples (one second of 16 kHz audio), ORT_ENABLE_ALL, 2 threads, process CPU time. Cells: median
of per-round speed-ups over the export, 95% interval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("wav2vec2", "hubert")
EXPORTERS = ("torchscript", "dynamo")


def build(name: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config, model = {
        "wav2vec2": (transformers.Wav2Vec2Config, transformers.Wav2Vec2Model),
        "hubert": (transformers.HubertConfig, transformers.HubertModel),
    }[name]
    return model(config()).eval()


def export(name: str, exporter: str, path: Path) -> None:
    """Export with dynamic batch and sample count; the exporters' progress goes to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        _export(name, exporter, path)


def _export(name: str, exporter: str, path: Path) -> None:
    import torch

    module = build(name)
    samples = torch.randn(1, 16000)
    if exporter == "dynamo":
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("samples", min=400)}
        torch.onnx.export(
            module,
            (samples,),
            str(path),
            dynamo=True,
            input_names=["input_values"],
            dynamic_shapes=(dims,),
        )
    else:
        torch.onnx.export(
            module,
            (samples,),
            str(path),
            dynamo=False,
            input_names=["input_values"],
            dynamic_axes={"input_values": {0: "batch", 1: "samples"}},
        )


def onnxopt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnxopt", *args], capture_output=True, text=True, cwd=ROOT
    )


def optimize_variants(
    source: Path, variants: dict[str, list[str]], *common: str
) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``onnxopt optimize`` of ``source`` once per variant (label: its flags, plus ``common``),
    written next to it as SOURCE.LABEL.onnx: {label: (output path, the --json report)}."""
    outputs = {}
    for label, flags in variants.items():
        out = source.with_suffix(f".{label}.onnx")
        done = onnxopt("optimize", str(source), "-o", str(out), "--json", *common, *flags)
        if done.returncode != 0:
            raise SystemExit(f"{source}: {done.stderr.strip().splitlines()[-1]}")
        outputs[label] = (out, json.loads(done.stdout))
    return outputs


def speedup_cells(bench_json: str) -> dict[str, str]:
    """Each timed variant's speed-up over the export in ``onnxopt bench --json`` output, as
    "median [low, high]" (the first point's first group)."""
    variants = json.loads(bench_json)["points"][0]["groups"][0]["variants"]
    cells = {}
    for variant in variants:
        ratio = variant.get("speedup")
        if ratio:
            cells[variant["name"]] = (
                f"{ratio['median']:.3f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
            )
    return cells


def model_args(
    doc: str | None, workdir: str, models: Iterable[str], budget: float
) -> argparse.Namespace:
    """The options these scripts share: --workdir (created), --models, --exporters, --budget."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path(workdir))
    parser.add_argument("--models", default=",".join(models))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--budget", type=float, default=budget, help="seconds of timing per model")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = model_args(__doc__, "audio", MODELS, 40.0)
    print("| model | exporter | nodes | onnxopt | without promote-conv1d |")
    print("|---|---|---:|---:|---:|")
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            source = args.workdir / f"{name}.{exporter}.onnx"
            if not source.exists():
                print(f"exporting {source} ...", file=sys.stderr, flush=True)
                export(name, exporter, source)
            variants = {"onnxopt": [], "without": ["--disable", "promote-conv1d"]}
            outputs = optimize_variants(source, variants, "--dim", "samples=16000")
            bench = onnxopt(
                "bench", str(source), "--optimized", str(outputs["onnxopt"][0]),
                "--compare", f"without={outputs['without'][0]}",
                "--shape", "input_values:1x16000", "--ort-level", "all", "--threads", "2",
                "--budget", str(args.budget), "--clock", "cpu", "--no-memory", "--json",
            )  # fmt: skip
            if bench.returncode != 0:
                raise SystemExit(f"bench {source}: {bench.stderr.strip().splitlines()[-1]}")
            cells = speedup_cells(bench.stdout)
            report = outputs["onnxopt"][1]
            nodes = f"{report['before']['nodes']} → {report['after']['nodes']}"
            print(
                f"| {name} | {exporter} | {nodes} | {cells.get('optimized', '-')} "
                f"| {cells.get('without', '-')} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
