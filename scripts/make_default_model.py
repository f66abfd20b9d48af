"""Regenerate models/default.onnx, the built-in model `make demo` optimizes.

A small plain-PyTorch network with the patterns real exports carry (Conv+BatchNorm, residual adds,
a self-attention block with LayerNorm and GELU, shape arithmetic from a dynamic batch), exported with
the TorchScript exporter. Seeded, so the file is reproducible for a given torch version.

    .venv/bin/python scripts/make_default_model.py
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class TinyHybrid(nn.Module):
    """Conv stem -> tokens -> one pre-norm transformer block -> pooled classifier."""

    def __init__(self, width: int = 64, heads: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvBlock(3, 32, 2), ConvBlock(32, width, 2), ConvBlock(width, width, 1)
        )
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b, c, h, w = x.shape
        tokens = x.reshape(b, c, h * w).transpose(1, 2)
        y = self.norm1(tokens)
        tokens = tokens + self.attn(y, y, y, need_weights=False)[0]
        tokens = tokens + self.mlp(self.norm2(tokens))
        return self.head(tokens.mean(dim=1))


def main() -> None:
    torch.manual_seed(0)
    model = TinyHybrid().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    example = torch.randn(2, 3, 32, 32)
    out = Path(__file__).resolve().parent.parent / "models" / "default.onnx"
    torch.onnx.export(
        model,
        (example,),
        str(out),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
