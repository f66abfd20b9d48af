"""Command line: thin wrappers over the API. Results go to stdout, logs and progress to stderr.

Exit codes: 0 ok, 1 a check failed (validation, thresholds), 2 usage / bad input / internal error.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import click

from onnxopt import __version__
from onnxopt.errors import CheckFailed, ModelSaveError, OnnxoptError, UsageError, describe
from onnxopt.guard import doing

EXIT_OK, EXIT_CHECK_FAILED, EXIT_ERROR = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def exit_code_for(exc: BaseException) -> int:
    """The one place exceptions become exit codes."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, CheckFailed):
        return EXIT_CHECK_FAILED
    return EXIT_ERROR


def _fail(exc: BaseException, traceback: bool) -> NoReturn:
    if traceback:
        import traceback as tb

        tb.print_exception(exc)
    message = describe(exc)
    if message.startswith("internal error:") and not traceback:
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
        except KeyboardInterrupt as exc:
            click.echo("onnxopt: interrupted", err=True)
            sys.exit(exit_code_for(exc))
        except Exception as exc:  # the single mapping point; see exit_code_for
            _fail(exc, traceback)


def _usage_error(exc: click.exceptions.UsageError) -> NoReturn:
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        raise exc  # bare `onnxopt`: click prints the help
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    click.echo(f"onnxopt: error: {exc.format_message()}{where}", err=True)
    sys.exit(exit_code_for(exc))


