"""The differential check the per-pass fuzzers share: a seeded model through a few passes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx

import onnxopt
from onnxopt.io import model_from_proto


def check_seed(proto: onnx.ModelProto, passes: Sequence[str], name: str, seed: int) -> int:
    """Rewrites ``name`` made on ``proto`` through ``passes``, after checking the result on ORT
    (two sizes of each dynamic dim) and that a second run rewrites nothing."""
    result = onnxopt.optimize(model_from_proto(proto), passes=passes)
    report = result.report.validation
    assert report is not None and report.passed, (seed, report, onnx.printer.to_text(proto))
    again = onnxopt.optimize(result.model, passes=passes, check=False)
    totals = {pass_name: stats for pass_name, _, _, stats in again.report.pass_totals()}
    assert not totals.get(name), (seed, totals)
    made = {pass_name: stats for pass_name, _, _, stats in result.report.pass_totals()}
    return sum(made.get(name, {}).values())


def check_range(
    build: Callable[[int], onnx.ModelProto], seeds: range, passes: Sequence[str], name: str
) -> None:
    """Every seed checked; across them both rewrites and refusals occur (the generator is not
    allowed to test only one side of the pass's conditions)."""
    made = [check_seed(build(seed), passes, name, seed) for seed in seeds]
    assert any(made) and not all(made), made
