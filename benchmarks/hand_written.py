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
layers of d=32 on 2 x 7 / 2 x 6 tokens. ``mobilenet_v3_hand_written`` is MobileNetV3-Small with
its activations written out, ``tabular_mlp`` a fastai-style tabular MLP (a BatchNorm1d before each
hidden Linear).
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


# MobileNetV3-Small as the widely copied pre-nn.Hardswish implementations write it: h_sigmoid is
# relu6(x + 3) / 6 and h_swish x * h_sigmoid(x), the squeeze-excite gate two Linears on the pooled
# channels. (kernel, expansion, out channels, squeeze-excite, hard-swish, stride) per block.
_MOBILENET_V3_SMALL = [
    (3, 1.0, 16, True, False, 2),
    (3, 4.5, 24, False, False, 2),
    (3, 3.67, 24, False, False, 1),
    (5, 4.0, 40, True, True, 2),
    (5, 6.0, 40, True, True, 1),
    (5, 6.0, 40, True, True, 1),
    (5, 3.0, 48, True, True, 1),
    (5, 3.0, 48, True, True, 1),
    (5, 6.0, 96, True, True, 2),
    (5, 6.0, 96, True, True, 1),
    (5, 6.0, 96, True, True, 1),
]


def _round8(value: float) -> int:
    """``value`` to a multiple of 8, never more than 10% below it."""
    rounded = max(8, int(value + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * value else rounded


def _mobilenet_v3_small(classes: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)

    class HardSigmoid(nn.Module):
        def forward(self, x: Any) -> Any:
            return nn.functional.relu6(x + 3) / 6

    class HardSwish(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = HardSigmoid()

        def forward(self, x: Any) -> Any:
            return x * self.gate(x)

    def conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int, act: Any) -> Any:
        layers = [
            nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        return nn.Sequential(*layers, act) if act is not None else nn.Sequential(*layers)

    class Excite(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            hidden = _round8(channels / 4)
            self.fc = nn.Sequential(
                nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, channels), HardSigmoid()
            )

        def forward(self, x: Any) -> Any:
            b, c = x.shape[0], x.shape[1]
            return x * self.fc(x.mean((2, 3))).view(b, c, 1, 1)

    class Block(nn.Module):
        def __init__(self, cin: int, kernel: int, expand: float, cout: int, se: bool, hs: bool,
                     stride: int) -> None:  # fmt: skip
            super().__init__()
            hidden = _round8(cin * expand)
            act = HardSwish() if hs else nn.ReLU()
            layers = [] if hidden == cin else [conv_bn(cin, hidden, 1, 1, 1, act)]
            layers.append(conv_bn(hidden, hidden, kernel, stride, hidden, act))
            if se:
                layers.append(Excite(hidden))
            layers.append(conv_bn(hidden, cout, 1, 1, 1, None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers, cin = [conv_bn(3, 16, 3, 2, 1, HardSwish())], 16
            for kernel, expand, cout, se, hs, stride in _MOBILENET_V3_SMALL:
                layers.append(Block(cin, kernel, expand, cout, se, hs, stride))
                cin = cout
            layers.append(conv_bn(cin, 576, 1, 1, 1, HardSwish()))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(576, 1024), HardSwish(), nn.Linear(1024, classes))

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x).mean((2, 3)))

    model = Model().eval()
    with torch.no_grad():  # trained-like BatchNorm statistics, not a fresh one's identity
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
    return model


def mobilenet_v3_hand_written() -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    """MobileNetV3-Small, hand-written hard-sigmoid/hard-swish, 1 x 3 x 224 x 224."""
    import torch

    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return _mobilenet_v3_small(1000), {"image": image}, {"image": {0: "batch"}}


def _tabular(features: int, widths: tuple[int, ...]) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Tabular(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.randn(features))
            self.register_buffer("std", torch.rand(features) + 0.5)
            layers: list[nn.Module] = []
            for width_in, width in zip((features, *widths), widths, strict=False):
                layers += [nn.Linear(width_in, width), nn.ReLU(), nn.BatchNorm1d(width)]
                layers.append(nn.Dropout(0.1))
            self.layers = nn.Sequential(*layers, nn.Linear(widths[-1], 2))

        def forward(self, x: Any) -> Any:
            return self.layers((x - self.mean) / self.std)

    model = Tabular().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def tabular_mlp() -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    """A tabular MLP as fastai's ``TabularModel`` lays it out (``LinBnDrop`` with ``lin_first``):
    64 standardized inputs (``(x - mean) / std`` in the graph), then Linear, ReLU, BatchNorm1d,
    Dropout for widths 512 and 256, and a Linear to 2 outputs; trained-like statistics; 1 x 64."""
    import torch

    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    return _tabular(64, (512, 256)), {"x": x}, {"x": {0: "batch"}}


def tabular_mlp_tiny() -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    """``tabular_mlp`` at 8 inputs and widths 16, 16, on a batch of 4."""
    import torch

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return _tabular(8, (16, 16)), {"x": x}, {"x": {0: "batch"}}
