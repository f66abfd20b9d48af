"""The bench report: frozen dataclasses, ``to_json``, a rich table and a plot of latency distributions."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxopt.bench.memory import MemoryResult
from onnxopt.bench.stats import Interval, LatencyStats
from onnxopt.report import format_bytes

BENCH_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Agreement:
    """Worst difference of a variant's outputs against a reference, over the outputs both have."""

    reference: str
    outputs: int
    max_abs: float
    max_rel: float
    mismatches: int
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.outputs > 0 and self.mismatches == 0


@dataclass(frozen=True)
class VariantResult:
    name: str  # original, optimized, torch-eager, torch-compile
    provider: str  # cpu, cuda
    ort_level: str | None  # disable, basic, extended, all; None for PyTorch
    create_seconds: float
    first_run_seconds: float
    latency: LatencyStats
    speedup: Interval | None  # median paired ratio baseline/this (> 1: faster), with its interval
    speedup_baseline: str | None
    memory: MemoryResult | None
    vs_original: Agreement | None
    vs_eager: Agreement | None
    samples: tuple[float, ...] = field(default=(), repr=False)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ort_level})" if self.ort_level else self.name


@dataclass(frozen=True)
class GroupResult:
    """One provider at one input size: variants timed interleaved in one loop."""

    provider: str
    skipped: str | None
    rounds: int = 0
    timing_seconds: float = 0.0
    stop_reason: str = ""
    variants: tuple[VariantResult, ...] = ()


@dataclass(frozen=True)
class PointResult:
    shapes: dict[str, tuple[int, ...]]
    groups: tuple[GroupResult, ...]


@dataclass(frozen=True)
class OptimizedInfo:
    source: str  # "onnxopt -O2 (in memory)" or the given file
    nodes_before: int
    nodes_after: int
    optimize_seconds: float | None


@dataclass(frozen=True)
class BenchReport:
    model: str
    optimized: OptimizedInfo
    torch: str | None
    threads: int
    environment: dict[str, str]
    points: tuple[PointResult, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["schema_version"] = BENCH_SCHEMA_VERSION
        for point in data["points"]:
            point["shapes"] = {k: list(v) for k, v in point["shapes"].items()}
            for group in point["groups"]:
                for variant in group["variants"]:
                    variant.pop("samples", None)
                    for key in ("vs_original", "vs_eager"):
                        if variant[key] is not None:
                            variant[key]["passed"] = (
                                variant[key]["mismatches"] == 0 and variant[key]["outputs"] > 0
                            )
        return _finite(data)


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.2f} s"


def _speedup(variant: VariantResult) -> str:
    interval = variant.speedup
    if interval is None:
        return "[dim]baseline[/dim]"
    if interval.low is None or interval.high is None:
        return f"{interval.median:.3f}x"
    return f"{interval.median:.3f}x [{interval.low:.3f}-{interval.high:.3f}]"


def _agreement(agreement: Agreement | None) -> str:
    if agreement is None:
        return "-"
    if agreement.outputs == 0:
        return f"[dim]{agreement.note or 'n/a'}[/dim]"
    text = f"{agreement.max_abs:.0e}"
    return text if agreement.passed else f"[red]{text} ({agreement.mismatches} off)[/red]"


def _memory(memory: MemoryResult | None) -> str:
    if memory is None:
        return "-"
    if memory.error:
        return "[dim]failed[/dim]"
    return f"{format_bytes(memory.load_bytes)}/{format_bytes(memory.peak_bytes)}"