class _Group(click.Group):
    """Click's own usage errors (a bad option value, an unknown option or command) as one stderr
    line and exit 2, like every other error, instead of click's three-line usage block."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.exceptions.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.UsageError as exc:
            _usage_error(exc)


def _common(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--traceback", is_flag=True, help="Show the Python traceback of errors.")(
        func
    )
    func = click.option("-v", "--verbose", count=True, help="Log more to stderr (-vv for debug).")(
        func
    )
    return func


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # onnx-ir logs routine decisions as warnings; show them only when asked for debug output.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR if verbose < 2 else logging.DEBUG)


class _Finite(click.FloatRange):
    """A finite number from 0 up (click's FloatRange lets 'nan' and 'inf' through: a nan
    --run-timeout stopped every run at once, an inf --budget never ends, a nan --max-abs-error
    failed every model)."""

    def __init__(self, *, zero: bool) -> None:
        super().__init__(min=0, min_open=not zero)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


POSITIVE = _Finite(zero=False)
NON_NEGATIVE = _Finite(zero=True)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"cannot read size '{text}' (examples: 64MB, 1GiB, 1000000)")
    number = float(match.group(1))
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit]
    return int(number * scale)


def parse_input_shape(text: str, option: str = "--input-shape") -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise UsageError(f"{option} '{text}': expected NAME:D1xD2x... (e.g. input:1x3x224x224)")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
    except ValueError:
        raise UsageError(f"{option} '{text}': dims must be integers separated by 'x'") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"{option} '{text}': dims must not be negative")
    return name, shape


def parse_dims(texts: tuple[str, ...]) -> dict[str, int]:
    """``("batch=8,seq=512", ...)`` -> {"batch": 8, "seq": 512}."""
    pairs: list[tuple[str, int]] = []
    for part in (p for text in texts for p in _split(text)):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise UsageError(f"--dim '{part}': expected NAME=SIZE (e.g. batch=8,seq=512)")
        pairs.append((name.strip(), int(value)))
    return _once("--dim", pairs)


def _once(option: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``pairs`` as a dict; a name given twice with two values is an error, not the last one wins."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if out.get(name, value) != value:
            raise UsageError(f"{option} {name} is given twice ({out[name]} and {value})")
        out[name] = value
    return out


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxopt")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Settings file (default: nearest onnxopt.toml or pyproject.toml [tool.onnxopt]).",
)
@click.pass_context
def main(ctx: click.Context, config_path: Path | None) -> None:
    """onnxopt: optimize ONNX models for ONNX Runtime, validated numerically."""
    from onnxopt.config import default_map, find_config, load_config

    try:
        path = config_path or find_config()
        if path is None:
            return
        if not path.is_file():
            raise UsageError(
                f"--config {path}: {'is not a file' if path.exists() else 'no such file'}"
            )
        commands = {
            name: [p.name for p in cmd.params if p.name] for name, cmd in main.commands.items()
        }
        ctx.default_map = default_map(load_config(path), commands, path)
    except UsageError as exc:
        click.echo(f"onnxopt: error: {exc}", err=True)
        sys.exit(exit_code_for(exc))


def _optimize_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `optimize` and `check`: pipeline, validation, thresholds, reports, batches."""
    options = [
        click.option(
            "-o",
            "--output",
            type=click.Path(path_type=Path),
            help="Where to write the optimized model (one MODEL).",
        ),
        click.option(
            "--out-dir",
            type=click.Path(path_type=Path),
            help="Write each optimized model here, under its own file name.",
        ),
        click.option(
            "-j",
            "--jobs",
            type=click.IntRange(1, 64),
            default=1,
            show_default=True,
            help="Models optimized in parallel.",
        ),
        click.option(
            "-O",
            "--level",
            type=click.IntRange(0, 3),
            default=2,
            show_default=True,
            help="Optimization level (-O0 .. -O3).",
        ),
        click.option(
            "--passes",
            help="Run exactly these passes, in order (comma-separated; see `onnxopt passes`).",
        ),
        click.option(
            "--disable", help="Drop these passes from the level's pipeline (comma-separated)."
        ),
        click.option(
            "--enable",
            help="Append these opt-in passes to the level's pipeline (comma-separated).",
        ),
        click.option(
            "--target",
            type=click.Choice(["ort", "onnx"]),
            default="ort",
            show_default=True,
            help="Runtime that fusions may target.",
        ),
        click.option(
            "--ort-version",
            metavar="X.Y",
            help="Oldest ONNX Runtime release the output must run on (--target ort); contrib-op "
            "forms it lacks are not written. Default: the installed onnxruntime's.",
        ),
        click.option(
            "--ort-providers",
            metavar="cpu,cuda",
            help="ONNX Runtime execution providers the output must run on (--target ort); forms "
            "CUDA lacks are not written for cuda. Default: cpu, and cuda with onnxruntime-gpu.",
        ),
        click.option(
            "--opset",
            type=click.IntRange(1, None),
            help="First raise the model's ONNX opset to N (onnx.version_converter), e.g. 23 for "
            "RMSNormalization/Attention/RotaryEmbedding with --target onnx.",
        ),
        click.option(
            "--fold-limit",
            default="32MiB",
            show_default=True,
            help="Largest tensor constant folding may create.",
        ),
        click.option(
            "--fold-may-grow",
            is_flag=True,
            help="Fold even where the result is larger than what it replaces (the file may grow).",
        ),
        click.option(
            "--input-shape",
            "input_shapes",
            multiple=True,
            help="Pin an input's dims: NAME:1x3x224x224 (repeatable).",
        ),
        click.option(
            "--dim",
            "dims",
            multiple=True,
            help="Size symbolic dims: the first sizes validation tries, and the sizes of memory "
            "figures and reordering: batch=8,seq=512.",
        ),
        click.option(
            "--memory",
            is_flag=True,
            help="Report activation memory (naive / lower bound / planned) before and after.",
        ),
        click.option(
            "--memory-plan",
            type=click.Path(path_type=Path),
            help="Write the optimized model's arena plan (offsets, lifetimes) as JSON.",
        ),
        click.option(
            "--inputs",
            "inputs_file",
            type=click.Path(path_type=Path),
            help="Validate on these inputs (.npz) instead of random ones.",
        ),
        click.option(
            "--reference",
            "reference_file",
            type=click.Path(path_type=Path),
            help="Eager PyTorch reference (.ref.npz from `onnxopt export`; default: MODEL's own, when present).",
        ),
        click.option(
            "--no-reference", is_flag=True, help="Ignore the reference file next to MODEL."
        ),
        click.option(
            "--no-validate", is_flag=True, help="Skip numerical validation on ONNX Runtime."
        ),
        click.option(
            "--run-timeout",
            type=POSITIVE,
            default=600.0,
            show_default=True,
            help="Stop one ONNX Runtime run of validation after this many seconds.",
        ),
        click.option(
            "--external-data/--no-external-data",
            default=None,
            help="Store weights in OUTPUT.data (default: when the input did, or past 2 GB).",
        ),
        click.option("--overwrite", is_flag=True, help="Allow OUTPUT to be the input file."),
        click.option(
            "--explain", is_flag=True, help="Say why each candidate rewrite was not applied."
        ),
        click.option(
            "--verify-each", is_flag=True, help="Check graph invariants after every pass."
        ),
        click.option(
            "--bisect",
            is_flag=True,
            help="When validation fails, find the first pass that broke the model.",
        ),
        click.option(
            "--fallback",
            is_flag=True,
            help="When validation fails, drop the pass --bisect names and optimize again "
            "(up to 3 passes; the report names them).",
        ),
        click.option(
            "--max-abs-error",
            type=NON_NEGATIVE,
            help="Fail (exit 1) when any output's max abs error is above this.",
        ),
        click.option(
            "--max-rel-error",
            type=NON_NEGATIVE,
            help="Fail (exit 1) when any output's max relative error is above this.",
        ),
        click.option(
            "--min-node-reduction",
            help="Fail (exit 1) unless nodes drop by at least this much (0.1 or 10%).",
        ),
        click.option(
            "--max-latency-ratio",
            type=POSITIVE,
            help="Fail (exit 1) when optimized/original latency is above this (runs a benchmark).",
        ),
        click.option(
            "--max-peak-memory",
            help="Fail (exit 1) when the optimized model's peak memory is above this (e.g. 2GiB; runs a benchmark).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout."),
        click.option(
            "--junit",
            "junit_path",
            type=click.Path(path_type=Path),
            help="Write a JUnit XML report here.",
        ),
        click.option(
            "--markdown",
            "markdown_path",
            type=click.Path(path_type=Path),
            help="Write a markdown summary here ('-' for stdout).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def parse_fraction(text: str | None) -> float | None:
    if text is None:
        return None
    value = text.strip()
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise UsageError(f"cannot read '{text}' as a fraction (examples: 0.1, 10%)") from None


@main.command(cls=_Command)
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=Path))
@_optimize_options
@_common
def optimize(models: tuple[Path, ...], **kw: Any) -> None:
    """Optimize MODEL(s), validate on ONNX Runtime, write to -o OUTPUT or --out-dir DIR.

    Exit codes: 0 ok, 1 validation or a threshold failed, 2 bad input or usage.
    """
    _optimize_command(models, **kw)


