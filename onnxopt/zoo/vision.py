"""Convolutional networks and an MLP in plain PyTorch (torchvision is not a dependency).

ResNet-50, MobileNetV2 and ConvNeXt-tiny follow the published architectures layer for layer
(He et al. 2015 with the stride on the 3x3 conv as in torchvision; Sandler et al. 2018;
Liu et al. 2022), so their ONNX exports have the same node patterns as the torchvision models.
Each factory returns ``(module, inputs, dynamic_axes)``; the batch axis is dynamic.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from onnxopt.zoo._common import Factory, seeded

BATCH = {0: "batch"}


def _randomize_batchnorm(module: nn.Module) -> None:
    """Give BatchNorm non-trivial statistics, as a trained network has (fusions must not rely on 0/1)."""
    generator = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1, generator=generator)
                m.running_var.uniform_(0.5, 1.5, generator=generator)
                m.weight.uniform_(0.5, 1.0, generator=generator)
                m.bias.uniform_(-0.1, 0.1, generator=generator)


def _image(batch: int, size: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch, 3, size, size)}


# --- ResNet ---------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: Sequence[int], width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        cin = width
        for i, blocks in enumerate(layers):
            stage_width = width * 2**i
            for b in range(blocks):
                stages.append(Bottleneck(cin, stage_width, 2 if (b == 0 and i > 0) else 1))
                cin = stage_width * Bottleneck.expansion
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(pixel_values))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


@seeded
def resnet50() -> Factory:
    model = ResNet((3, 4, 6, 3))
    _randomize_batchnorm(model)
    return model, _image(2, 224), {"pixel_values": BATCH}


@seeded
def resnet50_tiny() -> Factory:
    model = ResNet((1, 1), width=8, num_classes=10)
    _randomize_batchnorm(model)
    return model, _image(2, 32), {"pixel_values": BATCH}


# --- MobileNetV2 ----------------------------------------------------------------------------


def _make_divisible(value: float, divisor: int = 8) -> int:
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


class ConvBNReLU6(nn.Sequential):
    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNReLU6(cin, hidden, kernel=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


# (expansion t, channels c, repeats n, stride s) from the paper's Table 2.
MOBILENET_V2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    def __init__(
        self,
        settings: Sequence[tuple[int, int, int, int]] = MOBILENET_V2_SETTINGS,
        width_mult: float = 1.0,
        last_channel: int = 1280,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        last = _make_divisible(last_channel * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in settings:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU6(cin, last, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.features(pixel_values)
        x = nn.functional.adaptive_avg_pool2d(x, 1)
        return self.classifier(torch.flatten(x, 1))


@seeded
def mobilenet_v2() -> Factory:
    model = MobileNetV2()
    _randomize_batchnorm(model)
    return model, _image(2, 224), {"pixel_values": BATCH}


@seeded
def mobilenet_v2_tiny() -> Factory:
    model = MobileNetV2(
        ((1, 16, 1, 1), (6, 24, 2, 2)), width_mult=0.5, last_channel=64, num_classes=10
    )
    _randomize_batchnorm(model)
    return model, _image(2, 32), {"pixel_values": BATCH}


# --- ConvNeXt -------------------------------------------------------------------------------


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over channels of an NCHW tensor (permute, normalize, permute back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(
        self,
        depths: Sequence[int],
        dims: Sequence[int],
        num_classes: int = 1000,
        layer_scale: float = 1e-6,
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = [
            nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0], eps=1e-6))
        ]
        for i, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
            if i > 0:
                stages.append(
                    nn.Sequential(
                        LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, stride=2)
                    )
                )
            stages.extend(ConvNeXtBlock(dim, layer_scale) for _ in range(depth))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.stages(pixel_values)
        return self.head(self.norm(x.mean(dim=(-2, -1))))


@seeded
def convnext_tiny() -> Factory:
    return ConvNeXt((3, 3, 9, 3), (96, 192, 384, 768)), _image(2, 224), {"pixel_values": BATCH}


@seeded
def convnext_tiny_tiny() -> Factory:
    # A larger layer scale than the 1e-6 init so that the blocks visibly contribute in tests.
    model = ConvNeXt((1, 1), (16, 32), num_classes=10, layer_scale=0.5)
    return model, _image(2, 32), {"pixel_values": BATCH}


# --- small hand-written networks ------------------------------------------------------------


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks, a residual add, global pooling and a linear classifier."""

    def __init__(self, width: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.block1 = ConvBNReLU6(3, width, stride=2)
        self.block2 = ConvBNReLU6(width, width)
        self.block3 = ConvBNReLU6(width, 2 * width, stride=2)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.block1(pixel_values)
        x = x + self.block2(x)
        x = self.block3(x)
        return self.fc(x.mean(dim=(2, 3)))


@seeded
def small_cnn() -> Factory:
    model = SmallCNN()
    _randomize_batchnorm(model)
    return model, _image(2, 32), {"pixel_values": BATCH}


@seeded
def small_cnn_tiny() -> Factory:
    model = SmallCNN(width=8)
    _randomize_batchnorm(model)
    return model, _image(2, 16), {"pixel_values": BATCH}


class MLP(nn.Module):
    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        layers: list[Any] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers += [nn.LayerNorm(b), nn.GELU()]
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


@seeded
def mlp() -> Factory:
    return MLP((784, 1024, 1024, 10)), {"features": torch.randn(4, 784)}, {"features": BATCH}


@seeded
def mlp_tiny() -> Factory:
    return MLP((16, 32, 32, 4)), {"features": torch.randn(4, 16)}, {"features": BATCH}
