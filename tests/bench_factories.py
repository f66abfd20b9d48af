"""Tiny plain-PyTorch factories for the bench tests: each returns (module in eval mode, example inputs)."""

from __future__ import annotations

import torch
from torch import nn


def tiny_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).eval()
    return module, (torch.randn(2, 16),)


def not_a_module() -> int:
    return 3


class _Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + 0.1 * torch.randn_like(x))


def noisy() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Draws noise on every call: exported, a RandomNormalLike."""
    return _Noisy().eval(), (torch.randn(2, 8),)
