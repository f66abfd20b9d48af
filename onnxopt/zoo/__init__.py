"""The model zoo: named factories of PyTorch models with seeded random weights (nothing is downloaded).

A factory returns ``(module, inputs, dynamic_axes)``: the module in eval mode, example inputs by
name (in the order ``forward`` takes them) and, per input, the axes that may vary
(``{"input_ids": {0: "batch", 1: "sequence"}}``). Every model has a full-size variant (benchmarks)
and a ``-tiny`` one (2 layers, small hidden size; the tests use these).

This module only names the factories; torch and transformers are imported when one is built.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZooEntry:
    name: str
    factory: str  # "package.module:function"
    summary: str


_VISION = "onnxopt.zoo.vision"
_HF = "onnxopt.zoo.transformers_models"

_MODELS: tuple[tuple[str, str, str], ...] = (
    ("bert", _HF + ":bert", "BERT-base encoder, 12 layers, hidden 768"),
    ("distilbert", _HF + ":distilbert", "DistilBERT-base, 6 layers, hidden 768"),
    ("gpt2", _HF + ":gpt2", "GPT-2 small, 12 layers, hidden 768, no KV cache"),
    (
        "llama",
        _HF + ":llama",
        "LLaMA-style decoder (RoPE, RMSNorm, SwiGLU, GQA 9/3 heads), SmolLM-135M size",
    ),
    ("vit", _HF + ":vit", "ViT-B/16, 224x224"),
    (
        "whisper-encoder",
        _HF + ":whisper_encoder",
        "whisper-tiny encoder, 80 mel bins x 3000 frames",
    ),
    ("resnet50", _VISION + ":resnet50", "ResNet-50, 224x224"),
    ("mobilenet-v2", _VISION + ":mobilenet_v2", "MobileNetV2, 224x224"),
    ("convnext-tiny", _VISION + ":convnext_tiny", "ConvNeXt-T, 224x224"),
    ("small-cnn", _VISION + ":small_cnn", "three conv-BN blocks and a residual add, 32x32"),
    ("mlp", _VISION + ":mlp", "784-1024-1024-10 MLP with LayerNorm and GELU"),
)


def _entries() -> dict[str, ZooEntry]:
    entries: dict[str, ZooEntry] = {}
    for name, factory, summary in _MODELS:
        entries[name] = ZooEntry(name, factory, summary)
        entries[f"{name}-tiny"] = ZooEntry(
            f"{name}-tiny", factory + "_tiny", f"{summary} (tiny: 2 layers, small hidden)"
        )
    return entries


ZOO: dict[str, ZooEntry] = _entries()
FULL_SIZE: tuple[str, ...] = tuple(name for name, _, _ in _MODELS)
TINY: tuple[str, ...] = tuple(f"{name}-tiny" for name in FULL_SIZE)

__all__ = ["FULL_SIZE", "TINY", "ZOO", "ZooEntry"]
