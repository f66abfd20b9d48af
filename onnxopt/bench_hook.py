"""Benchmark figures for the CI thresholds; replaced by the bench package's measurement once merged."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from onnxopt.checks import Measurements


def measure_for_thresholds(model: Path, optimized: ir.Model) -> Measurements:
    return Measurements()
