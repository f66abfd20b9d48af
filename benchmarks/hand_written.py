"""Transformers as people write them by hand, for ``onnxopt export`` and the probes.

``annotated_transformer`` is the encoder-decoder of "The Annotated Transformer" as its tutorial
writes it: separate Q/K/V projections, ``scores.masked_fill(mask == 0, -1e9)`` with a source
padding mask and a padded causal target mask, cross-attention on the encoder's memory, and its
LayerNorm ``a * (x - mean) / (x.std() + eps) + b`` (the unbiased std, eps outside the root: not
LayerNormalization). Seeded random weights, norms' scales and shifts perturbed; nothing is
downloaded.

    onnxopt export benchmarks.hand_written:annotated_transformer -o at.onnx --exporter dynamo

``annotated_transformer`` is the paper's base size (6 + 6 layers, d=512, 8 heads, FFN 2048,
vocabulary 1000) on 1 x 128 source and target tokens; ``annotated_transformer_tiny`` is 2 + 2
layers of d=32 on 2 x 7 / 2 x 6 tokens.
"""

from __future__ import annotations

import math
from typing import Any


def _annotated(width: int, heads: int, layers: int, ffn: int, vocab: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def attend(q: Any, k: Any, v: Any, mask: Any) -> Any:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return scores.masked_fill(mask == 0, -1e9).softmax(dim=-1) @ v

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(width, width) for _ in range(4))

        def forward(self, query: Any, memory: Any, mask: Any) -> Any:
            b = query.size(0)
            q, k, v = (
                f(x).view(b, -1, heads, width // heads).transpose(1, 2)
                for f, x in zip(self.lin, (query, memory, memory), strict=False)
            )
            y = attend(q, k, v, mask.unsqueeze(1)).transpose(1, 2).contiguous()
            return self.lin[3](y.view(b, -1, width))

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(1 + 0.1 * torch.randn(width))
            self.b = nn.Parameter(0.1 * torch.randn(width))

        def forward(self, x: Any) -> Any:
            mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
            return self.a * (x - mean) / (std + 1e-6) + self.b

    class Layer(nn.Module):
        def __init__(self, cross: bool) -> None:
            super().__init__()
            self.self_attn = Heads()
            self.ff = nn.Sequential(nn.Linear(width, ffn), nn.ReLU(), nn.Linear(ffn, width))
            self.cross = Heads() if cross else None
            self.norms = nn.ModuleList(Norm() for _ in range(3 if cross else 2))

        def forward(self, x: Any, mask: Any, memory: Any = None, memory_mask: Any = None) -> Any:
            y = self.norms[0](x)
            x = x + self.self_attn(y, y, mask)
            if self.cross is not None:
                x = x + self.cross(self.norms[1](x), memory, memory_mask)
            return x + self.ff(self.norms[-1](x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.src_embed, self.tgt_embed = nn.Embedding(vocab, width), nn.Embedding(vocab, width)
            self.encoder = nn.ModuleList(Layer(False) for _ in range(layers))
            self.decoder = nn.ModuleList(Layer(True) for _ in range(layers))
            self.norm = Norm()

        def forward(self, src: Any, tgt: Any, src_pad: Any) -> Any:
            src_mask = (src_pad != 0).unsqueeze(-2)
            steps = tgt.size(1)
            later = torch.triu(torch.ones(1, steps, steps), diagonal=1).type(torch.uint8) == 0
            tgt_mask = (tgt != 0).unsqueeze(-2) & later
            x = self.src_embed(src) * math.sqrt(width)
            for layer in self.encoder:
                x = layer(x, src_mask)
            y = self.tgt_embed(tgt) * math.sqrt(width)
            for layer in self.decoder:
                y = layer(y, tgt_mask, x, src_mask)
            return self.norm(y)

    return Model().eval()


def _inputs(vocab: int, batch: int, src_len: int, tgt_len: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(1)
    src_pad = torch.ones(batch, src_len, dtype=torch.int64)
    if batch > 1:
        src_pad[1, src_len - 2 :] = 0  # the second source right-padded
    return {
        "src": torch.randint(1, vocab, (batch, src_len), generator=generator),
        "tgt": torch.randint(1, vocab, (batch, tgt_len), generator=generator),
        "src_pad": src_pad,
    }


_AXES = {
    "src": {0: "batch", 1: "seq"},
    "tgt": {0: "batch", 1: "tgt_seq"},
    "src_pad": {0: "batch", 1: "seq"},
}


def annotated_transformer() -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    module = _annotated(width=512, heads=8, layers=6, ffn=2048, vocab=1000)
    return module, _inputs(1000, 1, 128, 128), _AXES


def annotated_transformer_tiny() -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    module = _annotated(width=32, heads=4, layers=2, ffn=64, vocab=50)
    return module, _inputs(50, 2, 7, 6), _AXES
