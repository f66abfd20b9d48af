"""Zoo models with every parameter perturbed, so that none is the constant its initializer wrote.

transformers and torchvision initialize biases to 0 and normalization scales to 1. A trained model
has neither, and an optimizer that deletes zero biases or unit scales gets a cheaper graph on the
zoo than on a real checkpoint, and leaves its bias-carrying fusion paths (MultiHeadAttention's bias
input, bias + Gelu, Conv bias folding) untested by the exports. These factories build the zoo model,
then add seeded noise (std 0.02) to every parameter whose elements are all equal
(``onnxopt.zoo._common.perturb_constant_parameters``).

    PYTHONPATH=. python benchmarks/trained_like.py [bert-tiny gpt2-tiny ...] [--out DIR]

exports each named tiny zoo model with both exporters (``--attention sdpa``: with transformers'
default attention instead of the zoo's eager one), optimizes it (-O2, validated against ORT
and against eager PyTorch) and prints node counts and fused ops. A factory can also be exported by
name: ``onnxopt export benchmarks.trained_like:bert_tiny -o bert.onnx``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

FUSED = (
    "MultiHeadAttention",
    "Attention",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "Gelu",
    "BiasGelu",
    "FastGelu",
    "FusedConv",
    "FusedMatMul",
    "Gemm",
)


ATTENTION = {"implementation": "eager"}  # set by --attention before the factories run


def _trained_like(name: str) -> Callable[[], Any]:
    from onnxopt.export import _import_factory
    from onnxopt.zoo import ZOO
    from onnxopt.zoo._common import perturb_constant_parameters

    factory = _import_factory(ZOO[name].factory)

    @functools.wraps(factory)
    def build() -> Any:
        module, inputs, dynamic = factory()
        inner = getattr(module, "model", None)  # the zoo's wrapper around a transformers model
        if ATTENTION["implementation"] != "eager" and hasattr(inner, "set_attn_implementation"):
            inner.set_attn_implementation(ATTENTION["implementation"])
        return perturb_constant_parameters(module), inputs, dynamic

    return build


def __getattr__(attribute: str) -> Callable[[], Any]:
    """``bert_tiny`` -> the zoo's ``bert-tiny`` with perturbed parameters."""
    from onnxopt.zoo import ZOO

    name = attribute.replace("_", "-")
    if name not in ZOO:
        raise AttributeError(attribute)
    return _trained_like(name)


def main() -> None:
    from onnxopt.api import optimize
    from onnxopt.export import export

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models",
        nargs="*",
        default=[
            "bert-tiny",
            "distilbert-tiny",
            "gpt2-tiny",
            "llama-tiny",
            "vit-tiny",
            "whisper-encoder-tiny",
            "convnext-tiny-tiny",
            "resnet50-tiny",
            "mobilenet-v2-tiny",
        ],
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--attention",
        default="eager",
        choices=("eager", "sdpa"),
        help="transformers' attention implementation (the zoo uses eager; sdpa is transformers' default)",
    )
    args = parser.parse_args()
    ATTENTION["implementation"] = args.attention
    # export() imports the factories by name: let it find this module (and the setting above),
    # not a second copy of the file imported afresh with the default attention.
    sys.modules.setdefault("benchmarks.trained_like", sys.modules[__name__])
    out = args.out or Path(tempfile.mkdtemp(prefix="trained_like_"))
    out.mkdir(parents=True, exist_ok=True)
    print("| model | exporter | nodes | optimized | validated | vs eager | fused |")
    print("|---|---|---:|---:|---|---|---|")
    for name in args.models:
        for exporter in ("torchscript", "dynamo"):
            path = out / f"{name}.{exporter}.{args.attention}.onnx"
            spec = f"benchmarks.trained_like:{name.replace('-', '_')}"
            try:
                export(spec, path, exporter=exporter)  # type: ignore[arg-type]
                result = optimize(path, find_reference=True)
            except Exception as exc:  # report and go on: this is a survey
                print(
                    f"| {name} | {exporter} | error: {str(exc).splitlines()[0][:120]} | | | | |",
                    flush=True,
                )
                continue
            counts = Counter(node.op_type for node in result.model.graph)
            fused = ", ".join(f"{op} {counts[op]}" for op in FUSED if counts[op])
            ref = result.report.reference
            eager = "-" if ref is None else f"{ref.export_passed}/{ref.optimized_passed}"
            print(
                f"| {name} | {exporter} | {result.report.before.nodes} | {result.report.after.nodes} "
                f"| {result.validated} | {eager} | {fused} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
