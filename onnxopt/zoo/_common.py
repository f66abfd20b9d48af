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
