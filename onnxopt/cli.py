"""Command line: thin wrappers over the API. Results go to stdout, logs and progress to stderr.

Exit codes: 0 ok, 1 a check failed (validation, thresholds), 2 usage / bad input / internal error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from onnxopt import __version__
from onnxopt.errors import CheckFailed, OnnxoptError, UsageError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_ERROR = 0, 1, 2


def exit_code_for(exc: BaseException) -> int:
    """The one place exceptions become exit codes."""
    if isinstance(exc, CheckFailed):
        return EXIT_CHECK_FAILED
    return EXIT_ERROR


def _fail(exc: BaseException, traceback: bool) -> NoReturn:
    if traceback:
        import traceback as tb

        tb.print_exception(exc)
    if isinstance(exc, OnnxoptError):
        message = str(exc)
    elif isinstance(exc, MemoryError):
        message = "out of memory"
    elif isinstance(exc, RecursionError):
        message = "the model is nested too deeply to process"
    else:
        message = f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not traceback:
            message += " (rerun with --traceback and report it)"
    click.echo(f"onnxopt: error: {message}", err=True)
    sys.exit(exit_code_for(exc))


class _Command(click.Command):
    """Adds --traceback and maps every library exception to one stderr line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        traceback = bool(ctx.params.get("traceback"))
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("onnxopt: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # the single mapping point; see exit_code_for
            _fail(exc, traceback)


def _common(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--traceback", is_flag=True, help="Show the Python traceback of errors.")(func)
    func = click.option("-v", "--verbose", count=True, help="Log more to stderr (-vv for debug).")(func)
    return func


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"cannot read size '{text}' (examples: 64MB, 1GiB, 1000000)")
    number = float(match.group(1))
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit]
    return int(number * scale)


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise UsageError(f"--input-shape '{text}': expected NAME:D1xD2x... (e.g. input:1x3x224x224)")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
    except ValueError:
        raise UsageError(f"--input-shape '{text}': dims must be integers separated by 'x'") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"--input-shape '{text}': dims must not be negative")
    return name, shape


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxopt")
def main() -> None:
    """onnxopt: optimize ONNX models for ONNX Runtime, validated numerically."""


@main.command(cls=_Command)
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Where to write the optimized model.")
@click.option("-O", "--level", type=click.IntRange(0, 3), default=2, show_default=True, help="Optimization level (-O0 .. -O3).")
@click.option("--passes", help="Run exactly these passes, in order (comma-separated; see `onnxopt passes`).")
@click.option("--disable", help="Drop these passes from the level's pipeline (comma-separated).")
@click.option("--target", type=click.Choice(["ort", "onnx"]), default="ort", show_default=True, help="Runtime that fusions may target.")
@click.option("--fold-limit", default="32MiB", show_default=True, help="Largest tensor constant folding may create.")
@click.option("--input-shape", "input_shapes", multiple=True, help="Pin an input's dims: NAME:1x3x224x224 (repeatable).")
@click.option("--inputs", "inputs_file", type=click.Path(path_type=Path), help="Validate on these inputs (.npz) instead of random ones.")
@click.option("--no-validate", is_flag=True, help="Skip numerical validation on ONNX Runtime.")
@click.option("--external-data/--no-external-data", default=None, help="Store weights in OUTPUT.data (default: when the input did, or past 2 GB).")
@click.option("--overwrite", is_flag=True, help="Allow OUTPUT to be the input file.")
@click.option("--explain", is_flag=True, help="Say why each candidate rewrite was not applied.")
@click.option("--verify-each", is_flag=True, help="Check graph invariants after every pass.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@_common
def optimize(
    model: Path,
    output: Path | None,
    level: int,
    passes: str | None,
    disable: str | None,
    target: str,
    fold_limit: str,
    input_shapes: tuple[str, ...],
    inputs_file: Path | None,
    no_validate: bool,
    external_data: bool | None,
    overwrite: bool,
    explain: bool,
    verify_each: bool,
    as_json: bool,
    verbose: int,
    traceback: bool,
) -> None:
    """Optimize MODEL, validate it on ONNX Runtime and write it to OUTPUT."""
    from onnxopt import api, io
    from onnxopt.report import render
    from onnxopt.validate import load_inputs

    _setup_logging(verbose)
    shapes = dict(parse_input_shape(s) for s in input_shapes)
    inputs = load_inputs(inputs_file) if inputs_file else None
    console = _stderr_console()
    with console.status("optimizing", spinner="dots") as status:
        result = api.optimize(
            model,
            level=level,
            passes=_split(passes) if passes is not None else None,
            disable=_split(disable),
            target=target,  # type: ignore[arg-type]
            fold_limit_bytes=parse_size(fold_limit),
            input_shapes=shapes,
            check=not no_validate,
            inputs=inputs,
            explain=explain,
            verify_each=verify_each,
            progress=lambda step: status.update(f"{step} …"),
        )
    report = result.report
    validation = report.validation
    failed = validation is not None and not validation.passed
    if output is not None and not failed:
        assert result.source is not None
        protected = () if overwrite else (result.source.path, *result.source.external_files) if result.source.path else ()
        written = io.save_model(result.model, output, external_data=external_data, protected=protected)
        report = dataclasses.replace(
            report,
            output=str(written),
            after=dataclasses.replace(report.after, file_bytes=written.stat().st_size),
        )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, _stdout_console(), explain=explain)
        if output is None:
            click.echo("no output written (give -o OUTPUT to write the optimized model)", err=True)
        elif not failed:
            click.echo(f"wrote {output}", err=True)
    if failed:
        assert validation is not None
        names = ", ".join(validation.failing_outputs()) or "; ".join(validation.errors)
        raise CheckFailedReport(f"validation failed ({names}); nothing was written")


