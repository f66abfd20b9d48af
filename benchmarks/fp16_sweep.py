"""Half-precision models through the whole pipeline: export, optimize at each level and target, validate.

Six fp16 sources per model (trained-like parameters, see ``benchmarks/trained_like.py``):

- ``ts-half`` / ``dynamo-half``: ``module.half()`` (float inputs halved) exported by the TorchScript /
  dynamo exporter (torch on CPU lacks some fp16 kernels: such exports fail in torch and are listed);
- ``ts-conv`` / ``dynamo-conv``: the float32 export converted to float16 by ONNX Runtime's converter
  (``scripts/convert_fp16.py``; float32 islands behind Casts where its block list says so);
- ``ts-conv-io32`` / ``dynamo-conv-io32``: the same with float32 inputs and outputs (the converter's
  ``keep_io_types``: the model computes in float16 behind Casts at its edges);
- ``ts-half-bn`` (CNNs): the TorchScript half export without the exporter's constant folding, so
  that BatchNormalization is left for fuse-conv-bn.

Each is optimized at -O1/-O2/-O3 with ``--target ort`` and ``--target onnx --opset 23`` and
validated on ONNX Runtime CPU against the fp16 original (fp16 tolerances, see ``onnxopt.validate``).

    PYTHONPATH=. python benchmarks/fp16_sweep.py [bert-tiny ...] [--out DIR] [--levels 1 2 3]

prints a markdown table: export, level, target, nodes before/after, fused ops, validated, max error.
A factory can also be exported by name: ``onnxopt export benchmarks.fp16_sweep:bert_tiny -o b.onnx``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's onnxopt and scripts

MODELS = (
    "bert-tiny",
    "distilbert-tiny",
    "gpt2-tiny",
    "llama-tiny",
    "vit-tiny",
    "whisper-encoder-tiny",
    "resnet50-tiny",
    "mobilenet-v2-tiny",
)
CNNS = ("resnet50-tiny", "mobilenet-v2-tiny")
FUSED = (
    "MultiHeadAttention",
    "Attention",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
    "Gelu",
    "BiasGelu",
    "FastGelu",
    "FusedConv",
    "FusedMatMul",
    "Gemm",
)


def _half(name: str) -> Callable[[], Any]:
    from onnxopt.export import _import_factory

    trained_like = _import_factory("benchmarks.trained_like:" + name.replace("-", "_"))

    @functools.wraps(trained_like)
    def build() -> Any:
        module, inputs, dynamic = trained_like()
        halved = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
        return module.half(), halved, dynamic

    return build


def __getattr__(attribute: str) -> Callable[[], Any]:
    """``bert_tiny`` -> the trained-like zoo ``bert-tiny`` in float16."""
    from onnxopt.zoo import ZOO

    name = attribute.replace("_", "-")
    if name not in ZOO:
        raise AttributeError(attribute)
    return _half(name)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:110].replace("|", "/")


def _export_unfolded(name: str, path: Path) -> None:
    """TorchScript export of the half-precision ``name`` without the exporter's constant folding:
    BatchNormalization stays, so fuse-conv-bn folds it (the exporters fold it themselves otherwise)."""
    import torch

    module, inputs, dynamic = _half(name)()
    torch.onnx.export(
        module,
        tuple(inputs.values()),
        str(path),
        dynamo=False,
        do_constant_folding=False,
        input_names=list(inputs),
        dynamic_axes={k: dict(v) for k, v in dynamic.items()},
    )


def sources(name: str, out: Path) -> list[tuple[str, Path | str]]:
    """The fp16 files of ``name`` (or the error that stopped one), exported once into ``out``."""
    from onnxopt.export import export
    from scripts.convert_fp16 import convert

    made: list[tuple[str, Path | str]] = []
    module = name.replace("-", "_")
    for exporter, short in (("torchscript", "ts"), ("dynamo", "dynamo")):
        half = out / f"{name}.{short}-half.onnx"
        try:
            if not half.is_file():
                export(f"benchmarks.fp16_sweep:{module}", half, exporter=exporter)  # type: ignore[arg-type]
            made.append((f"{short}-half", half))
        except Exception as exc:
            made.append((f"{short}-half", f"export: {_first_line(exc)}"))
        single = out / f"{name}.{short}-fp32.onnx"
        for suffix, keep_io_types in (("conv", False), ("conv-io32", True)):
            converted = out / f"{name}.{short}-{suffix}.onnx"
            try:
                if not converted.is_file():
                    if not single.is_file():
                        export(f"benchmarks.trained_like:{module}", single, exporter=exporter)  # type: ignore[arg-type]
                    convert(single, converted, keep_io_types=keep_io_types)
                made.append((f"{short}-{suffix}", converted))
            except Exception as exc:
                made.append((f"{short}-{suffix}", f"convert: {_first_line(exc)}"))
    if name in CNNS:
        unfolded = out / f"{name}.ts-half-bn.onnx"
        try:
            if not unfolded.is_file():
                _export_unfolded(name, unfolded)
            made.append(("ts-half-bn", unfolded))
        except Exception as exc:
            made.append(("ts-half-bn", f"export: {_first_line(exc)}"))
    return made


def row(name: str, source: str, path: Path, level: int, target: str) -> str:
    from onnxopt.api import optimize

    opset = 23 if target == "onnx" else None
    label = f"{target}" + (" opset 23" if opset else "")
    try:
        result = optimize(path, level=level, target=target, opset=opset, find_reference=True)  # type: ignore[arg-type]
    except Exception as exc:
        return f"| {name} | {source} | -O{level} | {label} | error: {_first_line(exc)} | | | | |"
    counts = Counter(node.op_type for node in result.model.graph)
    fused = ", ".join(f"{op} {counts[op]}" for op in FUSED if counts[op])
    validation = result.report.validation
    if validation is None:
        verdict, error = "-", "-"
    else:
        verdict = "yes" if validation.passed else "NO: " + "; ".join(validation.errors)[:100]
        error = f"{max((o.max_abs for o in validation.outputs), default=0.0):.2g}"
    ref = result.report.reference
    eager = "-" if ref is None else f"{ref.export_passed}/{ref.optimized_passed}"
    return (
        f"| {name} | {source} | -O{level} | {label} | {result.report.before.nodes} "
        f"| {result.report.after.nodes} | {fused} | {verdict} | {error} | {eager} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", type=Path, default=None, help="export folder (reused if given)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--targets", nargs="+", default=["ort", "onnx"], choices=("ort", "onnx"))
    args = parser.parse_args()
    # export() imports the factories by name: let it find this module, not a fresh second copy.
    sys.modules.setdefault("benchmarks.fp16_sweep", sys.modules[__name__])
    out = args.out or Path(tempfile.mkdtemp(prefix="fp16_sweep_"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        "| model | export | level | target | nodes | optimized | fused | validated "
        "| max abs error | vs eager (export/optimized) |"
    )
    print("|---|---|---|---|---:|---:|---|---|---:|---|")
    for name in args.models:
        for source, path in sources(name, out):
            if isinstance(path, str):
                print(f"| {name} | {source} | | | {path} | | | | | |", flush=True)
                continue
            for level in args.levels:
                for target in args.targets:
                    print(row(name, source, path, level, target), flush=True)


if __name__ == "__main__":
    main()
