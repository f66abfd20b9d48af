"""Optimize many models at once (``-j N`` worker processes); one model's failure never stops the others."""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from onnxopt.api import OptimizeResult
from onnxopt.checks import Measurements, Thresholds, evaluate
from onnxopt.ci_report import ModelOutcome, outcome_failures
from onnxopt.errors import UsageError, describe
from onnxopt.guard import adopt_notes, doing, last_note, notes_path

FALLBACK_LIMIT = 3  # passes --fallback may drop before it gives up (its --help says so: a test)
# One try of a model with some options and the passes dropped so far, (pass, why) each: its
# outcome and whatever else the caller keeps of it.
Attempt = Callable[[Mapping[str, Any], tuple[tuple[str, str], ...]], tuple[ModelOutcome, Any]]


def output_paths(models: Sequence[Path], out_dir: Path) -> list[Path]:
    """``out_dir/<name>`` for each model; two inputs with one file name would overwrite each other."""
    seen: dict[str, Path] = {}
    for model in models:
        if model.name in seen:
            raise UsageError(
                f"{model} and {seen[model.name]} have the same file name; --out-dir needs distinct names"
            )
        seen[model.name] = model
    return [out_dir / m.name for m in models]


def check_and_write(
    model: Path,
    result: OptimizeResult,
    thresholds: Thresholds,
    output: Path | None,
    external_data: bool | None = None,
    measured: Measurements | None = None,
    *,
    overwrite: bool = False,
    seconds: float | None = None,
) -> ModelOutcome:
    """Check thresholds; write ``output`` only when validation and every threshold passed.

    The input model and its external data are protected unless ``overwrite``. The returned report
    carries the written file's name and size.
    """
    from onnxopt import io

    report = result.report
    checks = tuple(evaluate(report, thresholds, measured))
    failures = outcome_failures(report, checks)
    written = None
    if output is not None and not failures:
        assert result.source is not None
        protected = () if overwrite else (model, *result.source.external_files)
        path = io.save_model(result.model, output, external_data=external_data, protected=protected)
        written = str(path)
        report = dataclasses.replace(
            report,
            output=written,
            after=dataclasses.replace(report.after, file_bytes=path.stat().st_size),
            warnings=(*report.warnings, *_runtime_config_left_behind(model, path)),
        )
    elapsed = report.optimize_seconds if seconds is None else seconds
    return ModelOutcome(str(model), report, checks, None, written, elapsed, failures)


GENAI_CONFIG = "genai_config.json"


def _runtime_config_left_behind(model: Path, written: Path) -> list[str]:
    """A warning when onnxruntime-genai's config sits beside the input and its runtime would not
    find the output: it reads a model only through that file (and the tokenizer files beside
    it), by the file name the config gives."""
    import json

    if not (model.parent / GENAI_CONFIG).is_file():
        return []
    here = written.parent / GENAI_CONFIG
    config = here if here.is_file() else model.parent / GENAI_CONFIG
    try:
        named = json.loads(config.read_text())["model"]["decoder"]["filename"]
    except (OSError, ValueError, KeyError, TypeError):
        named = None
    other_name = isinstance(named, str) and named != written.name
    if config == here:
        return [f"{config} names the model '{named}', not {written.name}"] if other_name else []
    renamed = f" (the config names the model '{named}')" if other_name else ""
    return [
        f"{config} names this model for onnxruntime-genai; to run {written.name} there, copy "
        f"that config and the tokenizer files into {written.parent}{renamed}"
    ]


def with_dropped(result: OptimizeResult, dropped: Sequence[tuple[str, str]]) -> OptimizeResult:
    """``result`` whose report records the passes --fallback left out, (pass, why) each."""
    if not dropped:
        return result
    report = dataclasses.replace(
        result.report,
        dropped_passes=tuple(name for name, _ in dropped),
        warnings=(*result.report.warnings, *(why for _, why in dropped)),
    )
    return dataclasses.replace(result, report=report)


def validation_failed(outcome: ModelOutcome) -> bool:
    validation = outcome.report.validation if outcome.report is not None else None
    return validation is not None and not validation.passed


def fall_back(
    first: tuple[ModelOutcome, Any],
    options: Mapping[str, Any],
    attempt: Attempt,
    *,
    bisect: Callable[[ModelOutcome, Mapping[str, Any]], tuple[str, str] | None],
    say: Callable[[str], None],
    say_failures: bool = True,
    limit: int | None = None,
) -> tuple[ModelOutcome, Any]:
    """--fallback: while validation fails, let ``bisect`` name the pass that broke the model, (pass,
    what it broke) or None, and ``attempt`` the model again without it, at most ``limit`` times
    (default FALLBACK_LIMIT). Each step goes to ``say``, and with ``say_failures`` each failed
    attempt's failure lines before it (the last attempt's too: the caller need not repeat them)."""
    current, options = first, dict(options)
    limit = FALLBACK_LIMIT if limit is None else limit
    dropped: list[tuple[str, str]] = []
    while validation_failed(current[0]):
        for line in current[0].failures if say_failures else ():
            say(line)
        if len(dropped) == limit:
            say(f"fallback: still failing after dropping {limit} passes; giving up")
            break
        found = bisect(current[0], options)
        if found is None:
            say("fallback: the bisection named no pass; giving up")
            break
        culprit, detail = found
        dropped.append(
            (culprit, f"--fallback dropped pass '{culprit}': validation failed with it{detail}")
        )
        options["disable"] = [*options.get("disable", ()), culprit]
        say(f"fallback: optimizing again without {culprit}")
        current = attempt(options, tuple(dropped))
    return current


