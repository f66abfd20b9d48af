"""CI thresholds: compare an optimize report (and optional measurements) against user limits.

Each broken threshold becomes one line naming the threshold, the measured value and the limit, e.g.
``max-abs-error: 3.2e-04 on output 'logits' (vs original) is over the limit 1e-04``.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxopt.report import OptimizeReport, format_bytes


@dataclass(frozen=True)
class Thresholds:
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    max_latency_ratio: float | None = None
    max_peak_memory: int | None = None
    min_node_reduction: float | None = None  # a fraction: 0.1 means at least 10% fewer nodes

    @property
    def needs_benchmark(self) -> bool:
        return self.max_latency_ratio is not None or self.max_peak_memory is not None

    def any(self) -> bool:
        return any(v is not None for v in vars(self).values())


@dataclass(frozen=True)
class Measurements:
    """Figures that come from a benchmark rather than from the optimize report."""

    latency_ratio: float | None = None  # optimized / original, median of paired runs
    peak_memory_bytes: int | None = None  # of the optimized model while it runs


@dataclass(frozen=True)
class CheckResult:
    name: str
    measured: float | None
    limit: float
    passed: bool
    message: str


def _worst(report: OptimizeReport, attribute: str) -> tuple[float, str] | None:
    """Largest error over every comparison the report holds, with where it was measured."""
    candidates: list[tuple[float, str]] = []
    if report.validation is not None:
        for out in report.validation.outputs:
            candidates.append((getattr(out, attribute), f"output '{out.name}' (vs original)"))
    reference = getattr(report, "reference", None)
    if reference is not None:
        for out in getattr(reference, "optimized", ()):
            candidates.append(
                (getattr(out, attribute), f"output '{out.name}' (vs eager reference)")
            )
    if not candidates:
        return None
    return max(candidates, key=lambda c: c[0])


def _limit_check(
    name: str, measured: float | None, limit: float, where: str, fmt: str = "{:.3g}"
) -> CheckResult:
    if measured is None:
        return CheckResult(
            name,
            None,
            limit,
            False,
            f"{name}: not measured ({where}); the limit {fmt.format(limit)} cannot be checked",
        )
    passed = measured <= limit
    verdict = "is within" if passed else "is over"
    return CheckResult(
        name,
        measured,
        limit,
        passed,
        f"{name}: {fmt.format(measured)} {where} {verdict} the limit {fmt.format(limit)}",
    )


def evaluate(
    report: OptimizeReport, thresholds: Thresholds, measured: Measurements | None = None
) -> list[CheckResult]:
    """Every threshold that was set, checked; the caller fails the run if any ``passed`` is False."""
    measured = measured or Measurements()
    results: list[CheckResult] = []
    for name, attribute, limit in (
        ("max-abs-error", "max_abs", thresholds.max_abs_error),
        ("max-rel-error", "max_rel", thresholds.max_rel_error),
    ):
        if limit is None:
            continue
        worst = _worst(report, attribute)
        if worst is None:
            results.append(_limit_check(name, None, limit, "validation did not run"))
        else:
            results.append(_limit_check(name, worst[0], limit, f"on {worst[1]}"))
    if thresholds.min_node_reduction is not None:
        before, after = report.before.nodes, report.after.nodes
        reduction = (before - after) / before if before else 0.0
        limit = thresholds.min_node_reduction
        passed = reduction >= limit
        verdict = "meets" if passed else "is under"
        results.append(
            CheckResult(
                "min-node-reduction",
                reduction,
                limit,
                passed,
                f"min-node-reduction: {reduction:.1%} ({before} -> {after} nodes) {verdict} the minimum {limit:.1%}",
            )
        )
    if thresholds.max_latency_ratio is not None:
        results.append(
            _limit_check(
                "max-latency-ratio",
                measured.latency_ratio,
                thresholds.max_latency_ratio,
                "(optimized / original)",
            )
        )
    if thresholds.max_peak_memory is not None:
        peak = measured.peak_memory_bytes
        limit_bytes = thresholds.max_peak_memory
        if peak is None:
            results.append(_limit_check("max-peak-memory", None, limit_bytes, "no benchmark ran"))
        else:
            passed = peak <= limit_bytes
            verdict = "is within" if passed else "is over"
            results.append(
                CheckResult(
                    "max-peak-memory",
                    peak,
                    limit_bytes,
                    passed,
                    f"max-peak-memory: {format_bytes(peak)} while running the optimized model {verdict} the limit {format_bytes(limit_bytes)}",
                )
            )
    return results
