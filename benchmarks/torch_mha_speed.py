"""Encoders written with nn.MultiheadAttention, as users write them: export, optimize, time.

    nice .venv/bin/python benchmarks/torch_mha_speed.py --workdir torch_mha --budget 40

A 6-layer pre-norm encoder (d=512, 8 heads, FFN 2048, GELU) with a key padding mask, seeded
random weights, calling its attention three ways:

- ``weights``: ``y, _ = attn(x, x, x, key_padding_mask=pad)``. need_weights is on by default, so
  torch computes the block with bmm on heads flattened into the batch, sequence-first;
- ``no-weights``: the same with ``need_weights=False`` (torch's SDPA path);
- ``seq-first``: ``batch_first=False`` modules fed ``x.transpose(0, 1)``, weights unused.

Each is exported by the dynamo exporter with dynamic batch and sequence (the TorchScript export of
nn.MultiheadAttention runs only at its traced length), optimized by ``onnxopt optimize``
(validated) and again with the attention fusions disabled, and the export and both outputs are
timed in the same interleaved rounds of one ``onnxopt bench`` run per shape, ORT_ENABLE_ALL,
2 threads, process CPU time. Cells: median of per-round speed-ups over the export, 95% interval.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audio_speed import onnxopt, optimize_variants, speedup_cells

FORMS = ("weights", "no-weights", "seq-first")
SHAPES = ("1x256", "4x128")
UNFUSED = "fuse-attention,fuse-packed-attention"


def build(form: str) -> Any:
    import torch
    from torch import nn

    batch_first = form != "seq-first"

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(512), nn.LayerNorm(512)
            self.attn = nn.MultiheadAttention(512, 8, batch_first=batch_first)
            self.mlp = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

        def forward(self, x: Any, pad: Any) -> Any:
            h = self.norm1(x)
            h = h if batch_first else h.transpose(0, 1)
            y, _ = self.attn(h, h, h, key_padding_mask=pad, need_weights=form != "no-weights")
            x = x + (y if batch_first else y.transpose(0, 1))
            return x + self.mlp(self.norm2(x))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(6))

        def forward(self, x: Any, pad: Any) -> Any:
            for block in self.blocks:
                x = block(x, pad)
            return x

    torch.manual_seed(0)
    return Encoder().eval()


def export(form: str, path: Path) -> None:
    import torch

    x, pad = torch.randn(2, 64, 512), torch.zeros(2, 64, dtype=torch.bool)
    pad[1, 40:] = True
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
        torch.onnx.export(build(form), (x, pad), str(path), dynamo=True,
                          input_names=["x", "pad"], dynamic_shapes=(dims, dims))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path("torch_mha"))
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="BATCHxSEQUENCE,...")
    parser.add_argument("--budget", type=float, default=40.0, help="seconds of timing per shape")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print("| call | shape | nodes | onnxopt | attention unfused |")
    print("|---|---|---:|---:|---:|")
    for form in args.forms.split(","):
        source = args.workdir / f"{form}.onnx"
        if not source.exists():
            print(f"exporting {source} ...", file=sys.stderr, flush=True)
            export(form, source)
        outputs = optimize_variants(source, {"onnxopt": [], "unfused": ["--disable", UNFUSED]})
        report = outputs["onnxopt"][1]
        nodes = f"{report['before']['nodes']} → {report['after']['nodes']}"
        nodes += f" ({outputs['unfused'][1]['after']['nodes']})"
        for shape in args.shapes.split(","):
            batch, length = shape.split("x")
            bench = onnxopt(
                "bench", str(source), "--optimized", str(outputs["onnxopt"][0]),
                "--compare", f"unfused={outputs['unfused'][0]}",
                "--shape", f"x:{batch}x{length}x512", "--shape", f"pad:{batch}x{length}",
                "--ort-level", "all", "--threads", "2", "--budget", str(args.budget),
                "--clock", "cpu", "--no-memory", "--json",
            )  # fmt: skip
            if bench.returncode != 0:
                raise SystemExit(f"bench {source}: {bench.stderr.strip().splitlines()[-1]}")
            cells = speedup_cells(bench.stdout)
            print(
                f"| {form} | {shape} | {nodes} | {cells.get('optimized', '-')} "
                f"| {cells.get('unfused', '-')} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
