"""Convert a float32 ONNX model to float16 the way users do before deploying on CUDA.

Uses ONNX Runtime's converter (``onnxruntime.transformers.float16``, the same algorithm as
onnxconverter-common's ``convert_float_to_float16``): float initializers, graph inputs/outputs and
value types become float16; ops on its block list stay float32 behind inserted Casts (the
"float32 islands" an optimizer meets in converted models).

    PYTHONPATH=. python scripts/convert_fp16.py model.onnx -o model.fp16.onnx [--keep-io-types]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def convert(source: Path, target: Path, *, keep_io_types: bool = False) -> None:
    """Write ``source`` converted to float16 to ``target`` (graph inputs/outputs too, by default)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    converted = convert_float_to_float16(model, keep_io_types=keep_io_types)
    onnx.save(converted, str(target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--keep-io-types", action="store_true", help="leave graph I/O float32")
    args = parser.parse_args()
    convert(args.model, args.output, keep_io_types=args.keep_io_types)


if __name__ == "__main__":
    main()
