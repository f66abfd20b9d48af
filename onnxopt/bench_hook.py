"""Benchmark figures for the CI thresholds (--max-latency-ratio, --max-peak-memory)."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from onnxopt import io
from onnxopt.checks import Measurements
from onnxopt.guard import temp_folder

# Enough rounds for a stable median on a quiet machine without making a CI step slow.
THRESHOLD_BUDGET_SECONDS = 20.0


def measure_for_thresholds(model: Path, optimized: ir.Model) -> Measurements:
    """Time original vs optimized interleaved on ORT CPU at ENABLE_ALL; peak memory of the optimized run.

    The latency ratio is optimized / original: the inverse of the median paired speed-up.
    """
    from onnxopt.bench.run import BenchOptions, run_bench

    with temp_folder("onnxopt-check-") as tmp:
        path = io.save_model(optimized, Path(tmp) / "optimized.onnx")
        options = BenchOptions(
            optimized=path, ort_levels=("all",), budget_seconds=THRESHOLD_BUDGET_SECONDS
        )
        report = run_bench(model, options)
    ratio = peak = None
    for point in report.points:
        for group in point.groups:
            for variant in group.variants:
                if variant.name != "optimized":
                    continue
                if variant.speedup is not None and variant.speedup.median > 0:
                    ratio = 1.0 / variant.speedup.median
                if variant.memory is not None and variant.memory.peak_bytes is not None:
                    peak = variant.memory.peak_bytes
    return Measurements(latency_ratio=ratio, peak_memory_bytes=peak)
