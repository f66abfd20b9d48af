"""Name the pass that broke a model: replay the pipeline's pass sequence and binary-search its prefixes.

Passes are deterministic, so running the first ``k`` passes of a recorded run reproduces that run's
state after ``k`` passes. The empty prefix is correct (it is the original) and the full sequence is
known bad; ``log2(n)`` probes find the first pass after which validation fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxopt import io
from onnxopt.ort_versions import requested_providers, requested_version
from onnxopt.passes.base import Pipeline
from onnxopt.passes.levels import pass_by_name
from onnxopt.passes.options import PassOptions
from onnxopt.validate import ValidationReport, input_specs, output_precisions, validate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BisectResult:
    sequence: tuple[str, ...]
    first_bad_index: int | None  # index into sequence; None when the full sequence validates
    report: ValidationReport | None  # validation right after the first bad pass
    probes: int

    @property
    def culprit(self) -> str | None:
        return None if self.first_bad_index is None else self.sequence[self.first_bad_index]

    @property
    def detail(self) -> str:
        """What the culprit broke: " (output 'y': max abs 4.65, 9/16 out of tolerance)"."""
        if self.report is None:
            return ""
        worst = max(self.report.outputs, key=lambda o: o.max_abs, default=None)
        if worst is not None:
            return (
                f" (output '{worst.name}': max abs {worst.max_abs:.3g}, "
                f"{worst.mismatches}/{worst.elements} out of tolerance)"
            )
        return f" ({self.report.errors[0]})" if self.report.errors else ""


def bisect_run(
    model_path: str | Path,
    passes_run: Sequence[str],
    options: Mapping[str, Any],
    progress: Callable[[str], None] | None = None,
) -> BisectResult:
    """bisect_passes for a run made with ``options``, the keyword arguments of
    :func:`onnxopt.optimize` (as the command line builds them)."""
    pass_options = PassOptions(
        fold_limit_bytes=options["fold_limit_bytes"],
        fold_may_grow=options["fold_may_grow"],
        target=options["target"],
        ort_version=requested_version(options.get("ort_version"), options["target"]),
        ort_providers=requested_providers(options.get("ort_providers")),
        input_shapes=dict(options["input_shapes"] or {}),
        dims=dict(options.get("dims") or {}),
    )
    return bisect_passes(
        model_path,
        passes_run,
        pass_options,
        inputs=options["inputs"],
        progress=progress,
        opset=options["opset"],
    )


def bisect_passes(
    model_path: str | Path,
    sequence: Sequence[str],
    options: PassOptions,
    *,
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    progress: Callable[[str], None] | None = None,
    opset: int | None = None,
) -> BisectResult:
    """The first pass of ``sequence`` after which ``model_path`` no longer validates.

    ``opset``: convert the model first, as ``optimize --opset`` did.
    """
    path = Path(model_path)
    probes = 0
    reports: dict[int, ValidationReport] = {}

    def passes_after(k: int) -> bool:
        nonlocal probes
        probes += 1
        if progress is not None:
            progress(f"bisect: first {k} of {len(sequence)} passes")
        model = io.load_model(path).model
        specs = input_specs(model) if inputs is None else None
        precisions = output_precisions(model)
        if opset is not None:
            model = io.convert_opset(model, opset)
        Pipeline([pass_by_name(name)(options) for name in sequence[:k]])(model)
        report = validate(
            path, model, specs=specs, inputs=inputs, precisions=precisions, sizes=options.dims
        )
        reports[k] = report
        return report.passed

    if passes_after(len(sequence)):
        return BisectResult(tuple(sequence), None, None, probes)
    good, bad = 0, len(sequence)
    while bad - good > 1:
        middle = (good + bad) // 2
        if passes_after(middle):
            good = middle
        else:
            bad = middle
    logger.info("bisect: pass %d (%s) introduced the mismatch", bad, sequence[bad - 1])
    return BisectResult(tuple(sequence), bad - 1, reports.get(bad), probes)
