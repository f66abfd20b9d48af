"""Benchmarking: latency and memory of the original, the optimized model and eager PyTorch.

``run_bench(path, BenchOptions(...)) -> BenchReport``; ``render`` and ``plot`` present it. torch,
matplotlib and psutil are imported only where needed.
"""

from __future__ import annotations

from onnxopt.bench.report import BenchReport, plot, render
from onnxopt.bench.run import BenchOptions, run_bench

__all__ = ["BenchOptions", "BenchReport", "plot", "render", "run_bench"]