@main.command(cls=_Command)
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=Path))
@_optimize_options
@_common
def check(models: tuple[Path, ...], **kw: Any) -> None:
    """CI step: optimize MODEL(s) in memory, validate, and enforce thresholds (writes only with -o/--out-dir).

    Exit codes: 0 ok, 1 validation or a threshold failed, 2 bad input or usage.
    """
    _optimize_command(models, **kw)


def _optimize_command(
    models: tuple[Path, ...],
    *,
    output: Path | None,
    out_dir: Path | None,
    jobs: int,
    level: int,
    passes: str | None,
    disable: str | None,
    enable: str | None,
    target: str,
    ort_version: str | None,
    ort_providers: str | None,
    opset: int | None,
    fold_limit: str,
    fold_may_grow: bool,
    input_shapes: tuple[str, ...],
    dims: tuple[str, ...],
    memory: bool,
    memory_plan: Path | None,
    inputs_file: Path | None,
    reference_file: Path | None,
    no_reference: bool,
    no_validate: bool,
    run_timeout: float,
    external_data: bool | None,
    overwrite: bool,
    explain: bool,
    verify_each: bool,
    bisect: bool,
    fallback: bool,
    max_abs_error: float | None,
    max_rel_error: float | None,
    min_node_reduction: str | None,
    max_latency_ratio: float | None,
    max_peak_memory: str | None,
    as_json: bool,
    junit_path: Path | None,
    markdown_path: Path | None,
    verbose: int,
    traceback: bool,
) -> None:
    from onnxopt.batch import fall_back, validation_failed
    from onnxopt.checks import Thresholds
    from onnxopt.validate import load_inputs

    _setup_logging(verbose)
    if output is not None and (len(models) > 1 or out_dir is not None):
        raise UsageError("-o OUTPUT takes one model; use --out-dir DIR for several")
    if (
        output is not None
        and not overwrite
        and output.exists()
        and output.resolve() == models[0].resolve()
    ):
        raise UsageError(
            f"{output}: refusing to overwrite the input model (add --overwrite to allow it)"
        )
    _check_output_paths(
        models,
        output,
        out_dir,
        {"--memory-plan": memory_plan, "--junit": junit_path, "--markdown": markdown_path},
        overwrite,
        {"--inputs": inputs_file, "--reference": reference_file},
    )
    if reference_file is not None and len(models) > 1:
        raise UsageError(
            "--reference takes one model (each model's own MODEL.ref.npz is used when present)"
        )
    thresholds = Thresholds(
        max_abs_error=max_abs_error,
        max_rel_error=max_rel_error,
        max_latency_ratio=max_latency_ratio,
        max_peak_memory=parse_size(max_peak_memory) if max_peak_memory else None,
        min_node_reduction=parse_fraction(min_node_reduction),
    )
    options: dict[str, Any] = {
        "level": level,
        "passes": _split(passes) if passes is not None else None,
        "disable": _split(disable),
        "enable": _split(enable),
        "target": target,
        "ort_version": ort_version,
        "ort_providers": ort_providers,
        "opset": opset,
        "fold_limit_bytes": parse_size(fold_limit),
        "fold_may_grow": fold_may_grow,
        "input_shapes": _once("--input-shape", [parse_input_shape(s) for s in input_shapes]),
        "check": not no_validate,
        "inputs": load_inputs(inputs_file) if inputs_file else None,
        "reference": reference_file if not no_validate else None,
        "find_reference": not (no_reference or no_validate),
        "explain": explain,
        "verify_each": verify_each,
        "dims": parse_dims(dims),
        "memory": memory or memory_plan is not None,
        "run_timeout": run_timeout,
    }
    if memory_plan is not None and (len(models) > 1 or out_dir is not None):
        raise UsageError("--memory-plan takes one model")
    explained = False  # the failure's lines and its bisection were printed by --fallback
    if len(models) == 1 and out_dir is None:
        single = functools.partial(
            _optimize_single, models[0], output, thresholds=thresholds,
            external_data=external_data, overwrite=overwrite,
        )  # fmt: skip
        outcome, result = single(options)
        if fallback and validation_failed(outcome):
            outcome, result = fall_back(
                (outcome, result),
                options,
                lambda opts, dropped: single(opts, dropped=dropped),
                bisect=lambda failed, opts: _run_bisect(
                    models[0], failed, opts, then="--fallback drops it"
                ),
                say=lambda line: click.echo(f"onnxopt: {line}", err=True),
            )
            explained = validation_failed(outcome)
        _show_single(outcome, result, output, as_json, explain, memory_plan)
        outcomes = [outcome]
    else:
        outcomes = _optimize_batch(
            list(models), out_dir, options, thresholds, jobs, external_data, as_json, fallback
        )
    _write_ci_reports(outcomes, junit_path, markdown_path)
    failures = [o for o in outcomes if o.status == "failed"]
    errors = [o for o in outcomes if o.status == "error"]
    if len(outcomes) == 1:
        if errors:  # a one-model batch (--out-dir): its error is the command's error
            raise OnnxoptError(str(errors[0].error))
        if failures and explained:
            raise CheckFailed(f"{failures[0].failures[0]}; nothing was written")
        if failures:
            for line in failures[0].failures[1:]:
                click.echo(f"onnxopt: {line}", err=True)
            if (
                bisect
                and failures[0].report is not None
                and failures[0].report.validation is not None
            ):
                _run_bisect(models[0], failures[0], options)
            elif (
                failures[0].report is not None
                and failures[0].report.validation is not None
                and not failures[0].report.validation.passed
            ):
                click.echo(
                    "onnxopt: hint: rerun with --bisect to name the pass that introduced the "
                    "mismatch, or with --fallback to optimize without it",
                    err=True,
                )
            raise CheckFailed(f"{failures[0].failures[0]}; nothing was written")
        return
    for outcome in outcomes:
        if outcome.error is not None:
            click.echo(f"onnxopt: {outcome.error}", err=True)
        for line in outcome.failures:
            click.echo(f"onnxopt: {outcome.model}: {line}", err=True)
    if errors:
        raise OnnxoptError(
            f"{len(errors)} of {len(outcomes)} model(s) could not be optimized, {len(failures)} failed checks"
        )
    if failures:
        raise CheckFailed(f"{len(failures)} of {len(outcomes)} model(s) failed checks")


