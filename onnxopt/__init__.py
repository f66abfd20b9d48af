"""onnxopt: an ONNX graph optimizer validated on ONNX Runtime."""

from __future__ import annotations

__version__ = "0.1.0"

from onnxopt.api import OptimizeResult, optimize

__all__ = ["OptimizeResult", "__version__", "optimize"]
