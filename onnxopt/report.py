"""The optimize report: what the model looked like before and after, what each pass did, validation.

Reports are frozen dataclasses; ``to_json`` gives the versioned machine-readable form and
``render`` the rich tables printed on the terminal.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir

from onnxopt import io
from onnxopt.analysis.memory_plan import MemoryReport
from onnxopt.passes.base import PassRecord
from onnxopt.rewrite.driver import iter_graphs
from onnxopt.validate import ReferenceReport, ValidationReport

REPORT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int | str | None, ...] | None


@dataclass(frozen=True)
class ModelSummary:
    nodes: int
    op_counts: dict[str, int]
    parameter_bytes: int
    file_bytes: int | None
    opsets: dict[str, int]
    ir_version: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    producer: str

    @staticmethod
    def of(model: ir.Model, file_bytes: int | None = None) -> ModelSummary:
        counts: Counter[str] = Counter()
        for graph in iter_graphs(model):
            for node in graph:
                key = (
                    node.op_type
                    if node.domain in ("", "ai.onnx")
                    else f"{node.domain}::{node.op_type}"
                )
                counts[key] += 1
        return ModelSummary(
            nodes=sum(counts.values()),
            op_counts=dict(sorted(counts.items())),
            parameter_bytes=io.parameter_bytes(model),
            file_bytes=file_bytes,
            opsets=dict(sorted(model.opset_imports.items())),
            ir_version=model.ir_version,
            inputs=tuple(_info(v) for v in model.graph.inputs if not v.is_initializer()),
            outputs=tuple(_info(v, io.kept_map_type(model, v)) for v in model.graph.outputs),
            producer=f"{model.producer_name or ''} {model.producer_version or ''}".strip(),
        )


def _dim(dim: Any) -> int | str | None:
    if isinstance(dim, int):
        return dim
    return getattr(dim, "value", None)


def _info(value: ir.Value, map_type: bytes | None = None) -> TensorInfo:
    shape = None if value.shape is None else tuple(_dim(d) for d in value.shape)
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    if map_type is not None:  # ZipMap's output: a type onnx-ir cannot hold
        kind = onnx.TypeProto()
        kind.ParseFromString(map_type)
        dtype = io.type_text(kind)
    return TensorInfo(str(value.name), dtype, shape)


def format_shape(shape: tuple[int | str | None, ...] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


@dataclass(frozen=True)
class OptimizeReport:
    source: str
    output: str | None
    level: int
    target: str
    passes_run: tuple[str, ...]
    before: ModelSummary
    after: ModelSummary
    records: tuple[PassRecord, ...]
    validation: ValidationReport | None
    warnings: tuple[str, ...]
    optimize_seconds: float
    validate_seconds: float
    memory: MemoryReport | None = None
    # Original and optimized vs eager PyTorch outputs, when a reference (.ref.npz) was given.
    reference: ReferenceReport | None = None
    # "opset 17 → 23 (onnx.version_converter)" when --opset raised the opset before the passes.
    opset_conversion: str | None = None
    # Pass runs left out because they could only repeat that pass's last run (see Pipeline).
    passes_skipped: int = 0
    # Passes left out by --fallback, each after --bisect named it as breaking validation.
    dropped_passes: tuple[str, ...] = ()
    # Target ort: the oldest ONNX Runtime release the output was written for (--ort-version).
    ort_version: str | None = None
    # ... and the execution providers it was written for (--ort-providers).
    ort_providers: tuple[str, ...] = ()

    def pass_totals(self) -> list[tuple[str, int, float, dict[str, int]]]:
        """(name, runs, seconds, summed stats) per pass, in first-run order."""
        table: dict[str, tuple[int, float, Counter[str]]] = {}
        for record in self.records:
            runs, seconds, stats = table.get(record.name, (0, 0.0, Counter()))
            stats.update(record.stats)
            table[record.name] = (runs + 1, seconds + record.seconds, stats)
        return [
            (name, runs, secs, dict(sorted(stats.items())))
            for name, (runs, secs, stats) in table.items()
        ]

    def explain_notes(self, fusions: bool | None = None) -> list[str]:
        """Distinct --explain notes in run order; ``fusions`` keeps only (True) or drops (False)
        those of the fuse-* passes."""
        seen: dict[str, None] = {}
        for record in self.records:
            if fusions is not None and record.name.startswith("fuse-") != fusions:
                continue
            for note in record.notes:
                seen.setdefault(note, None)
        return list(seen)

    def fusion_counts(self) -> list[tuple[str, int, int]]:
        """(rule, candidates, fused) per rewrite rule of the fuse-* passes.

        A candidate is a node a rule recognised (fused, or rejected with a reason under --explain);
        without --explain, rejected candidates are not collected and candidates equals fused.
        """
        fused: Counter[str] = Counter()
        for record in self.records:
            if record.name.startswith("fuse-"):
                fused.update(record.stats)
        rejected: Counter[str] = Counter()
        for record in self.records:  # a pass repeated to a fixed point re-reports the same misses
            if not record.name.startswith("fuse-"):
                continue
            in_record = Counter(note.split(": ", 1)[0] for note in record.notes)
            for rule, count in in_record.items():
                rejected[rule] = max(rejected[rule], count)
        rules = list(dict.fromkeys([*fused, *rejected]))
        return [(rule, fused[rule] + rejected[rule], fused[rule]) for rule in rules]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["schema_version"] = REPORT_SCHEMA_VERSION
        data["fusions"] = [
            {"rule": r, "candidates": c, "fused": f} for r, c, f in self.fusion_counts()
        ]
        data["passes"] = [
            {"name": n, "runs": r, "seconds": round(s, 6), "changes": st}
            for n, r, s, st in self.pass_totals()
        ]
        for record in data["records"]:
            record["seconds"] = round(record["seconds"], 6)
        if self.validation is not None:
            data["validation"]["passed"] = self.validation.passed
        if self.reference is not None:
            data["reference"]["export_passed"] = self.reference.export_passed
            data["reference"]["optimized_passed"] = self.reference.optimized_passed
        return data


def render(report: OptimizeReport, console: Any, *, explain: bool = False) -> None:
    """Print the report as rich tables (names from the model are escaped: they are not markup)."""
    from rich.markup import escape
    from rich.table import Table

    target = f"{report.target} {report.ort_version}" if report.ort_version else report.target
    if report.ort_providers:
        target += f" ({', '.join(report.ort_providers)})"
    ops = Table(
        title=f"onnxopt: {escape(report.source)} (level O{report.level}, target {target})",
        title_justify="left",
    )
    ops.add_column("op")
    ops.add_column("before", justify="right")
    ops.add_column("after", justify="right")
    ops.add_column("change", justify="right")
    names = sorted(set(report.before.op_counts) | set(report.after.op_counts))
    for name in names:
        b = report.before.op_counts.get(name, 0)
        a = report.after.op_counts.get(name, 0)
        if a == b:
            continue
        ops.add_row(escape(name), str(b), str(a), f"{a - b:+d}")
    unchanged = sum(
        1 for n in names if report.before.op_counts.get(n, 0) == report.after.op_counts.get(n, 0)
    )
    if unchanged:
        ops.add_row(f"[dim]{unchanged} op types unchanged[/dim]", "", "", "")
    ops.add_section()
    first, last = report.before, report.after
    change = f"{(last.nodes - first.nodes) / first.nodes * 100:+.1f}%" if first.nodes else "-"
    ops.add_row("[bold]nodes[/bold]", str(first.nodes), str(last.nodes), change)
    ops.add_row(
        "parameters", format_bytes(first.parameter_bytes), format_bytes(last.parameter_bytes), ""
    )
    ops.add_row("file size", format_bytes(first.file_bytes), format_bytes(last.file_bytes), "")
    console.print(ops)
    if report.opset_conversion is not None:
        console.print(f"converted: {report.opset_conversion}", highlight=False)

    passes = Table(title="passes", title_justify="left")
    passes.add_column("pass")
    passes.add_column("runs", justify="right")
    passes.add_column("time", justify="right")
    passes.add_column("changes")
    for name, runs, seconds, stats in report.pass_totals():
        text = ", ".join(f"{k}: {v}" for k, v in stats.items()) or "[dim]-[/dim]"
        passes.add_row(name, str(runs), f"{seconds * 1000:.1f} ms", text)
    passes.add_section()
    skipped = (
        f"[dim]{report.passes_skipped} run(s) skipped: each could only repeat that pass's last "
        "run[/dim]"
        if report.passes_skipped
        else ""
    )
    passes.add_row("[bold]total[/bold]", "", f"{report.optimize_seconds * 1000:.0f} ms", skipped)
    console.print(passes)

    if explain:
        fusions = Table(title="fusions", title_justify="left")
        fusions.add_column("rule")
        fusions.add_column("candidates", justify="right")
        fusions.add_column("fused", justify="right")
        for rule, candidates, fused in report.fusion_counts():
            fusions.add_row(rule, str(candidates), str(fused))
        if fusions.row_count:
            console.print(fusions)
        notes = report.explain_notes(fusions=True)
        console.print(f"[bold]explain[/bold]: {len(notes)} fusion candidate(s) not fused")
        for note in notes:
            console.print(f"  {note}", markup=False, highlight=False)
        others = report.explain_notes(fusions=False)
        if others:
            console.print(
                f"[dim]{len(others)} other candidate(s) not rewritten by the cleanup passes "
                "(each with its reason in --json records)[/dim]",
                highlight=False,
            )

    validation = report.validation
    if validation is None:
        console.print("validation: [yellow]skipped[/yellow] (--no-validate)")
    else:
        table = Table(
            title="validation on ONNX Runtime (CPU, graph optimizations off)", title_justify="left"
        )
        table.add_column("output")
        table.add_column("dtype")
        table.add_column("max abs", justify="right")
        table.add_column("max rel", justify="right")
        table.add_column("out of tol", justify="right")
        table.add_column("")
        for out in validation.outputs:
            verdict = "[green]ok[/green]" if out.passed else "[red]MISMATCH[/red]"
            table.add_row(
                escape(out.name),
                out.dtype,
                f"{out.max_abs:.3g}",
                f"{out.max_rel:.3g}",
                f"{out.mismatches}/{out.elements}",
                verdict,
            )
        console.print(table)
        shapes = "; ".join(
            ", ".join(f"{k}{format_shape(v)}" for k, v in t.items()) for t in validation.trials
        )
        console.print(
            f"[dim]inputs tried: {shapes or '-'} ({report.validate_seconds:.2f} s)[/dim]",
            highlight=False,
        )
        for error in validation.errors:
            console.print(f"[red]{escape(error)}[/red]", highlight=False)
        for note in validation.notes:
            console.print(f"[dim]{escape(note)}[/dim]", highlight=False)
    if report.memory is not None:
        render_memory(report.memory, console)
    if report.reference is not None:
        _render_reference(report.reference, console)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)


def render_memory(memory: MemoryReport, console: Any) -> None:
    """The activation memory table: naive / lower bound / planned / gap per order."""
    from rich.table import Table

    table = Table(title="activation memory (main graph, 64-byte aligned)", title_justify="left")
    for column in ("order", "naive", "lower bound", "planned", "gap"):
        table.add_column(column, justify="left" if column == "order" else "right")
    for row in memory.rows:
        table.add_row(
            row.label,
            format_bytes(row.naive_bytes),
            format_bytes(row.lower_bound_bytes),
            format_bytes(row.planned_bytes),
            f"{row.gap * 100:.2f}%",
        )
    console.print(table)
    console.print(
        f"peak vs the input order's lower bound without reuse: {-memory.reduction * 100:+.1f}%",
        highlight=False,
    )
    if memory.assumed_dims:
        dims = ", ".join(memory.assumed_dims)
        console.print(
            f"[yellow]assumed {dims} = {memory.default_dim}[/yellow] (bind with --dim NAME=SIZE)",
            highlight=False,
        )
    if memory.unknown:
        names = ", ".join(memory.unknown[:5]) + (" ..." if len(memory.unknown) > 5 else "")
        console.print(
            f"[yellow]{len(memory.unknown)} tensor(s) of unknown size counted as 0:[/yellow] {names}",
            highlight=False,
        )


def _render_reference(reference: ReferenceReport, console: Any) -> None:
    """Export error (original ONNX vs eager) and optimized vs eager, side by side per output."""
    from rich.markup import escape
    from rich.table import Table

    meta = reference.metadata
    origin = ", ".join(f"{k} {meta[k]}" for k in ("exporter", "torch_version") if k in meta)
    table = Table(
        title=f"vs eager PyTorch ({escape(reference.source)}{'; ' + escape(origin) if origin else ''})",
        title_justify="left",
    )
    table.add_column("output")
    table.add_column("export abs", justify="right")
    table.add_column("export rel", justify="right")
    table.add_column("optimized abs", justify="right")
    table.add_column("optimized rel", justify="right")
    table.add_column("")
    optimized = {c.name: c for c in reference.optimized}
    for exp in reference.export:
        opt = optimized.get(exp.name)
        if opt is None:
            continue
        verdict = (
            "[green]ok[/green]"
            if exp.passed and opt.passed
            else "[yellow]export over tol[/yellow]"
            if not exp.passed
            else "[yellow]optimized over tol[/yellow]"
        )
        table.add_row(
            escape(exp.name),
            f"{exp.max_abs:.3g}",
            f"{exp.max_rel:.3g}",
            f"{opt.max_abs:.3g}",
            f"{opt.max_rel:.3g}",
            verdict,
        )
    console.print(table)
    for error in reference.errors:
        console.print(f"[red]{escape(error)}[/red]", highlight=False)
