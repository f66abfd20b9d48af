"""``run_bench``: optimize (or load) the candidate, build the inputs, time every variant, check outputs.

For each input size (one, or each point of the sweeps) and each provider, every variant is loaded
(session creation and first run timed), its peak memory measured in a child process, then all are
warmed up and timed interleaved in one loop; speed-ups are medians of paired ratios.
"""

from __future__ import annotations

import itertools
import logging
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxopt import io
from onnxopt.analysis import memory as run_memory
from onnxopt.bench import memory, providers, timing
from onnxopt.bench.report import (
    Agreement,
    BenchReport,
    GroupResult,
    OptimizedInfo,
    PointResult,
    VariantResult,
)
from onnxopt.bench.stats import LatencyStats, paired_speedup
from onnxopt.errors import ModelLoadError, UsageError
from onnxopt.guard import doing, temp_folder
from onnxopt.input_sizes import DimSymbols, Relation, SizePlan
from onnxopt.passes.levels import DEFAULT_LEVEL
from onnxopt.random_draws import describe, seed_draws, unseeded_draws
from onnxopt.report import ModelSummary, format_bytes
from onnxopt.validate import (
    InputSpec,
    compare_arrays,
    describe_feeds,
    find_relation,
    input_specs,
    make_inputs,
    shared_sessions,
    sizes_that_run,
    spectral_signal,
)

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 1
DEFAULT_DYNAMIC_SIZE = 128  # a dynamic dim other than the first: a sequence length or image side
SWEEP_ALIASES = {"batch": 0, "sequence": 1, "seq": 1}


@dataclass(frozen=True)
class BenchOptions:
    optimized: Path | None = None  # benchmark this file instead of optimizing in memory
    # Further files timed in the same interleaved rounds (e.g. other tools' outputs), by label.
    compare: Mapping[str, Path] = field(default_factory=dict)
    level: int = DEFAULT_LEVEL
    torch: str | None = None  # package.module:factory or a zoo name
    torch_compile: bool = False
    providers: tuple[str, ...] = ("cpu",)
    threads: int = 0  # 0: the number of physical cores
    ort_levels: tuple[str, ...] = ("all", "disable")
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    sweeps: tuple[tuple[str, tuple[int, ...]], ...] = ()
    inputs: Mapping[str, np.ndarray] | None = None
    budget_seconds: float = 20.0
    sessions: int = 3  # session generations the budget is spread over (see timing.interleave)
    clock: str = "wall"  # wall: latency; cpu: process CPU time, steadier on a shared machine
    ci_target: float = 0.01
    confidence: float = 0.95
    min_rounds: int = 20
    max_rounds: int = 100_000
    warmup_runs: int = 5
    memory: bool = True
    seed: int = 0
    run_timeout: float = 600.0  # the first run of each variant is stopped after this many seconds


@dataclass
class _Loaded:
    """A variant ready to time."""

    name: str
    provider: str
    ort_level: str | None
    create_seconds: float
    first_run_seconds: float
    run: Callable[[], object]
    outputs: list[np.ndarray]
    memory: memory.MemoryResult | None
    model_path: str | None = None  # ORT variants: what a reload creates a new session from


RESERVED_LABELS = frozenset({"original", "optimized", "torch-eager", "torch-compile"})


def parse_compare(texts: Sequence[str]) -> dict[str, Path]:
    """``["ortopt=a.onnx", "b.onnx"]`` -> {"ortopt": a.onnx, "b": b.onnx}: a bare path is labelled
    by its file stem; labels must be unique and not name a built-in variant."""
    files: dict[str, Path] = {}
    for text in texts:
        label, sep, path = text.partition("=")
        if not sep:
            label, path = Path(text).stem, text
        label = label.strip()
        if not label or not path.strip() or label in RESERVED_LABELS or label in files:
            raise UsageError(
                f"--compare '{text}': expected NAME=PATH with a unique NAME other than "
                f"{', '.join(sorted(RESERVED_LABELS))}"
            )
        files[label] = Path(path.strip())
    return files


def parse_sweep(text: str) -> tuple[str, tuple[int, ...]]:
    """``batch=1,4,16`` -> ("batch", (1, 4, 16))."""
    name, sep, values = text.partition("=")
    try:
        sizes = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sep or not name.strip() or not sizes or any(v <= 0 for v in sizes):
        raise UsageError(
            f"--sweep '{text}': expected DIM=SIZE,SIZE,... with positive sizes (e.g. batch=1,4,16)"
        )
    return name.strip(), sizes


