"""The Python API: ``optimize(path_or_model, ...) -> OptimizeResult`` does what the CLI's optimize does."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxopt import io
from onnxopt.analysis.memory_plan import MemoryPlan, memory_report
from onnxopt.errors import UsageError
from onnxopt.guard import doing
from onnxopt.ort_versions import (
    format_version,
    model_provider_problem,
    model_requirement,
    requested_providers,
    requested_version,
)
from onnxopt.passes.base import Pipeline, VerifyEach
from onnxopt.passes.infer_shapes import (
    declared_output_dims,
    forget_private_output_names,
    keep_declared_outputs,
    restore_private_output_names,
)
from onnxopt.passes.levels import DEFAULT_LEVEL, build_steps
from onnxopt.passes.options import DEFAULT_FOLD_LIMIT_BYTES, PassOptions, Target
from onnxopt.random_draws import describe, unseeded_draws
from onnxopt.reference import Reference, load_reference, reference_path_for
from onnxopt.report import ModelSummary, OptimizeReport
from onnxopt.validate import (
    DEFAULT_RUN_TIMEOUT,
    CannotValidate,
    OutputComparison,
    ReferenceReport,
    ValidationReport,
    compare_to_eager,
    input_specs,
    output_precisions,
    release_session,
    shared_sessions,
    validate,
)

logger = logging.getLogger(__name__)

# Recorded in every optimized model: which runtime its fusions may rely on ("onnx" or "ort").
TARGET_METADATA_KEY = "onnxopt.target"
# And for target ort, the oldest ONNX Runtime release it was written for (--ort-version).
ORT_VERSION_METADATA_KEY = "onnxopt.ort_version"
# ... and the execution providers it was written for (--ort-providers), "cpu" or "cpu,cuda".
ORT_PROVIDERS_METADATA_KEY = "onnxopt.ort_providers"


@dataclass(frozen=True)
class OptimizeResult:
    model: ir.Model
    report: OptimizeReport
    source: io.LoadedModel | None
    memory_plan: MemoryPlan | None = None

    @property
    def validated(self) -> bool:
        return self.report.validation is not None and self.report.validation.passed


@contextlib.contextmanager
def _located(loaded: io.LoadedModel | None) -> Iterator[None]:
    """Prefix "why validation cannot run" with the model file, so the one error line says where."""
    try:
        yield
    except CannotValidate as exc:
        if loaded is None or loaded.path is None:
            raise
        raise CannotValidate(f"{loaded.path}: {exc}") from exc


def optimize(
    model: str | os.PathLike[str] | ir.Model,
    *,
    level: int = DEFAULT_LEVEL,
    passes: Sequence[str] | None = None,
    disable: Sequence[str] = (),
    enable: Sequence[str] = (),
    target: Target = "ort",
    ort_version: str | None = None,
    ort_providers: str | None = None,
    opset: int | None = None,
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES,
    fold_may_grow: bool = False,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    check: bool = True,
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    reference: str | os.PathLike[str] | Reference | None = None,
    find_reference: bool = False,
    explain: bool = False,
    verify_each: bool = False,
    progress: Callable[[str], None] | None = None,
    dims: Mapping[str, int] | None = None,
    memory: bool = False,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
) -> OptimizeResult:
    """Optimize a model (a path or an ``ir.Model``, which is left untouched) and validate the result.

    Returns the optimized model and its report; the caller decides what to do with a failed
    validation (``result.report.validation.passed``). Nothing is written to disk.

    ``reference`` (a ``.ref.npz`` written by ``onnxopt export``, or a loaded :class:`Reference`)
    adds its inputs to validation and compares both the original and the optimized model to the
    eager PyTorch outputs (``result.report.reference``). With ``find_reference``, a model path's
    own reference (``x.onnx`` -> ``x.ref.npz``) is used when it exists and none was given.

    ``ort_version`` (``"1.26"``) is the oldest ONNX Runtime release the output must run on
    (``target="ort"``): contrib-op forms it lacks are not written. By default, the installed
    onnxruntime's release. ``ort_providers`` (``"cpu,cuda"``) names the execution providers it
    must run on: forms CUDA lacks are not written where it is named (by default it is where the
    installed onnxruntime is the CUDA build).

    ``opset`` raises the model's default-domain opset with onnx.version_converter before the
    passes run (so fusions may use newer standard ops); validation still compares with the
    unconverted original.

    With ``memory=True`` the report gains activation-memory figures (symbolic dims bound by
    ``dims``) and ``result.memory_plan`` holds the optimized model's arena plan.

    Each ONNX Runtime run of validation stops after ``run_timeout`` seconds (a hostile Loop would
    run for ever); the original running too long is a ``CannotValidate`` error.
    """
    explicit_reference = reference is not None
    if reference is None and find_reference and not isinstance(model, ir.Model):
        own = reference_path_for(model)
        reference = own if own.is_file() else None
    eager: Reference | None = None
    eager_source = ""
    if isinstance(reference, Reference):
        eager, eager_source = reference, "<reference>"
    elif reference is not None:
        eager, eager_source = load_reference(reference), str(reference)
    options = PassOptions(
        fold_limit_bytes=fold_limit_bytes,
        fold_may_grow=fold_may_grow,
        target=target,
        ort_version=requested_version(ort_version, target),
        ort_providers=requested_providers(ort_providers),
        input_shapes=dict(input_shapes or {}),
        explain=explain,
        dims=dict(dims or {}),
    )
    steps = build_steps(level, passes=passes, disable=disable, enable=enable, options=options)
    loaded: io.LoadedModel | None = None
    if isinstance(model, ir.Model):
        working = model.clone()
        original: ir.Model | Path = model
        source_name = model.graph.name or "<model>"
        file_bytes = None
    else:
        if progress is not None:
            progress("load")
        loaded = io.load_model(model)
        working = loaded.model
        original = Path(model)
        if loaded.file_bytes > io.PROTOBUF_LIMIT and check:
            # ORT cannot parse a single file past protobuf's 2 GiB; a second (mapped) load of it
            # is handed over as a graph plus weight buffers instead.
            original = io.load_model(model).model
        if not loaded.runs_as_is and check:
            # ORT refuses (or crashes on) the file as it is: validate against a load of it,
            # repaired the same way.
            original = io.load_model(model).model
        source_name = str(model)
        file_bytes = loaded.file_bytes
    before = ModelSummary.of(working, file_bytes)
    unoptimized = working.clone() if memory else None
    input_names = [str(v.name) for v in working.graph.inputs]
    eager_inputs = (
        {k: v for k, v in eager.inputs.items() if k in input_names} if eager is not None else {}
    )
    extra_warnings: list[str] = []
    if loaded is not None:
        extra_warnings.extend(loaded.repairs)
    extra_warnings.extend(_unknown_dims(working, options.dims))
    unfit = [
        f"{name} {'x'.join(map(str, array.shape))}"
        for name, array in eager_inputs.items()
        if name in options.input_shapes and tuple(array.shape) != tuple(options.input_shapes[name])
    ]
    if eager is not None and unfit:
        unfit_inputs = (
            f"the reference inputs ({', '.join(unfit)}) do not fit the pinned --input-shape"
        )
        if explicit_reference:
            raise UsageError(f"--reference {eager_source}: {unfit_inputs}")
        extra_warnings.append(
            f"{eager_source}: {unfit_inputs}; the model is not compared with eager PyTorch"
        )
        eager, eager_inputs = None, {}
    drawing = unseeded_draws(working) if eager is not None else []
    if drawing:
        # PyTorch drew other numbers than ONNX Runtime will: a comparison would only show that.
        extra_warnings.append(
            f"{eager_source}: not compared with eager PyTorch: the model draws random numbers "
            f"({describe(drawing)}), and PyTorch's outputs came from other draws"
        )
        eager = None  # (its inputs are still validation inputs)
    with _located(loaded):
        specs = input_specs(working) if check and inputs is None and not input_shapes else None
    # Read off the original before the passes run: an output computed in float16 behind float32
    # I/O is compared with float16's tolerance.
    precisions = output_precisions(working) if check else None

    start = time.perf_counter()
    conversion = None
    if opset is not None:
        if progress is not None:
            progress("convert opset")
        from_opset = working.opset_imports.get("", working.opset_imports.get("ai.onnx"))
        working = io.convert_opset(working, opset)
        if from_opset != opset:
            conversion = f"opset {from_opset} → {opset} (onnx.version_converter)"
    instruments = [VerifyEach()] if verify_each else []
    declared = declared_output_dims(working)
    private = forget_private_output_names(working)
    result = Pipeline(steps, instruments)(working, progress)
    keep_declared_outputs(working, declared)
    restore_private_output_names(working, private)
    optimize_seconds = time.perf_counter() - start
    working.metadata_props[TARGET_METADATA_KEY] = target
    written_for = format_version(options.ort_version) if target == "ort" else None
    if written_for is not None:
        working.metadata_props[ORT_VERSION_METADATA_KEY] = written_for
        needs = model_requirement(working)
        if needs is not None and needs[0] > options.ort_version:
            extra_warnings.append(
                f"the model holds {needs[1]}, which needs ONNX Runtime {format_version(needs[0])}: "
                f"it will not run on {written_for}"
            )
        working.metadata_props[ORT_PROVIDERS_METADATA_KEY] = ",".join(options.ort_providers)
        problem = model_provider_problem(working, options.ort_providers)
        if problem is not None:
            extra_warnings.append(
                f"the model holds {problem}, yet it is for cuda (--ort-providers)"
            )

    validation: ValidationReport | None = None
    validate_seconds = 0.0
    memory_section = memory_plan = None
    reference_report: ReferenceReport | None = None
    # Validation and the eager comparison share one ORT session per model (each loads the weights),
    # and the original's is released before the optimized model's is made: everything that runs
    # the original comes first.
    with shared_sessions():
        export_cmp: tuple[OutputComparison, ...] = ()
        export_error = None
        if eager is not None:
            if progress is not None:
                progress("compare with eager PyTorch")
            export_cmp, export_error = compare_to_eager(original, eager_inputs, eager.outputs)

        if check:
            if progress is not None:
                progress("validate")
            start = time.perf_counter()
            with _located(loaded), doing("validating (--no-validate skips it)"):
                if specs is None and inputs is None:
                    # pinned shapes: generate inputs of the pinned sizes
                    specs = input_specs(working)
                validation = validate(
                    original,
                    working,
                    specs=specs,
                    inputs=inputs,
                    extra_inputs=[eager_inputs] if eager_inputs else [],
                    run_timeout=run_timeout,
                    precisions=precisions,
                    sizes=dims,
                )
            validate_seconds = time.perf_counter() - start
            extra_warnings.extend(
                f"the original model's output '{name}' is NaN at every element on the "
                "validation inputs, so comparing it proves nothing; validate with realistic "
                "inputs (--inputs)"
                for name in validation.all_nan
            )
        release_session(original)

        if unoptimized is not None:
            if progress is not None:
                progress("memory plan")
            memory_section, memory_plan = memory_report(
                unoptimized, working, dims=dims, input_shapes=input_shapes
            )

        if eager is not None:
            optimized_cmp, optimized_error = compare_to_eager(working, eager_inputs, eager.outputs)
            errors = tuple(
                f"{what}: {error}"
                for what, error in (("original", export_error), ("optimized", optimized_error))
                if error
            )
            reference_report = ReferenceReport(
                eager_source, eager.metadata, export_cmp, optimized_cmp, errors
            )

    report = OptimizeReport(
        source=source_name,
        output=None,
        level=level,
        target=target,
        passes_run=tuple(r.name for r in result.records),
        before=before,
        after=ModelSummary.of(working),  # file size is known once written
        records=result.records,
        validation=validation,
        warnings=(*result.warnings, *extra_warnings),
        optimize_seconds=optimize_seconds,
        validate_seconds=validate_seconds,
        memory=memory_section,
        reference=reference_report,
        opset_conversion=conversion,
        passes_skipped=result.skipped,
        ort_version=written_for,
        ort_providers=options.ort_providers if target == "ort" else (),
    )
    return OptimizeResult(working, report, loaded, memory_plan)


def _unknown_dims(model: ir.Model, dims: Mapping[str, int]) -> list[str]:
    """A warning for each --dim name that no dim of the main graph carries (a typo sizes nothing)."""
    values = [*model.graph.inputs, *model.graph.outputs]
    values.extend(out for node in model.graph for out in node.outputs)
    names: set[str] = set()
    for value in values:
        for dim in value.shape or ():
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                # 'past + seq' (optimum) and 's15 + s70' (torch.export) name the dims they sum.
                names.add(dim.value)
                names.update(re.findall(r"[A-Za-z_][\w.]*", dim.value))
    return [
        f"--dim {name}: no dim of the model is named so (it has {', '.join(sorted(names)) or 'none'})"
        for name in dims
        if name not in names
    ]