def _finite(data: Any) -> Any:
    """``data`` with every non-finite float (a shape mismatch's error is inf) as None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def _json_text(data: Any, indent: int = 2) -> str:
    """Strict JSON: NaN and Infinity are not JSON (``json.dumps`` writes them), so they become null."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)


def _check_output_paths(
    models: tuple[Path, ...],
    output: Path | None,
    out_dir: Path | None,
    reports: dict[str, Path | None],
    overwrite: bool,
    read_files: dict[str, Path | None],
) -> None:
    """Refuse, before any work, a file to write that is a folder or not a regular file, lies in a
    missing or unwritable folder, is an input (the model, --inputs, --reference, MODEL.ref.npz)
    or is another file this run writes."""
    import stat

    from onnxopt.io import same_file
    from onnxopt.reference import reference_path_for

    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir}: exists and is not a folder")
    if out_dir is not None and out_dir.is_dir():
        _check_writable_folder("--out-dir", out_dir, out_dir)
    inputs = [
        *read_files.items(),
        *(("the model's reference", reference_path_for(m)) for m in models),
    ]
    targets = [("-o", output), *reports.items()]
    if output is not None and output.name:
        targets.append(("-o's external data", output.with_name(output.name + ".data")))
    written: list[tuple[str, Path]] = []
    for option, path in targets:
        if path is None or str(path) == "-":
            continue
        if path.is_dir():
            raise UsageError(f"{option} {path}: is a folder; give a file name")
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise UsageError(f"{option} {path}: folder '{folder}' does not exist")
        if option != "-o's external data":
            try:
                mode = path.lstat().st_mode
            except OSError:
                mode = None
            if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                # The model is renamed into place: that would replace a device or a FIFO.
                raise UsageError(f"{option} {path}: exists and is not a regular file")
            _check_writable_folder(option, path, folder)
        if not (option == "-o" and overwrite) and any(same_file(path, m) for m in models):
            hint = " (add --overwrite to allow it)" if option == "-o" else ""
            raise UsageError(f"{option} {path}: refusing to overwrite the input model{hint}")
        for what, source in inputs:
            if source is not None and same_file(path, source):
                raise UsageError(f"{option} {path}: refusing to overwrite {what} '{source}'")
        for other, earlier in written:
            if same_file(path, earlier):
                raise UsageError(f"{option} {path}: is also the file of {other}")
        written.append((option, path))