class CheckFailedReport(CheckFailed):
    pass


def _stdout_console() -> Any:
    from rich.console import Console

    return Console()


def _wide_console() -> Any:
    """stdout, at least 150 columns wide even when piped: wide tables wrap badly."""
    console = _stdout_console()
    if console.width < 150 and not console.is_terminal:
        console.width = 150
    return console


@main.command(cls=_Command)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@_common
def passes(as_json: bool, verbose: int, traceback: bool) -> None:
    """List every pass with a one-line description and the levels that run it."""
    from onnxopt.passes.base import FixedPoint
    from onnxopt.passes.levels import ALL_PASSES, build_steps

    levels: dict[str, list[int]] = {}
    for level in range(4):
        for step in build_steps(level):
            names = step.names if isinstance(step, FixedPoint) else [step.name]
            for name in names:
                if level not in levels.setdefault(name, []):
                    levels[name].append(level)
    rows = [{"name": cls.name, "summary": cls.summary, "levels": levels.get(cls.name, [])} for cls in ALL_PASSES]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title="passes", title_justify="left")
    table.add_column("pass")
    table.add_column("levels")
    table.add_column("what it does")
    for row in rows:
        table.add_row(row["name"], ",".join(f"O{x}" for x in row["levels"]) or "-", row["summary"])
    _stdout_console().print(table)