def _threads(requested: int) -> int:
    if requested > 0:
        return requested
    import psutil

    return int(psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


class OriginalFailsOnInputs(ModelLoadError):
    """The original model fails on the inputs bench generated (the optimized one is not at fault)."""


def _sweep_points(sweeps: Sequence[tuple[str, tuple[int, ...]]]) -> list[dict[str, int]]:
    if not sweeps:
        return [{}]
    names = [name for name, _ in sweeps]
    return [
        dict(zip(names, values, strict=False))
        for values in itertools.product(*(v for _, v in sweeps))
    ]


def resolve_shapes(
    specs: Sequence[InputSpec],
    pinned: Mapping[str, tuple[int, ...]],
    sweep: Mapping[str, int],
    examples: Mapping[str, tuple[int, ...]],
    relation: Relation | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete input shapes: pinned (--shape) > sweep (dim name or batch/sequence) > example inputs > defaults.

    A dim written as an expression of others (``past + seq``) is computed from them; ``relation``
    (see :func:`onnxopt.validate.find_relation`) sizes its target dim from the others unless the
    target was pinned or swept.
    """
    names = [s.name for s in specs]
    for name in pinned:
        if name not in names:
            raise UsageError(
                f"--shape {name}: the model has no input '{name}' (inputs: {', '.join(names)})"
            )
    symbols = DimSymbols.of(specs)
    for name in sweep:
        if name not in symbols.atoms and name not in SWEEP_ALIASES:
            known = ", ".join(sorted(symbols.atoms)) or "none"
            raise UsageError(
                f"--sweep {name}: not a dynamic dim of the inputs (dims: {known}; or batch, sequence)"
            )
    chosen: dict[str, int] = {k: v for k, v in sweep.items() if k in symbols.atoms}
    for spec in specs:
        if spec.name in pinned:
            shape = pinned[spec.name]
            if len(shape) != len(spec.dims) or any(
                isinstance(d, int) and d != s for d, s in zip(spec.dims, shape, strict=False)
            ):
                raise UsageError(
                    f"--shape {spec.name}: {shape} does not fit the input's dims {spec.dims}"
                )
            for dim, pinned_size in zip(spec.dims, shape, strict=False):
                if isinstance(dim, str) and dim in symbols.atoms:
                    chosen.setdefault(dim, pinned_size)
    fixed = set(chosen)

    def default(spec: InputSpec, axis: int) -> int:
        alias = next((k for k, a in SWEEP_ALIASES.items() if a == axis and k in sweep), None)
        example = examples.get(spec.name)
        if alias is not None:
            return sweep[alias]
        if example is not None and len(example) == len(spec.dims):
            return example[axis]
        return DEFAULT_BATCH if axis == 0 else DEFAULT_DYNAMIC_SIZE

    for spec in specs:
        if spec.name not in pinned:
            for axis, dim in enumerate(spec.dims):
                if isinstance(dim, str) and dim in symbols.atoms:
                    chosen.setdefault(dim, default(spec, axis))
    if relation is not None and relation.target not in fixed:
        plan = SizePlan(chosen, 1).with_relation(relation)
        chosen = dict(plan.sizes) if plan is not None else chosen
    shapes: dict[str, tuple[int, ...]] = {}
    plan = SizePlan(chosen, 1)
    for spec in specs:
        if spec.name in pinned:
            shapes[spec.name] = pinned[spec.name]
            continue
        dims: list[int] = []
        for axis, dim in enumerate(spec.dims):
            size: int | None = symbols.size(dim, plan) if dim is not None else default(spec, axis)
            if size is None:
                raise UsageError(
                    f"input '{spec.name}': its dim '{dim}' comes out negative or too large with "
                    f"the dims {chosen}; size them with --sweep DIM=SIZE or --shape"
                )
            dims.append(size)
        shapes[spec.name] = tuple(dims)
    return shapes


def _refuse_beyond_memory(
    models: Mapping[str, ir.Model], sessions: int, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """Refuse input sizes at which the sessions timed together cannot fit in available memory.

    Each of the ``sessions`` ONNX Runtime sessions per model keeps its peak activations (ORT's CPU
    arena does not shrink), and the weights are held at least once: a diffusion UNet at bench's
    default 128 x 128 latent makes 8 GiB attention scores per block. Run anyway, it is killed by the
    kernel, or takes the machine down with it, instead of getting an answer.
    """
    available = run_memory.available_memory()
    if available is None:
        return
    floors = {label: _run_floor(model, shapes) for label, model in models.items()}
    known = {label: floor for label, floor in floors.items() if floor is not None}
    if not known:
        return
    needed = sessions * sum(f.activation_bytes for f in known.values())
    needed += max(f.weight_bytes for f in known.values())
    if needed <= available:
        return
    sizes = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in shapes.items())
    label, floor = max(known.items(), key=lambda item: item[1].activation_bytes)
    why = ""
    if floor.largest is not None:
        name, shape, size = floor.largest
        why = f"; the {label} model's '{name}' {list(shape)} alone takes {format_bytes(size)}"
    raise UsageError(
        f"at inputs {sizes}, the {sessions * len(known)} ONNX Runtime sessions timed together "
        f"need at least {format_bytes(needed)} of memory and {format_bytes(available)} is "
        f"available{why}; choose smaller sizes with --shape NAME:AxB or --sweep DIM=N"
    )


# What sizes the intermediates behind Reshapes whose targets are computed from Shape values.
_SIZING_PASSES = ("infer-shapes", "fold-shape-values", "fold-constants", "infer-shapes")


def _run_floor(
    model: ir.Model, shapes: Mapping[str, tuple[int, ...]]
) -> run_memory.RunFloor | None:
    """The model's :class:`~onnxopt.analysis.memory.RunFloor`, its shape values folded (on a
    copy) at those input shapes where ONNX shape inference alone leaves intermediates unsized."""
    from onnxopt import api

    floor = run_memory.run_floor(model, shapes)
    if floor is None or not floor.unknown:
        return floor
    try:
        folded = api.optimize(model, passes=_SIZING_PASSES, input_shapes=shapes, check=False)
    except Exception:  # an estimate only: keep the one inference gave
        return floor
    return run_memory.run_floor(folded.model, shapes) or floor


def _feeds(
    specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], seed: int
) -> dict[str, np.ndarray]:
    sequences = [s.name for s in specs if s.kind == "sequence"]
    if sequences:
        raise UsageError(
            f"input '{sequences[0]}' is a sequence of tensors, which bench does not generate "
            "(validation does); time the model with a script of your own"
        )
    concrete = [replace(s, dims=shapes[s.name]) for s in specs]
    feeds = make_inputs(
        concrete, lambda d: d if isinstance(d, int) else 1, np.random.default_rng(seed)
    )
    if feeds is None:
        raise UsageError(
            f"inputs of shapes {dict(shapes)} are too large to generate; choose smaller --shape"
        )
    return {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}


def _seeded_copy(path: str, target: Path) -> str:
    """``path`` with every unseeded random op seeded from its name, written to
    ``target``; ``path`` itself when nothing draws there."""
    model = io.load_model(path).model
    if not seed_draws(model):
        return path
    return str(io.save_model(model, target))


def _agreement(
    reference: str,
    expected: Sequence[np.ndarray],
    actual: Sequence[np.ndarray],
    names: Sequence[str],
) -> Agreement:
    if not expected or not actual:
        return Agreement(reference, 0, 0.0, 0.0, 0, "no outputs to compare")
    count = min(len(expected), len(actual))
    worst_abs = worst_rel = 0.0
    mismatches = compared = 0
    for i in range(count):
        e, a = np.asarray(expected[i]), np.asarray(actual[i])
        if e.shape != a.shape:
            continue  # positional matching with eager outputs may pair unrelated tensors
        comparison = compare_arrays(
            names[i] if i < len(names) else str(i), e, a.astype(e.dtype, copy=False)
        )
        compared += 1
        worst_abs = max(worst_abs, comparison.max_abs)
        worst_rel = max(worst_rel, comparison.max_rel)
        mismatches += comparison.mismatches
    note = "" if compared else "output shapes differ"
    return Agreement(reference, compared, worst_abs, worst_rel, mismatches, note)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _timed_first_run(run: Callable[[], list[np.ndarray]]) -> tuple[float, list[np.ndarray]]:
    start = time.perf_counter()
    outputs = run()
    return time.perf_counter() - start, outputs


@dataclass(frozen=True)
class _Setup:
    """What every group of one input size shares."""

    models: Mapping[str, str]  # variant name -> model file
    options: BenchOptions
    threads: int
    feeds: Mapping[str, np.ndarray]
    torch_model: Any
    input_names: Sequence[str]
    output_names: Sequence[str]
    progress: Callable[[str], None]
    # --compare files ONNX Runtime could not load, with why: skipped, and said in the report.
    unloadable: dict[str, str] = field(default_factory=dict)


def _load_group(provider: str, setup: _Setup) -> list[_Loaded]:
    options, threads, feeds, progress = setup.options, setup.threads, setup.feeds, setup.progress
    torch_model, input_names = setup.torch_model, setup.input_names
    loaded: list[_Loaded] = []
    for level in options.ort_levels:
        for name, path in setup.models.items():
            if name in setup.unloadable:
                continue
            mem = None
            if options.memory:
                progress(f"{provider}: memory of {name} ({level}) in a child process")
                job = {
                    "kind": "ort",
                    "model": path,
                    "provider": provider,
                    "level": level,
                    "threads": threads,
                }
                mem = memory.measure(job, feeds)
            progress(f"{provider}: loading {name} ({level})")
            try:
                with doing(f"ONNX Runtime ({provider}) loaded the {name} model at {level}"):
                    runner = providers.create_runner(path, provider, level, threads, feeds)
            except Exception as error:  # ORT's own exception types
                why = _first_line(error)
                if name not in options.compare:
                    raise ModelLoadError(
                        f"{path}: ONNX Runtime ({provider}) cannot load the {name} model ({why})"
                    ) from error
                setup.unloadable[name] = why[:200]
                loaded = [v for v in loaded if v.name != name]
                continue
            stop = threading.Timer(
                options.run_timeout, lambda r=runner: setattr(r.run_options, "terminate", True)
            )
            stop.daemon = True
            stop.start()
            ran = f"ONNX Runtime ({provider}) ran the {name} model at {level} on inputs"
            try:
                with doing(f"{ran} {describe_feeds(feeds)} (--inputs FILE.npz gives others)"):
                    first, outputs = _timed_first_run(runner.outputs)
            except Exception as error:  # ORT's own exception types
                if runner.run_options.terminate:
                    raise ModelLoadError(
                        f"{path}: one run of the {name} model took over --run-timeout "
                        f"({options.run_timeout:g} s) on ONNX Runtime ({provider})"
                    ) from error
                failure = OriginalFailsOnInputs if name == "original" else ModelLoadError
                raise failure(
                    f"{path}: the {name} model fails on ONNX Runtime ({provider}) with the "
                    f"generated inputs ({_first_line(error)}); pass --inputs FILE.npz"
                ) from error
            finally:
                stop.cancel()
            loaded.append(
                _Loaded(
                    name,
                    provider,
                    level,
                    runner.create_seconds,
                    first,
                    runner.run,
                    outputs,
                    mem,
                    path,
                )
            )
    if torch_model is not None:
        from onnxopt.bench import torch_side

        device = "cuda" if provider == "cuda" else "cpu"
        if device == "cuda" and not torch_side.import_torch().cuda.is_available():
            return loaded
        for compiled in (False, True) if options.torch_compile else (False,):
            mem = None
            if options.memory and not compiled and device == "cpu" and options.torch is not None:
                progress(f"{provider}: memory of torch-eager in a child process")
                job = {
                    "kind": "torch",
                    "torch": options.torch,
                    "threads": threads,
                    "input_names": list(input_names),
                }
                mem = memory.measure(job, feeds)
            progress(f"{provider}: preparing torch-{'compile' if compiled else 'eager'}")
            torch_runner = torch_side.create_runner(
                torch_model, feeds, input_names, compiled=compiled, threads=threads, device=device
            )
            first, outputs = _timed_first_run(torch_runner.outputs)
            loaded.append(
                _Loaded(
                    torch_runner.name,
                    provider,
                    None,
                    torch_runner.create_seconds,
                    first,
                    torch_runner.run,
                    outputs,
                    mem,
                )
            )
    return loaded


def _reload(runs: list[Callable[[], object]], variants: Sequence[_Loaded], setup: _Setup) -> None:
    """Replace every ORT variant's session with a new one, releasing the old one first."""
    for index, variant in enumerate(variants):
        if variant.model_path is None or variant.ort_level is None:
            continue  # PyTorch modules keep their weights where they are
        runs[index] = variant.run = _released
        runner = providers.create_runner(
            variant.model_path, variant.provider, variant.ort_level, setup.threads, setup.feeds
        )
        runs[index] = variant.run = runner.run


def _released() -> None:
    raise AssertionError("a released session was run")


def _pairs(variants: Sequence[_Loaded]) -> list[tuple[int, int]]:
    """(baseline, candidate) index pairs: optimized vs original at its level; PyTorch vs the first original."""
    originals = {v.ort_level: i for i, v in enumerate(variants) if v.name == "original"}
    first_original = next(iter(originals.values()))
    pairs = []
    for i, variant in enumerate(variants):
        if variant.name == "original":
            continue
        pairs.append((originals.get(variant.ort_level, first_original), i))
    return pairs


def _run_group(provider: str, setup: _Setup) -> GroupResult:
    reason = providers.provider_unavailable(provider)
    if reason is not None:
        return GroupResult(provider, reason)
    options, progress, output_names = setup.options, setup.progress, setup.output_names
    variants = _load_group(provider, setup)
    runs = [v.run for v in variants]
    pairs = _pairs(variants)
    progress(f"{provider}: warming up")
    timing.warm_up(runs, count=options.warmup_runs, seconds=min(5.0, options.budget_seconds * 0.1))
    progress(
        f"{provider}: timing {len(runs)} variants interleaved (budget {options.budget_seconds:g} s)"
    )
    result = timing.interleave(
        runs,
        pairs,
        budget_seconds=options.budget_seconds,
        min_rounds=options.min_rounds,
        max_rounds=options.max_rounds,
        ci_target=options.ci_target,
        confidence=options.confidence,
        timer=timing.CLOCKS[options.clock],
        seed=options.seed,
        reload=lambda runs: _reload(runs, variants, setup),
        sessions=options.sessions,
    )
    baseline_of = {candidate: baseline for baseline, candidate in pairs}
    reference_index = next(
        (i for i, v in enumerate(variants) if v.name == "original" and v.ort_level == "disable"),
        next(i for i, v in enumerate(variants) if v.name == "original"),
    )
    reference = variants[reference_index]
    eager = next((v for v in variants if v.name == "torch-eager"), None)
    results = []
    for i, variant in enumerate(variants):
        samples = result.samples[i]
        speedup = None
        baseline_label = None
        if i in baseline_of:
            base = variants[baseline_of[i]]
            speedup = paired_speedup(
                result.samples[baseline_of[i]], samples, options.confidence, result.blocks
            )
            baseline_label = f"original ({base.ort_level})"
        ref_label = f"original ({reference.ort_level}, {provider})"
        vs_original = (
            None
            if i == reference_index
            else _agreement(ref_label, reference.outputs, variant.outputs, output_names)
        )
        vs_eager = None
        if eager is not None and variant is not eager:
            vs_eager = _agreement("torch-eager", eager.outputs, variant.outputs, output_names)
        results.append(
            VariantResult(
                name=variant.name,
                provider=provider,
                ort_level=variant.ort_level,
                create_seconds=variant.create_seconds,
                first_run_seconds=variant.first_run_seconds,
                latency=LatencyStats.of(samples),
                speedup=speedup,
                speedup_baseline=baseline_label,
                memory=variant.memory,
                vs_original=vs_original,
                vs_eager=vs_eager,
                samples=samples,
            )
        )
    return GroupResult(
        provider, None, result.rounds, result.seconds, result.stop_reason, tuple(results)
    )


def _environment(threads: int, clock: str) -> dict[str, str]:
    import onnxruntime as ort

    from onnxopt import __version__

    env = {
        "onnxopt": __version__,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "intra_op_threads": str(threads),
        "clock": clock,
        "thread_spinning": "off",
    }
    try:
        import psutil

        env["cpus"] = f"{psutil.cpu_count(logical=False)} physical, {psutil.cpu_count()} logical"
    except ImportError:  # pragma: no cover - psutil is a dependency of the bench
        pass
    return env


def run_bench(
    model_path: str | Path, options: BenchOptions, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Benchmark ``model_path`` against its optimized form (and PyTorch); nothing is written but temp files."""
    from onnxopt import api

    say = progress or (lambda _message: None)
    path = Path(model_path)
    unknown = [p for p in options.providers if p not in providers.PROVIDERS]
    if unknown:
        raise UsageError(
            f"--provider {','.join(unknown)}: choose from {', '.join(providers.PROVIDERS)}"
        )
    bad_levels = [lvl for lvl in options.ort_levels if lvl not in providers.ORT_LEVELS]
    if bad_levels or not options.ort_levels:
        raise UsageError(
            f"--ort-level {','.join(bad_levels)}: choose from {', '.join(providers.ORT_LEVELS)}"
        )
    if options.clock not in timing.CLOCKS:
        raise UsageError(f"--clock {options.clock}: choose from {', '.join(timing.CLOCKS)}")
    if options.inputs is not None and (options.sweeps or options.shapes):
        raise UsageError(
            "--inputs fixes the input shapes; it cannot be combined with --shape or --sweep"
        )
    threads = _threads(options.threads)
    notes: list[str] = []

    say("loading")
    source = io.load_model(path)
    specs = input_specs(source.model)
    drawing = unseeded_draws(source.model)
    if drawing:
        notes.append(
            f"the model draws random numbers ({describe(drawing)}): every file was timed with "
            "each random op given the same seed in all of them (from its name), so the "
            "variants draw the same numbers run by run and their outputs compare; the files "
            "themselves are unchanged"
            + (
                "; PyTorch draws its own numbers, so the vs-eager column compares other draws"
                if options.torch is not None
                else ""
            )
        )
    nodes_before = ModelSummary.of(source.model).nodes
    output_names = [str(v.name) for v in source.model.graph.outputs]
    input_names = [s.name for s in specs]
    with temp_folder("onnxopt-bench-") as tmp:
        if options.optimized is not None:
            candidate = io.load_model(options.optimized)
            info = OptimizedInfo(
                str(options.optimized), nodes_before, ModelSummary.of(candidate.model).nodes, None
            )
            optimized_path = str(options.optimized)
            optimized_model = candidate.model
        else:
            say(f"optimizing (-O{options.level})")
            # Timed on CUDA too: written for it (no form CUDA lacks, ort_versions.py).
            result = api.optimize(
                source.model,
                level=options.level,
                input_shapes=options.shapes,
                check=False,
                ort_providers="cpu,cuda" if "cuda" in options.providers else None,
            )
            info = OptimizedInfo(
                f"onnxopt -O{options.level} (in memory)",
                result.report.before.nodes,
                result.report.after.nodes,
                result.report.optimize_seconds,
            )
            optimized_path = str(io.save_model(result.model, Path(tmp) / "optimized.onnx"))
            del result  # its weights are arrays in memory; the file read back maps them
            optimized_model = io.load_model(optimized_path).model
        original_path = str(path)
        if not source.runs_as_is:
            # ORT refuses the file itself (repeated node names, empty trailing outputs it may
            # crash on): time it as onnxopt loads it.
            original_path = str(io.save_model(source.model, Path(tmp) / "original.onnx"))
        if source.renamed_nodes:
            notes.append(
                f"original: {source.renamed_nodes} repeated node names made unique "
                "(ONNX Runtime refuses them) and timed so"
            )
        if source.trimmed_nodes:
            notes.append(
                f"original: empty trailing outputs of {source.trimmed_nodes} nodes dropped "
                "(ONNX Runtime can crash on them) and timed so"
            )
        # sized before each input size is timed (api.optimize left source.model untouched)
        sized = {"original": source.model, "optimized": optimized_model}
        fitted: set[tuple[tuple[str, tuple[int, ...]], ...]] = set()

        def refuse_beyond_memory(shapes: Mapping[str, tuple[int, ...]]) -> None:
            key = tuple(sorted(shapes.items()))  # the first sizes are checked before relations too
            if key not in fitted:
                _refuse_beyond_memory(sized, len(options.ort_levels), shapes)
                fitted.add(key)

        del source
        models = {"original": original_path, "optimized": optimized_path}
        for label, other in options.compare.items():
            io.load_model(other)  # refuses a bad file with its own clear error, before any timing
            models[label] = str(other)
        if drawing:
            # Unseeded, each session draws its own numbers: a text-to-speech model's output
            # length is drawn, so its run time and outputs would differ between variants.
            for label, file in models.items():
                models[label] = _seeded_copy(file, Path(tmp) / f"{label}.seeded.onnx")

        torch_model = None
        if options.torch is not None:
            from onnxopt.bench import torch_side

            say(f"building PyTorch module {options.torch}")
            torch_model = torch_side.build(options.torch)
        examples = torch_model.example_shapes(input_names) if torch_model is not None else {}

        points = []
        unloadable: dict[str, str] = {}
        sweeps = _sweep_points(options.sweeps)
        relation = None
        if options.inputs is None and len(DimSymbols.of(specs).atoms) >= 3:
            # A KV-cache decoder (batch, seq, past, total) runs only when total = past + seq.
            first = resolve_shapes(specs, options.shapes, sweeps[0], examples)
            sizes = {
                d: n
                for spec in specs
                for d, n in zip(spec.dims, first[spec.name], strict=True)
                if isinstance(d, str)
            }
            say("checking the input sizes")
            # before the original is run to find them: not at sizes the timing cannot fit
            refuse_beyond_memory(first)
            with shared_sessions():
                relation = find_relation(path, specs, SizePlan(sizes, 1), seed=options.seed)
            if relation is not None:
                notes.append(
                    f"input sizes chosen with {relation} (the model did not run otherwise)"
                )
        # Sizes bench chose itself (no --inputs, --shape, --sweep or example inputs) may be ones
        # the model cannot run at: batch 1 and 128 are guesses, and unnamed dims are sized apart.
        own_sizes = (
            options.inputs is None and not options.shapes and not options.sweeps and not examples
        )
        # A spectral front end needs a frame of signal, and ONNX Runtime 1.32 can die (SIGFPE) on
        # a shorter one: its signal is timed at a second of 16 kHz audio instead of 128 samples.
        spectral = spectral_signal(optimized_model, specs) if own_sizes else []
        spectral_shapes = None
        if spectral:
            symbols = DimSymbols.of(specs)
            plan = symbols.signal_plans(spectral)[-1]
            listed = symbols.shapes(specs, plan)
            if listed is not None:
                spectral_shapes = {spec.name: s for spec, s in zip(specs, listed, strict=True)}
                notes.append(
                    f"timed with {', '.join(spectral)} = {plan.sizes[spectral[0]]}: the model "
                    "computes a spectrum of that signal (choose sizes with --shape or --sweep)"
                )

        def timed(feeds: Mapping[str, Any]) -> list[GroupResult]:
            setup = _Setup(
                models,
                options,
                threads,
                feeds,
                torch_model,
                input_names,
                output_names,
                say,
                unloadable,
            )
            return [_run_group(provider, setup) for provider in options.providers]

        for sweep in sweeps:
            if options.inputs is not None:
                feeds = {k: np.asarray(v) for k, v in options.inputs.items()}
                shapes = {k: tuple(v.shape) for k, v in feeds.items()}
            elif spectral_shapes is not None:
                shapes = spectral_shapes
            else:
                shapes = resolve_shapes(specs, options.shapes, sweep, examples, relation)
            refuse_beyond_memory(shapes)
            if options.inputs is None:
                feeds = _feeds(specs, shapes, options.seed)
            try:
                groups = timed(feeds)
            except OriginalFailsOnInputs as failure:
                if not own_sizes or relation is not None:
                    raise
                say("the original does not run at the default sizes: looking for sizes it runs at")
                with shared_sessions():
                    found = sizes_that_run(path, specs, seed=options.seed, spectral=spectral)
                if found is None:
                    raise failure from None
                shapes = found
                refuse_beyond_memory(shapes)
                chosen = ", ".join(
                    f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in shapes.items()
                )
                notes.append(
                    f"timed at {chosen}: the original model does not run at bench's default sizes "
                    "(batch 1, other dynamic dims 128, unnamed dims each apart); choose sizes "
                    "with --shape or --sweep"
                )
                groups = timed(_feeds(specs, shapes, options.seed))
            points.append(PointResult(shapes, tuple(groups)))
    for name, why in unloadable.items():
        notes.append(f"{name} was not timed: ONNX Runtime cannot load it ({why})")
    if options.memory:
        notes.append(
            "RSS load / peak: host memory growth of each variant in a fresh process (load; peak over load and "
            "3 runs); ORT arena statistics are not exposed by its Python API, device memory is not measured"
        )
    if options.clock == "cpu":
        notes.append(
            "steady-state figures are process CPU time per run (--clock cpu), not wall-clock latency; "
            "create and first-run times are wall clock"
        )
    if options.torch_compile:
        notes.append("torch-compile's first run includes compilation; its memory is not measured")
    return BenchReport(
        model=str(path),
        optimized=info,
        torch=options.torch,
        threads=threads,
        environment=_environment(threads, options.clock),
        points=tuple(points),
        notes=tuple(notes),
    )
