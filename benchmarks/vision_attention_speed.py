"""Vision encoders whose attention fuses from packed [B, T, H, d] rows: export, optimize, time.

    nice .venv/bin/python benchmarks/vision_attention_speed.py --workdir vision --budget 240

- ``sam2-hiera-tiny``: SAM2.1 hiera-tiny's image encoder as transformers configures it by default
  (Hiera with stages of 1, 2, 7 and 2 blocks, 1 to 8 heads, windows of 8, 4, 14 and 7 tokens a
  side, global attention in three blocks, and the FPN neck), one 1024 x 1024 image;
- ``levit-128``: LeViT-128 (transformers' default LevitConfig: V's heads twice as wide as K's, a
  learned position bias), one 224 x 224 image;
- ``sam-vit-base``: the first SAM's ViT-B image encoder (transformers' default SamVisionConfig:
  12 blocks of 12 heads, windows of 14 x 14 tokens, global attention in four blocks, decomposed
  relative positions; SDPA, transformers' default), one 1024 x 1024 image;
- ``vitdet-base``: ViTDet-B as Detectron2 runs it on 1024 x 1024 images (windows of 14, global
  attention in blocks 2, 5, 8 and 11, decomposed relative positions);
- ``dinov3-vits16``: DINOv3 ViT-S/16 (12 blocks of 6 heads, 4 register tokens, 2-D RoPE on the
  patch tokens), one 224 x 224 image.

The last two run TorchScript only (torch.export cannot export SAM's SDPA view) and are timed
against the export in two runs, one per variant (three sessions of them outgrow 24 GiB).

Seeded random weights. Exported by both PyTorch exporters (TorchScript with a dynamic batch;
dynamo at the example's shapes, since torch.export refuses a dynamic batch for SAM2), optimized by
``onnxopt optimize`` (validated) and again with ``--disable fuse-attention``; the export and both
outputs are timed in the same interleaved rounds of one ``onnxopt bench`` run, ORT_ENABLE_ALL,
2 threads, process CPU time. Cells: median of per-round speed-ups over the export, 95% interval.
A factory alone: ``onnxopt export benchmarks.vision_attention_speed:hiera_tiny -o sam2.onnx``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audio_speed import model_args, onnxopt, optimize_variants, speedup_cells


def _image_model(model: Any, size: int) -> Any:
    import torch

    from onnxopt.zoo._common import perturb_constant_parameters
    from onnxopt.zoo.transformers_models import _Outputs

    wrapped = _Outputs(model, ("pixel_values",), ("last_hidden_state",))
    inputs = {"pixel_values": torch.randn(1, 3, size, size)}
    return perturb_constant_parameters(wrapped).eval(), inputs, {"pixel_values": {0: "batch"}}


def hiera_tiny() -> Any:
    import torch
    from transformers import Sam2VisionConfig, Sam2VisionModel

    torch.manual_seed(0)
    return _image_model(Sam2VisionModel(Sam2VisionConfig()), 1024)


def levit_128() -> Any:
    import torch
    from transformers import LevitConfig, LevitModel

    torch.manual_seed(0)
    return _image_model(LevitModel(LevitConfig()), 224)


def sam_vit_base() -> Any:
    import torch
    from transformers import SamVisionConfig, SamVisionModel

    torch.manual_seed(0)
    # transformers initializes SAM's weights at std 1e-10: the attention would not reach the output
    return _image_model(SamVisionModel(SamVisionConfig(initializer_range=0.02)), 1024)


def vitdet_base() -> Any:
    import torch
    from transformers import VitDetConfig, VitDetModel

    torch.manual_seed(0)
    config = VitDetConfig(
        image_size=1024,
        window_size=14,
        window_block_indices=[0, 1, 3, 4, 6, 7, 9, 10],
        use_relative_position_embeddings=True,
    )
    return _image_model(VitDetModel(config), 1024)


def dinov3_vits16() -> Any:
    import torch
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(0)
    # ViT-S/16 as released: 12 blocks of 6 heads, 4 register tokens, 2-D RoPE on the patches
    return _image_model(DINOv3ViTModel(DINOv3ViTConfig(num_register_tokens=4)), 224)


# Three ORT sessions of these at 1024 x 1024 outgrew 24 GiB (the bench was killed): each variant
# is timed against the export in its own run, onnxopt's output then the unfused one.
TWO_AT_A_TIME = {"sam-vit-base", "vitdet-base"}
MODELS = {
    "sam2-hiera-tiny": "hiera_tiny",
    "levit-128": "levit_128",
    "sam-vit-base": "sam_vit_base",
    "vitdet-base": "vitdet_base",
    "dinov3-vits16": "dinov3_vits16",
}


def main() -> None:
    args = model_args(__doc__, "vision", MODELS, 60.0)
    print("| model | exporter | nodes | attention fused | onnxopt | without fuse-attention |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            print(f"| {name} | {exporter} | {_row(args.workdir, name, exporter, args.budget)} |",
                  flush=True)  # fmt: skip


def _row(workdir: Path, name: str, exporter: str, budget: float) -> str:
    source = workdir / f"{name}.{exporter}.onnx"
    if not source.exists():
        print(f"exporting {source} ...", file=sys.stderr, flush=True)
        static = ["--static"] if exporter == "dynamo" else []
        factory = f"benchmarks.vision_attention_speed:{MODELS[name]}"
        done = onnxopt("export", factory, "-o", str(source), "--exporter", exporter, *static)
        if done.returncode != 0:
            raise SystemExit(f"export {source}: {done.stderr.strip().splitlines()[-1]}")
    outputs = optimize_variants(source, {"onnxopt": [], "unfused": ["--disable", "fuse-attention"]})
    optimized, unfused = str(outputs["onnxopt"][0]), str(outputs["unfused"][0])
    if name in TWO_AT_A_TIME:
        cells = _bench(source, optimized, budget)
        cells["unfused"] = _bench(source, unfused, budget).get("optimized", "-")
    else:
        cells = _bench(source, optimized, budget, "--compare", f"unfused={unfused}")
    report = outputs["onnxopt"][1]
    nodes = f"{report['before']['nodes']} → {report['after']['nodes']}"
    fused = report["after"]["op_counts"].get("com.microsoft::MultiHeadAttention", 0)
    return f"{nodes} | {fused} | {cells.get('optimized', '-')} | {cells.get('unfused', '-')}"


def _bench(source: Path, optimized: str, budget: float, *more: str) -> dict[str, str]:
    """``onnxopt bench`` of the export against ``optimized`` (and ``more`` variants): the cells."""
    bench = onnxopt(
        "bench", str(source), "--optimized", optimized, *more, "--ort-level", "all",
        "--threads", "2", "--budget", str(budget), "--clock", "cpu", "--no-memory", "--json",
    )  # fmt: skip
    if bench.returncode != 0:
        lines = bench.stderr.strip().splitlines() or [f"exit status {bench.returncode}"]
        raise SystemExit(f"bench {source}: {lines[-1]}")
    return speedup_cells(bench.stdout)


if __name__ == "__main__":
    main()
