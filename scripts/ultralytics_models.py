"""Export Ultralytics YOLO models to ONNX as their users do, from model configs (no downloads).

``yolo export format=onnx`` is how most YOLO models reach ONNX, with options that change the
graph: ``dynamic`` (batch and image size symbolic), ``nms`` (non-maximum suppression inside the
graph), ``simplify`` (onnxslim run on the export, Ultralytics' default). Ultralytics is not a
dependency of onnxopt, and it needs torchvision, which PyPI only builds against torch's CUDA
wheels: run it in its own environment (about 6 GB):

    python -m venv /tmp/ulenv
    /tmp/ulenv/bin/pip install torch==2.14.1 torchvision==0.29.1 ultralytics onnx onnxslim onnxruntime
    /tmp/ulenv/bin/python scripts/ultralytics_models.py --out /tmp/ultralytics [--models yolo11n]

Each model is built from its YAML with seeded random weights (``YOLO("yolo11n.yaml")``; the
batch norms' statistics are redrawn so that they are not the identity) and exported at 320 × 320
in each variant: ``plain``, ``dynamic``, ``nms`` (with ``dynamic``) and ``raw`` (``simplify=False``,
the torch exporter's graph as it comes). Writes ``OUT/MODEL-VARIANT.onnx``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

MODELS = (
    "yolov8n",
    "yolo11n",
    "yolo11n-seg",
    "yolo11n-pose",
    "yolo11n-obb",
    "yolo11n-cls",
    "yolov10n",
    "yolo12n",
)
VARIANTS = {
    "plain": {},
    "dynamic": {"dynamic": True},
    "nms": {"dynamic": True, "nms": True},
    "raw": {"simplify": False},
}


def _seeded(name: str) -> object:
    import torch
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO(f"{name}.yaml")
    with torch.no_grad():
        for module in model.model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--imgsz", type=int, default=320)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in args.models.split(","):
        for variant in args.variants.split(","):
            options = VARIANTS[variant]
            if variant == "nms" and name.endswith("-cls"):
                continue  # a classifier has no boxes to suppress
            with tempfile.TemporaryDirectory() as scratch:
                try:
                    model = _seeded(name)
                    exported = model.export(
                        format="onnx", imgsz=args.imgsz, project=scratch, **options
                    )
                except Exception as exc:  # report the export's own failure, go on
                    failed.append(f"{name}-{variant}: {exc}")
                    print(f"{name}-{variant}: FAILED ({str(exc).splitlines()[0]})")
                    continue
                target = args.out / f"{name}-{variant}.onnx"
                shutil.copy(exported, target)
                print(f"{name}-{variant}: {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
