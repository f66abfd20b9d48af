"""What a zoo factory returns, and the decorator that makes it reproducible."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

# (module in eval mode, example inputs by name, dynamic axes: {input: {axis: dim name}})
Factory = tuple[Any, Mapping[str, Any], Mapping[str, Mapping[int, str]]]


def seeded(factory: Callable[[], Factory]) -> Callable[[], Factory]:
    """Seed torch before building (weights and example inputs are the same on every call); eval mode."""

    @functools.wraps(factory)
    def build() -> Factory:
        import torch

        torch.manual_seed(0)
        module, inputs, dynamic = factory()
        return module.eval(), inputs, dynamic

    return build


def perturb_constant_parameters(module: Any, seed: int = 1, std: float = 0.02) -> Any:
    """Add seeded noise to every parameter whose elements are all equal; return ``module``.

    transformers and torchvision initialize biases to 0 and normalization scales to 1; a trained
    checkpoint has neither. Graphs exported after this carry the bias Adds and scales a real model
    has (an optimizer may delete a zero bias, and would look better on the zoo than on a checkpoint).
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(module.named_parameters(), key=lambda item: item[0]):
            flat = parameter.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                noise = torch.randn(parameter.shape, generator=generator) * std
                parameter.add_(noise.to(parameter.dtype))
    return module