def _check_writable_folder(option: str, path: Path, folder: Path) -> None:
    """A file can be made in ``folder`` (not so in a read-only mount, /proc, or past a quota):
    found out now rather than after the optimized model was written."""
    import os
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".onnxopt-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write in '{folder}' ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _write_file(option: str, path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise ModelSaveError(f"{option} {path}: cannot write ({exc.strerror})") from None


def _optimize_single(
    model: Path,
    output: Path | None,
    options: Mapping[str, Any],
    *,
    thresholds: Any,
    external_data: bool | None,
    overwrite: bool,
    dropped: tuple[tuple[str, str], ...] = (),
) -> tuple[Any, Any]:
    """Optimize, check and (when every check passed) write; ``dropped``: (pass, why) left out by
    --fallback, recorded in the report."""
    from onnxopt import api
    from onnxopt.batch import check_and_write, with_dropped

    console = _stderr_console()
    with console.status("optimizing", spinner="dots") as status, doing(f"optimizing {model}"):
        result = api.optimize(model, progress=lambda step: status.update(f"{step} …"), **options)
    result = with_dropped(result, dropped)
    outcome = check_and_write(
        model,
        result,
        thresholds,
        output,
        external_data,
        _measure(model, result, thresholds),
        overwrite=overwrite,
    )
    return outcome, result


def _show_single(
    outcome: Any,
    result: Any,
    output: Path | None,
    as_json: bool,
    explain: bool,
    memory_plan: Path | None,
) -> None:
    from onnxopt.report import render

    report, checks, written = outcome.report, outcome.checks, outcome.output
    assert report is not None
    if memory_plan is not None and result.memory_plan is not None:
        _write_file(
            "--memory-plan",
            memory_plan,
            _json_text(result.memory_plan.to_json(), indent=1).encode(),
        )
    if as_json:
        data = report.to_json()
        data["checks"] = [dataclasses.asdict(c) for c in checks]
        click.echo(_json_text(data, indent=2))
    else:
        render(report, _wide_console(), explain=explain)
        for check in checks:
            mark = "[green]ok[/green]" if check.passed else "[red]FAILED[/red]"
            _wide_console().print(f"{mark} {check.message}", highlight=False)
        if output is None:
            click.echo("no output written (give -o OUTPUT to write the optimized model)", err=True)
        elif written is not None:
            click.echo(f"wrote {written}", err=True)


def _measure(model: Path, result: Any, thresholds: Any) -> Any:
    """Benchmark figures for latency/memory thresholds (only when such a threshold is set)."""
    from onnxopt.checks import Measurements

    if not thresholds.needs_benchmark:
        return Measurements()
    from onnxopt.bench_hook import measure_for_thresholds

    return measure_for_thresholds(model, result.model)