def render(report: BenchReport, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    info = report.optimized
    console.print(
        f"[bold]{escape(report.model)}[/bold]: optimized by {escape(info.source)}, "
        f"{info.nodes_before} → {info.nodes_after} nodes; {report.threads} threads; "
        f"{report.environment.get('clock', 'wall')} clock",
        highlight=False,
    )
    variants = [v for p in report.points for g in p.groups for v in g.variants]
    with_memory = any(v.memory is not None for v in variants)
    with_eager = any(v.vs_eager is not None for v in variants)
    footnotes: list[str] = []
    for point in report.points:
        shapes = ", ".join(
            f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in point.shapes.items()
        )
        table = Table(title=f"inputs: {escape(shapes)}", title_justify="left")
        columns = ["variant", "EP", "create", "1st run", "median", "p90", "p99", "runs/s"]
        columns.append("speed-up [95% CI]")
        if with_memory:
            columns.append("RSS load/peak")
        columns.append("err vs orig")
        if with_eager:
            columns.append("err vs eager")
        for column in columns:
            table.add_column(column, justify="left" if column in ("variant", "EP") else "right")
        for group in point.groups:
            if group.skipped:
                footnote = f"{group.provider}: skipped: {group.skipped}"
                if footnote not in footnotes:
                    footnotes.append(footnote)
                table.add_row("-", group.provider, f"[yellow]skipped ({len(footnotes)})[/yellow]")
                continue
            for variant in group.variants:
                lat = variant.latency
                row = [
                    escape(variant.label),
                    group.provider,
                    _ms(variant.create_seconds),
                    _ms(variant.first_run_seconds),
                    _ms(lat.median),
                    _ms(lat.p90),
                    _ms(lat.p99),
                    f"{lat.runs_per_second:.1f}",
                    _speedup(variant),
                ]
                if with_memory:
                    row.append(_memory(variant.memory))
                row.append(_agreement(variant.vs_original))
                if with_eager:
                    row.append(_agreement(variant.vs_eager))
                table.add_row(*row)
            table.add_section()
        console.print(table)
        for group in point.groups:
            if not group.skipped:
                generations = max(
                    (v.speedup.blocks for v in group.variants if v.speedup), default=1
                )
                console.print(
                    f"[dim]{group.provider}: {group.rounds} interleaved rounds on {generations} "
                    f"generation(s) of sessions in {group.timing_seconds:.1f} s "
                    f"({escape(group.stop_reason)})[/dim]",
                    highlight=False,
                )
    for number, footnote in enumerate(footnotes, 1):
        console.print(f"({number}) {escape(footnote)}", highlight=False)
    console.print(
        "[dim]speed-up: median of paired per-round latency ratios against the original at the same ORT "
        "level (PyTorch: against the first level); > 1 is faster. err: max |difference| against the "
        "original with ORT optimizations off.[/dim]",
        highlight=False,
    )
    for note in report.notes:
        console.print(f"[dim]{escape(note)}[/dim]", highlight=False)


def plot(report: BenchReport, path: Path) -> Path:
    """Box plots of every variant's latency samples, one panel per input size and provider."""
    try:
        import matplotlib
    except ImportError:
        from onnxopt.errors import UsageError

        raise UsageError("--plot needs matplotlib: pip install 'onnxopt[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (point, group) for point in report.points for group in point.groups if not group.skipped
    ]
    panels_count = 1 if not panels else len(panels)
    figure, axes = plt.subplots(
        panels_count,
        1,
        figsize=(9, 1.2 + 0.55 * max(4, _rows(panels)) * panels_count),
        squeeze=False,
    )
    for axis, (point, group) in zip(axes[:, 0], panels, strict=False):
        labels = [v.label for v in group.variants]
        data = [[s * 1000 for s in v.samples] for v in group.variants]
        axis.boxplot(
            data, orientation="horizontal", tick_labels=labels, showfliers=True, whis=(5, 95)
        )
        axis.invert_yaxis()
        axis.set_xscale("log")  # a noisy machine's outliers would squash the boxes on a linear axis
        what = "CPU time per run" if report.environment.get("clock") == "cpu" else "latency"
        axis.set_xlabel(f"{what} (ms, log scale); box: quartiles, whiskers: p5-p95")
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in point.shapes.items())
        axis.set_title(f"{group.provider}: {shapes}", fontsize=9, loc="left")
        axis.grid(axis="x", alpha=0.3)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "nothing was timed", ha="center")
    figure.suptitle(f"onnxopt bench: {Path(report.model).name}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _rows(panels: list[tuple[PointResult, GroupResult]]) -> int:
    return max((len(g.variants) for _, g in panels), default=1)