@main.command(cls=_Command)
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@_common
def inspect(model: Path, as_json: bool, verbose: int, traceback: bool) -> None:
    """Show MODEL's opsets, inputs and outputs with shapes, op histogram and parameter bytes."""
    from onnxopt import io
    from onnxopt.report import ModelSummary, format_bytes, format_shape

    _setup_logging(verbose)
    loaded = io.load_model(model)
    summary = ModelSummary.of(loaded.model, loaded.file_bytes)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2))
        return
    from rich.table import Table

    console = _stdout_console()
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in summary.opsets.items())
    console.print(f"[bold]{model}[/bold]  ir_version {summary.ir_version}, opsets {opsets}", highlight=False)
    if summary.producer:
        console.print(f"producer: {summary.producer}", highlight=False)
    io_table = Table(title="inputs and outputs", title_justify="left")
    io_table.add_column("")
    io_table.add_column("name")
    io_table.add_column("dtype")
    io_table.add_column("shape")
    for kind, infos in (("input", summary.inputs), ("output", summary.outputs)):
        for info in infos:
            io_table.add_row(kind, info.name, info.dtype, format_shape(info.shape))
    console.print(io_table)
    ops = Table(title=f"{summary.nodes} nodes", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for name, count in sorted(summary.op_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(name, str(count))
    console.print(ops)
    console.print(
        f"parameters: {format_bytes(summary.parameter_bytes)}; file: {format_bytes(summary.file_bytes)}", highlight=False
    )



@main.command(cls=_Command)
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--optimized", type=click.Path(path_type=Path), help="Time this optimized file instead of optimizing MODEL in memory.")
@click.option("-O", "--level", type=click.IntRange(0, 3), default=2, show_default=True, help="onnxopt level used to optimize MODEL in memory.")
@click.option("--torch", "torch_spec", metavar="NAME|MODULE:FACTORY", help="Also time eager PyTorch: a zoo name or package.module:factory returning (module, inputs).")
@click.option("--torch-compile", is_flag=True, help="Also time torch.compile of the --torch module.")
@click.option("--provider", default="cpu", show_default=True, help="ORT execution providers: cpu, cuda (comma-separated).")
@click.option("--threads", type=click.IntRange(0), default=0, help="Intra-op threads for ORT and PyTorch (default: physical cores).")
@click.option("--ort-level", default="all,disable", show_default=True, help="ORT graph optimization levels: disable, basic, extended, all (comma-separated).")
@click.option("--shape", "shapes", multiple=True, help="An input's shape: NAME:1x128 (repeatable).")
@click.option("--sweep", "sweeps", multiple=True, help="Repeat for sizes of a dynamic dim: batch=1,4,16, sequence=... or DIM=... (repeatable: all combinations).")
@click.option("--inputs", "inputs_file", type=click.Path(path_type=Path), help="Benchmark on these inputs (.npz) instead of random ones.")
@click.option("--budget", type=click.FloatRange(0, min_open=True), default=20.0, show_default=True, help="Seconds of interleaved timing per input size and provider.")
@click.option("--ci", "ci_target", type=click.FloatRange(0, min_open=True), default=0.01, show_default=True, help="Stop early once every speed-up's 95% interval is within ±this fraction.")
@click.option("--sessions", type=click.IntRange(1), default=3, show_default=True, help="Recreate the ORT sessions this many times or more over the budget; intervals then include session-to-session variation.")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True, help="Time runs by wall clock (latency) or process CPU time (steadier on a busy, shared machine).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement (child processes).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write the latency distributions to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@_common
def bench(model: Path, optimized: Path | None, level: int, torch_spec: str | None, torch_compile: bool, provider: str, threads: int, ort_level: str, shapes: tuple[str, ...], sweeps: tuple[str, ...], inputs_file: Path | None, budget: float, ci_target: float, sessions: int, clock: str, no_memory: bool, seed: int, plot_path: Path | None, as_json: bool, verbose: int, traceback: bool) -> None:
    """Time MODEL against its optimized form (and PyTorch) on ONNX Runtime, interleaved; speed-ups with 95% intervals."""
    from onnxopt.bench import BenchOptions, plot, render, run_bench
    from onnxopt.bench.run import parse_sweep
    from onnxopt.validate import load_inputs

    _setup_logging(verbose)
    if torch_compile and not torch_spec:
        raise UsageError("--torch-compile needs --torch")
    options = BenchOptions(
        optimized=optimized, level=level, torch=torch_spec, torch_compile=torch_compile,
        providers=tuple(_split(provider)), threads=threads, ort_levels=tuple(_split(ort_level)),
        shapes=dict(parse_input_shape(s) for s in shapes), sweeps=tuple(parse_sweep(s) for s in sweeps),
        inputs=load_inputs(inputs_file)[0] if inputs_file else None,
        budget_seconds=budget, ci_target=ci_target, sessions=sessions, clock=clock, memory=not no_memory, seed=seed,
    )
    with _stderr_console().status("benchmarking", spinner="dots") as status:
        report = run_bench(model, options, progress=lambda step: status.update(f"{step} …"))
    if plot_path is not None:
        click.echo(f"wrote {plot(report, plot_path)}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, _wide_console())

if __name__ == "__main__":  # pragma: no cover
    main()
