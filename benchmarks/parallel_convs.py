"""fuse-parallel-convs on networks trained with parallel Conv branches, exported as trained.

    PYTHONPATH=. .venv/bin/python benchmarks/parallel_convs.py --out pc [--budget 40]

Builds, with seeded random weights and trained-like BatchNorm statistics:

- ``repvgg-a0``: RepVGG-A0 (stages of 1, 2, 4, 14, 1 blocks, widths 48-1280) in its training
  form, each block a 3x3 Conv + BN, a 1x1 Conv + BN and (stride 1, same width) an identity BN,
  summed, ReLU; 224 x 224;
- ``textnet``: transformers' TextNet (FAST's backbone, ``TextNetConfig()``: 3x3, 3x1 and 1x3
  branches), 640 x 640;

exports each with TorchScript (opset 17, dynamic batch and image size), optimizes it at -O2 with
validation, and again with ``--disable fuse-parallel-convs``, then times the export against both
with ``onnxopt bench`` (ORT CPU, ENABLE_ALL, interleaved, CPU clock, 2 threads): the optimized
row against the ``no-parallel`` row is what the merge alone is worth.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt


def _trained_like(module: Any) -> Any:
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                assert layer.running_mean is not None and layer.running_var is not None
                layer.running_mean.uniform_(-0.5, 0.5)
                layer.running_var.uniform_(0.5, 2.0)
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.2, 0.2)
    return module.eval()


def repvgg(depths: tuple[int, ...], widths: tuple[int, ...], classes: int = 0) -> Any:
    """RepVGG in its training form: each block a 3x3 Conv + BN, a 1x1 Conv + BN and (stride 1,
    same width) an identity BN, summed, ReLU; each stage's first block has stride 2. With
    ``classes``, a pooled linear head. Trained-like BatchNorm statistics, eval mode."""
    import torch

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.dense = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                                       nn.BatchNorm2d(cout))  # fmt: skip
            self.point = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(cout))  # fmt: skip
            self.skip = nn.BatchNorm2d(cout) if cin == cout and stride == 1 else None

        def forward(self, x: Any) -> Any:
            y = self.dense(x) + self.point(x)
            return torch.relu(y if self.skip is None else y + self.skip(x))

    blocks: list[Any] = []
    cin = 3
    for depth, width in zip(depths, widths, strict=True):
        for i in range(depth):
            blocks.append(Block(cin, width, 2 if i == 0 else 1))
            cin = width
    if classes:
        blocks += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    torch.manual_seed(0)
    return _trained_like(nn.Sequential(*blocks))


def repvgg_a0() -> tuple[Any, Any, int]:
    import torch

    net = repvgg((1, 2, 4, 14, 1), (48, 48, 96, 192, 1280), classes=1000)
    return net, torch.rand(1, 3, 224, 224), 224


def textnet() -> tuple[Any, Any, int]:
    import torch
    from transformers import TextNetConfig, TextNetModel

    torch.manual_seed(0)
    model = TextNetModel(TextNetConfig())

    class Backbone(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values).last_hidden_state

    return _trained_like(Backbone()), torch.rand(1, 3, 640, 640), 640


MODELS = {"repvgg-a0": repvgg_a0, "textnet": textnet}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budget", type=float, default=40.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    onnxopt = [sys.executable, "-m", "onnxopt"]
    for name in args.models.split(","):
        module, image, size = MODELS[name]()
        path = args.out / f"{name}.onnx"
        axes = {0: "batch", 2: "height", 3: "width"}
        torch.onnx.export(module, (image,), path, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": axes}, opset_version=17, dynamo=False)  # fmt: skip
        optimized, plain = args.out / f"{name}.opt.onnx", args.out / f"{name}.noparallel.onnx"
        subprocess.run([*onnxopt, "optimize", str(path), "-o", str(optimized)], check=True)
        subprocess.run([*onnxopt, "optimize", str(path), "-o", str(plain), "--disable",
                        "fuse-parallel-convs", "--no-validate"], check=True)  # fmt: skip
        print(f"\n## {name} ({size} x {size})\n", flush=True)
        subprocess.run([*onnxopt, "bench", str(path), "--optimized", str(optimized), "--compare",
                        f"no-parallel={plain}", "--shape", f"x:1x3x{size}x{size}", "--budget",
                        str(args.budget), "--clock", "cpu", "--threads", "2", "--no-memory"],
                       check=True)  # fmt: skip


if __name__ == "__main__":
    main()
