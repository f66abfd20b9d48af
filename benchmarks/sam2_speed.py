"""SAM2's image encoder (Hiera, windowed attention): export, optimize, time.

    nice .venv/bin/python benchmarks/sam2_speed.py --workdir sam2 --budget 60

SAM2.1 hiera-tiny's vision model as transformers configures it by default (Hiera with stages of
1, 2, 7 and 2 blocks, 1 to 8 heads, windows of 8, 4, 14 and 7 tokens a side, global attention in
three blocks, and the FPN neck), seeded random weights, one 1024 x 1024 image. Exported by both
PyTorch exporters (TorchScript with a dynamic batch; dynamo at the example's shapes, since
torch.export refuses a dynamic batch for this model), optimized by ``onnxopt optimize``
(validated) and again with ``--disable fuse-attention``; the export and both outputs are timed in
the same interleaved rounds of one ``onnxopt bench`` run, ORT_ENABLE_ALL, 2 threads, process CPU
time. Cells: median of per-round speed-ups over the export, 95% interval. A factory alone:
``onnxopt export benchmarks.sam2_speed:hiera_tiny -o sam2.onnx``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audio_speed import onnxopt, optimize_variants, speedup_cells

EXPORTERS = ("torchscript", "dynamo")


def hiera_tiny() -> Any:
    import torch
    from transformers import Sam2VisionConfig, Sam2VisionModel

    from onnxopt.zoo._common import perturb_constant_parameters
    from onnxopt.zoo.transformers_models import _Outputs

    torch.manual_seed(0)
    model = _Outputs(Sam2VisionModel(Sam2VisionConfig()), ("pixel_values",), ("last_hidden_state",))
    inputs = {"pixel_values": torch.randn(1, 3, 1024, 1024)}
    return perturb_constant_parameters(model).eval(), inputs, {"pixel_values": {0: "batch"}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path("sam2"))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of timing per export")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print("| exporter | nodes | attention fused | onnxopt | without fuse-attention |")
    print("|---|---:|---:|---:|---:|")
    for exporter in args.exporters.split(","):
        source = args.workdir / f"hiera-tiny.{exporter}.onnx"
        if not source.exists():
            print(f"exporting {source} ...", file=sys.stderr, flush=True)
            static = ["--static"] if exporter == "dynamo" else []
            done = onnxopt("export", "benchmarks.sam2_speed:hiera_tiny", "-o", str(source),
                           "--exporter", exporter, *static)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"export {source}: {done.stderr.strip().splitlines()[-1]}")
        variants = {"onnxopt": [], "unfused": ["--disable", "fuse-attention"]}
        outputs = optimize_variants(source, variants)
        bench = onnxopt(
            "bench", str(source), "--optimized", str(outputs["onnxopt"][0]),
            "--compare", f"unfused={outputs['unfused'][0]}", "--ort-level", "all",
            "--threads", "2", "--budget", str(args.budget), "--clock", "cpu", "--no-memory",
            "--json",
        )  # fmt: skip
        if bench.returncode != 0:
            raise SystemExit(f"bench {source}: {bench.stderr.strip().splitlines()[-1]}")
        cells = speedup_cells(bench.stdout)
        report = outputs["onnxopt"][1]
        nodes = f"{report['before']['nodes']} → {report['after']['nodes']}"
        fused = report["after"]["op_counts"].get("com.microsoft::MultiHeadAttention", 0)
        print(
            f"| {exporter} | {nodes} | {fused} | {cells.get('optimized', '-')} "
            f"| {cells.get('unfused', '-')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