def _optimize_batch(
    models: list[Path],
    out_dir: Path | None,
    options: dict[str, Any],
    thresholds: Any,
    jobs: int,
    external_data: bool | None,
    as_json: bool,
    fallback: bool = False,
) -> list[Any]:
    from rich.progress import Progress

    from onnxopt.batch import optimize_many
    from onnxopt.report import format_bytes

    if thresholds.needs_benchmark:
        raise UsageError("--max-latency-ratio and --max-peak-memory take one model at a time")
    with Progress(console=_stderr_console(), transient=True) as bar:
        task = bar.add_task("optimizing", total=len(models))
        outcomes = optimize_many(
            models,
            out_dir,
            options,
            thresholds,
            jobs=jobs,
            external_data=external_data,
            progress=lambda outcome: bar.advance(task),
            fallback=fallback,
        )
    if as_json:
        click.echo(
            _json_text(
                {"schema_version": 1, "models": [_outcome_json(o) for o in outcomes]}, indent=2
            )
        )
        return outcomes
    from rich.table import Table

    table = Table(title=f"onnxopt: {len(models)} models", title_justify="left")
    for column in ("model", "nodes", "change", "parameters", "validation", "time", "status"):
        table.add_column(
            column, justify="right" if column in ("nodes", "change", "time") else "left"
        )
    for o in outcomes:
        if o.report is None:
            table.add_row(
                o.model, "-", "-", "-", "-", f"{o.seconds:.1f} s", f"[red]error[/red]: {o.error}"
            )
            continue
        r = o.report
        change = (
            f"{(r.after.nodes - r.before.nodes) / r.before.nodes:+.1%}" if r.before.nodes else "-"
        )
        validation = (
            "skipped"
            if r.validation is None
            else ("ok" if r.validation.passed else "[red]mismatch[/red]")
        )
        status = (
            "[green]ok[/green]"
            if o.status == "ok"
            else "[red]failed[/red]: " + "; ".join(o.failures)
        )
        table.add_row(
            o.model,
            f"{r.before.nodes} → {r.after.nodes}",
            change,
            format_bytes(r.after.parameter_bytes),
            validation,
            f"{o.seconds:.1f} s",
            status,
        )
    _wide_console().print(table)
    return outcomes


def _outcome_json(outcome: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": outcome.model,
        "status": outcome.status,
        "output": outcome.output,
        "error": outcome.error,
    }
    data["failures"] = list(outcome.failures)
    data["report"] = outcome.report.to_json() if outcome.report is not None else None
    data["checks"] = [dataclasses.asdict(c) for c in outcome.checks]
    return data


def _write_ci_reports(
    outcomes: list[Any], junit_path: Path | None, markdown_path: Path | None
) -> None:
    from onnxopt.ci_report import junit_xml, markdown_summary

    if junit_path is not None:
        _write_file("--junit", junit_path, junit_xml(outcomes))
    if markdown_path is not None:
        text = markdown_summary(outcomes)
        if str(markdown_path) == "-":
            click.echo(text)
        else:
            _write_file("--markdown", markdown_path, text.encode("utf-8"))