def optimize_one(
    model: Path,
    output: Path | None,
    options: Mapping[str, Any],
    thresholds: Thresholds,
    external_data: bool | None = None,
    fallback: bool = False,
) -> ModelOutcome:
    """Optimize, check thresholds, and write ``output`` only when everything passed; never raise.
    ``fallback``: as optimize --fallback, the bisection quiet; a model still failing gets the
    fallback's steps after its own failure lines."""
    from onnxopt import api

    start = time.perf_counter()

    def attempt(
        opts: Mapping[str, Any], dropped: tuple[tuple[str, str], ...]
    ) -> tuple[ModelOutcome, Any]:
        with doing(f"optimizing {model}"):
            result = with_dropped(api.optimize(model, **opts), dropped)
        outcome = check_and_write(
            model, result, thresholds, output, external_data, seconds=time.perf_counter() - start
        )
        return outcome, None

    def quiet_bisect(outcome: ModelOutcome, opts: Mapping[str, Any]) -> tuple[str, str] | None:
        from onnxopt.bisect import bisect_run

        assert outcome.report is not None
        with doing(f"bisecting {model}"):
            found = bisect_run(model, outcome.report.passes_run, opts)
        return None if found.culprit is None else (found.culprit, found.detail)

    try:
        outcome, _ = attempt(options, ())
        if fallback and validation_failed(outcome):
            steps: list[str] = []
            outcome, _ = fall_back(
                (outcome, None),
                options,
                attempt,
                bisect=quiet_bisect,
                say=steps.append,
                say_failures=False,
            )
            if outcome.failures:
                outcome = dataclasses.replace(outcome, failures=(*outcome.failures, *steps))
        return dataclasses.replace(outcome, seconds=time.perf_counter() - start)
    except Exception as exc:  # one model's error, internal or not, must not stop the batch
        return ModelOutcome(str(model), error=describe(exc), seconds=time.perf_counter() - start)


def optimize_many(
    models: Sequence[Path],
    out_dir: Path | None,
    options: Mapping[str, Any],
    thresholds: Thresholds,
    *,
    jobs: int = 1,
    external_data: bool | None = None,
    progress: Callable[[ModelOutcome], None] | None = None,
    fallback: bool = False,
) -> list[ModelOutcome]:
    """Outcomes in the order of ``models``, whatever order the workers finish in.

    Several models run in spawned worker processes (``jobs`` at a time, one at a time for
    ``jobs=1``; each worker imports onnxopt, about a second), so that one whose run kills its
    process (ONNX Runtime dying of SIGFPE or SIGSEGV) fails alone: the pool's other models are
    run again, one at a time until the model that crashed is known, and it gets an error saying
    what its worker was doing. One model runs in-process.
    """
    outputs: list[Path | None] = (
        list(output_paths(models, out_dir)) if out_dir is not None else [None] * len(models)
    )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[int, ModelOutcome] = {}

    def done(index: int, outcome: ModelOutcome) -> None:
        results[index] = outcome
        if progress is not None:
            progress(outcome)

    if len(models) == 1:
        done(0, optimize_one(models[0], outputs[0], options, thresholds, external_data, fallback))
        return [results[0]]
    pending = list(range(len(models)))
    while pending:
        broken: list[int] = []
        # Spawned, not forked: a process that already ran ONNX Runtime (the API in a notebook, a
        # probe) holds thread pools and locks that a forked worker can inherit locked, and hang.
        with ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=adopt_notes,
            initargs=(notes_path(),),
        ) as pool:
            futures = {
                pool.submit(
                    optimize_one,
                    models[i],
                    outputs[i],
                    dict(options),
                    thresholds,
                    external_data,
                    fallback,
                ): i
                for i in pending
            }
            for future in as_completed(futures):
                try:
                    done(futures[future], future.result())
                except BrokenProcessPool:  # a worker died of a signal: the pool's rest fails
                    broken.append(futures[future])
        broken.sort()
        if broken and jobs == 1:
            # one worker, models in order: the first that did not finish is the one that crashed
            crashed, *pending = broken
            noted = last_note()
            done(
                crashed,
                ModelOutcome(
                    str(models[crashed]),
                    error="its worker process crashed (a native fault, e.g. in ONNX Runtime)"
                    + (f" while {noted}" if noted else ""),
                ),
            )
        else:
            pending, jobs = broken, 1  # which of those running crashed is unknown: one at a time
    return [results[i] for i in range(len(models))]
