"""onnxopt: an ONNX graph optimizer validated on ONNX Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from onnxopt.api import OptimizeResult, optimize

__all__ = ["OptimizeResult", "__version__", "optimize"]


def __getattr__(name: str) -> Any:
    # The API (onnx, onnx-ir, numpy: about a second to import) loads on first use, so that the
    # command's guarding parent process (onnxopt.guard) starts without it.
    if name in ("OptimizeResult", "optimize"):
        from onnxopt import api

        return getattr(api, name)
    raise AttributeError(f"module 'onnxopt' has no attribute {name!r}")