def _run_bisect(
    model: Path, outcome: Any, options: Mapping[str, Any], *, then: str = ""
) -> tuple[str, str] | None:
    """Name the first pass that broke validation (on stderr); (pass, what it broke) or None."""
    from onnxopt.bisect import bisect_run

    with _stderr_console().status("bisecting", spinner="dots") as status:
        result = bisect_run(model, outcome.report.passes_run, options, progress=status.update)
    if result.culprit is None:
        click.echo(
            "onnxopt: bisect: every prefix validates; the mismatch did not reproduce", err=True
        )
        return None
    assert result.first_bad_index is not None
    click.echo(
        f"onnxopt: bisect: pass #{result.first_bad_index + 1} '{result.culprit}' introduced the "
        f"mismatch{result.detail}; {then or f'rerun with --disable {result.culprit}'} "
        f"({result.probes} probes)",
        err=True,
    )
    return result.culprit, result.detail


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
    rows: list[dict[str, Any]] = [
        {"name": cls.name, "summary": cls.summary, "levels": levels.get(cls.name, [])}
        for cls in ALL_PASSES
    ]
    if as_json:
        click.echo(_json_text(rows, indent=2))
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
    from onnxopt.ort_versions import format_version, model_provider_problem, model_requirement
    from onnxopt.report import ModelSummary, format_bytes, format_shape

    _setup_logging(verbose)
    loaded = io.load_model(model)
    summary = ModelSummary.of(loaded.model, loaded.file_bytes)
    needs = model_requirement(loaded.model)
    not_on_cuda = model_provider_problem(loaded.model, ("cuda",))
    if as_json:
        data = dataclasses.asdict(summary)
        data["onnxruntime_needed"] = (
            {"version": format_version(needs[0]), "why": needs[1]} if needs else None
        )
        data["cuda_problem"] = not_on_cuda
        click.echo(_json_text(data, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    console = _stdout_console()
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in summary.opsets.items())
    console.print(
        f"[bold]{escape(str(model))}[/bold]  ir_version {summary.ir_version}, opsets {opsets}",
        highlight=False,
    )
    if summary.producer:
        console.print(f"producer: {summary.producer}", highlight=False, markup=False)
    if needs is not None:
        console.print(
            f"needs ONNX Runtime {format_version(needs[0])} or newer ({needs[1]})",
            highlight=False,
            markup=False,
        )
    if not_on_cuda is not None:
        console.print(
            f"not for CUDA as it is: {not_on_cuda}",
            highlight=False,
            markup=False,
        )
    io_table = Table(title="inputs and outputs", title_justify="left")
    io_table.add_column("")
    io_table.add_column("name")
    io_table.add_column("dtype")
    io_table.add_column("shape")
    for kind, infos in (("input", summary.inputs), ("output", summary.outputs)):
        for info in infos:
            # Names and shapes are data, not markup: "[batch, 3]" would otherwise vanish as a tag.
            io_table.add_row(kind, escape(info.name), info.dtype, escape(format_shape(info.shape)))
    console.print(io_table)
    ops = Table(title=f"{summary.nodes} nodes", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for name, count in sorted(summary.op_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(escape(name), str(count))
    console.print(ops)
    console.print(
        f"parameters: {format_bytes(summary.parameter_bytes)}; file: {format_bytes(summary.file_bytes)}",
        highlight=False,
    )


@main.command(cls=_Command, name="export")
@click.argument("model_name", metavar="MODEL", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Where to write the ONNX model (default: MODEL.onnx).",
)
@click.option(
    "--exporter",
    type=click.Choice(["dynamo", "torchscript"]),
    default="dynamo",
    show_default=True,
    help="torch.onnx.export(dynamo=True) or the TorchScript exporter.",
)
@click.option("--opset", type=int, help="ONNX opset to export to (default: the exporter's).")
@click.option(
    "--static",
    is_flag=True,
    help="Fix every dim to the example inputs' (no dynamic batch/sequence axes).",
)
@click.option("--list", "list_models", is_flag=True, help="List the zoo's models and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_common
def export_command(
    model_name: str | None,
    output: Path | None,
    exporter: str,
    opset: int | None,
    static: bool,
    list_models: bool,
    as_json: bool,
    verbose: int,
    traceback: bool,
) -> None:
    """Export MODEL (a zoo name or package.module:factory) to ONNX, with its eager reference (x.onnx -> x.ref.npz).

    A factory returns (module, example_inputs) or (module, example_inputs, dynamic_axes).
    """
    from onnxopt.zoo import ZOO

    _setup_logging(verbose)
    if list_models:
        rows = [{"name": e.name, "factory": e.factory, "summary": e.summary} for e in ZOO.values()]
        if as_json:
            click.echo(_json_text(rows, indent=2))
        else:
            for row in rows:
                click.echo(f"{row['name']:24s} {row['summary']}")
        return
    if not model_name:
        raise UsageError(
            "give MODEL (a zoo name, see `onnxopt export --list`, or package.module:factory)"
        )
    from onnxopt.export import export

    target = output or Path(model_name.rpartition(":")[2] + ".onnx")
    with _stderr_console().status("exporting", spinner="dots") as status:
        result = export(
            model_name,
            target,
            exporter=exporter,  # type: ignore[arg-type]
            opset=opset,
            dynamic=not static,
            progress=lambda step: status.update(f"{step} …"),
        )
    if as_json:
        click.echo(_json_text(dataclasses.asdict(result), indent=2))
    else:
        click.echo(
            f"wrote {result.output} and {result.reference} ({exporter}, opset {result.opset}, {result.export_seconds:.1f} s)"
        )


@main.command(cls=_Command)
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--optimized",
    type=click.Path(path_type=Path),
    help="Time this optimized file instead of optimizing MODEL in memory.",
)
@click.option(
    "--compare",
    "compare",
    multiple=True,
    metavar="NAME=PATH",
    help="Also time this file in the same interleaved rounds, labelled NAME (e.g. another tool's output; repeatable).",
)
@click.option(
    "-O",
    "--level",
    type=click.IntRange(0, 3),
    default=2,
    show_default=True,
    help="onnxopt level used to optimize MODEL in memory.",
)
@click.option(
    "--torch",
    "torch_spec",
    metavar="NAME|MODULE:FACTORY",
    help="Also time eager PyTorch: a zoo name or package.module:factory returning (module, inputs).",
)
@click.option(
    "--torch-compile", is_flag=True, help="Also time torch.compile of the --torch module."
)
@click.option(
    "--provider",
    default="cpu",
    show_default=True,
    help="ORT execution providers: cpu, cuda (comma-separated).",
)
@click.option(
    "--threads",
    type=click.IntRange(0),
    default=0,
    help="Intra-op threads for ORT and PyTorch (default: physical cores).",
)
@click.option(
    "--ort-level",
    default="all,disable",
    show_default=True,
    help="ORT graph optimization levels: disable, basic, extended, all (comma-separated).",
)
@click.option("--shape", "shapes", multiple=True, help="An input's shape: NAME:1x128 (repeatable).")
@click.option(
    "--sweep",
    "sweeps",
    multiple=True,
    help="Repeat for sizes of a dynamic dim: batch=1,4,16, sequence=... or DIM=... (repeatable: all combinations).",
)
@click.option(
    "--inputs",
    "inputs_file",
    type=click.Path(path_type=Path),
    help="Benchmark on these inputs (.npz) instead of random ones.",
)
@click.option(
    "--budget",
    type=POSITIVE,
    default=20.0,
    show_default=True,
    help="Seconds of interleaved timing per input size and provider.",
)
@click.option(
    "--ci",
    "ci_target",
    type=POSITIVE,
    default=0.01,
    show_default=True,
    help="Stop early once every speed-up's 95% interval is within ±this fraction.",
)
@click.option(
    "--sessions",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Recreate the ORT sessions this many times or more over the budget; intervals then include session-to-session variation.",
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "cpu"]),
    default="wall",
    show_default=True,
    help="Time runs by wall clock (latency) or process CPU time (steadier on a busy, shared machine).",
)
@click.option(
    "--no-memory", is_flag=True, help="Skip the peak-memory measurement (child processes)."
)
@click.option(
    "--run-timeout",
    type=POSITIVE,
    default=600.0,
    show_default=True,
    help="Stop a variant whose first ONNX Runtime run takes longer than this many seconds.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    help="Write the latency distributions to this PNG.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@_common
def bench(
    model: Path,
    optimized: Path | None,
    compare: tuple[str, ...],
    level: int,
    torch_spec: str | None,
    torch_compile: bool,
    provider: str,
    threads: int,
    ort_level: str,
    shapes: tuple[str, ...],
    sweeps: tuple[str, ...],
    inputs_file: Path | None,
    budget: float,
    ci_target: float,
    sessions: int,
    clock: str,
    no_memory: bool,
    run_timeout: float,
    seed: int,
    plot_path: Path | None,
    as_json: bool,
    verbose: int,
    traceback: bool,
) -> None:
    """Time MODEL against its optimized form (and PyTorch) on ONNX Runtime, interleaved; speed-ups with 95% intervals."""
    from onnxopt.bench import BenchOptions, plot, render, run_bench
    from onnxopt.bench.run import parse_compare, parse_sweep
    from onnxopt.validate import load_inputs

    _setup_logging(verbose)
    if torch_compile and not torch_spec:
        raise UsageError("--torch-compile needs --torch")
    options = BenchOptions(
        optimized=optimized,
        compare=parse_compare(compare),
        level=level,
        torch=torch_spec,
        torch_compile=torch_compile,
        providers=tuple(_split(provider)),
        threads=threads,
        ort_levels=tuple(_split(ort_level)),
        shapes=_once("--shape", [parse_input_shape(s, "--shape") for s in shapes]),
        sweeps=tuple(parse_sweep(s) for s in sweeps),
        inputs=load_inputs(inputs_file)[0] if inputs_file else None,
        budget_seconds=budget,
        ci_target=ci_target,
        sessions=sessions,
        clock=clock,
        memory=not no_memory,
        seed=seed,
        run_timeout=run_timeout,
    )
    with (
        _stderr_console().status("benchmarking", spinner="dots") as status,
        doing(f"benchmarking {model}"),
    ):
        report = run_bench(model, options, progress=lambda step: status.update(f"{step} …"))
    if plot_path is not None:
        click.echo(f"wrote {plot(report, plot_path)}", err=True)
    if as_json:
        click.echo(_json_text(report.to_json(), indent=2))
    else:
        render(report, _wide_console())


if __name__ == "__main__":  # pragma: no cover
    main()
