"""Numerical validation: run original and optimized on ONNX Runtime (its optimizations OFF) and compare.

Inputs are seeded random tensors that respect what the model expects: integer inputs that index an
embedding (a Gather's indices, possibly through Cast/Reshape/Unsqueeze/Expand) stay below the table's
size, and those one-hot encoded (OneHot, or Equal against the constants 0..n-1) below the depth;
other integers are small and non-negative, and every dynamic dimension is tried at two or more sizes
(1 and larger odd values, distinct per symbolic dim so that mixed-up dims are caught). Dims written
as expressions (``past + seq``) are computed from the others, and when no generated size runs, the
sizes are searched for a relation between dims (a KV-cache decoder's total = past + seq).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxopt import input_sizes, io
from onnxopt.errors import OnnxoptError, UsageError
from onnxopt.guard import doing
from onnxopt.input_sizes import FALLBACK_SIZES, SIGNAL_SIZES, DimSymbols, Relation, SizePlan
from onnxopt.kv_cache_inputs import KVCacheFacts, kv_cache_facts
from onnxopt.ops import (
    MS_DOMAIN,
    all_graphs,
    const_array,
    is_onnx_domain,
    is_op,
)
from onnxopt.random_draws import CannotPin, PinnedDraws, describe, pin_draws, unseeded_draws

logger = logging.getLogger(__name__)

# |a - b| <= atol + rtol * |b| per element, by the precision an output is computed in: chosen from
# the rounding of reassociated fp sums. float16 (eps 2**-10 ~ 1e-3) gets about ten of its ulps:
# ORT CPU runs float16 ops that lack a float16 kernel in float32 behind inserted Casts, merging
# neighbouring islands, so a fused or refolded graph rounds at other places than the original.
# bfloat16 (eps 2**-7 ~ 8e-3) gets about six.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-3),
    "float64": (1e-7, 1e-6),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
DEFAULT_TOLERANCE = (1e-4, 1e-3)
MAX_TRIAL_ELEMENTS = 64 * 1024 * 1024
_PASSTHROUGH = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand")
_MAX_ONE_HOT_DEPTH = 1 << 20


class CannotValidate(OnnxoptError):
    """Validation could not run (the original fails on ORT, an input has no shape, ...)."""


@dataclass(frozen=True)
class OutputComparison:
    name: str
    dtype: str
    elements: int
    max_abs: float
    max_rel: float
    mismatches: int
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return self.mismatches == 0


@dataclass(frozen=True)
class ValidationReport:
    trials: tuple[dict[str, tuple[int, ...]], ...]
    outputs: tuple[OutputComparison, ...]
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # how the input sizes were chosen, when that needed a search
    # Outputs the original gave as NaN at every element on every trial: equal NaN to NaN, they
    # pass whatever the optimized model computes, so their comparison proves nothing.
    all_nan: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.errors and all(o.passed for o in self.outputs)

    def failing_outputs(self) -> list[str]:
        return [o.name for o in self.outputs if not o.passed]


@dataclass(frozen=True)
class InputSpec:
    """One graph input to generate: ``dims`` are its tensor's (a sequence's or optional's element)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]
    int_high: int | None = None
    kind: str = "tensor"  # "tensor", "optional" (of a tensor) or "sequence" (of tensors)
    # "past": a GroupQueryAttention's past key or value, [batch, kv heads, past, head size];
    # "mask": its attention mask, [batch, past + new]. Validation runs such a model at a decode
    # step and a prompt, the mask all ones (see kv_cache_inputs).
    kv_role: str | None = None


# A generated input: a tensor, or a sequence input's tensors.
Feed = np.ndarray | list[np.ndarray]
SEQUENCE_LENGTH = 2  # tensors in a generated sequence input


@dataclass
class _Worst:
    comparisons: dict[str, OutputComparison] = field(default_factory=dict)

    def add(self, comparison: OutputComparison) -> None:
        old = self.comparisons.get(comparison.name)
        if old is None:
            self.comparisons[comparison.name] = comparison
            return
        self.comparisons[comparison.name] = OutputComparison(
            comparison.name,
            comparison.dtype,
            old.elements + comparison.elements,
            max(old.max_abs, comparison.max_abs),
            max(old.max_rel, comparison.max_rel),
            old.mismatches + comparison.mismatches,
            comparison.atol,
            comparison.rtol,
        )


def _one_hot_depth(node: ir.Node, index: int) -> int | None:
    """n when ``node`` one-hot encodes its input ``index`` over n classes: ONNX OneHot with a
    constant depth, or Equal against a constant holding exactly 0..n-1 (jax's and TF's
    ``one_hot`` through tf2onnx: ``Equal(Expand(ids), arange(n))``)."""
    if is_op(node, "OneHot") and index == 0 and len(node.inputs) > 1:
        depth = const_array(node.inputs[1])
        if (
            depth is not None
            and depth.size == 1
            and 0 < float(depth.reshape(())) <= _MAX_ONE_HOT_DEPTH
        ):
            return int(depth.reshape(()))
        return None
    if not is_op(node, "Equal") or len(node.inputs) != 2:
        return None
    other = node.inputs[1 - index] if index in (0, 1) else None
    stored = None if other is None else other.const_value  # an initializer: size before loading
    if other is None or (stored is not None and stored.size > _MAX_ONE_HOT_DEPTH):
        return None
    classes = const_array(other)
    if classes is None or not np.issubdtype(classes.dtype, np.integer):
        return None
    present = np.unique(classes)
    return (
        len(present)
        if len(present) > 1 and np.array_equal(present, np.arange(len(present)))
        else None
    )


def _embedding_bound(value: ir.Value, depth: int = 0) -> int | None:
    """Smallest table size among Gathers that use ``value`` (through shape-only ops) as indices,
    among one-hot encodings of it, and among ORT RotaryEmbeddings that read their cos/sin cache
    rows at it (position ids)."""
    bounds: list[int] = []
    for use in value.uses():
        node = use.node
        classes = _one_hot_depth(node, use.idx)
        if classes is not None:
            bounds.append(classes)
        elif is_op(node, "Gather") and use.idx == 1:
            data = node.inputs[0]
            axis = node.attributes.get_int("axis", 0)
            if data is not None and data.shape is not None and len(data.shape) > 0:
                dim = data.shape[axis if axis >= 0 else axis + len(data.shape)]
                if isinstance(dim, int) and dim > 0:
                    bounds.append(dim)
        elif (
            is_op(node, "RotaryEmbedding", MS_DOMAIN)
            and use.idx == 1
            and len(node.inputs) > 2
            and value.shape is not None
            and len(value.shape) == 2  # [B, S] ids (a one-element offset reads rows past it)
        ):
            cache = node.inputs[2]  # position ids index the cos cache's rows
            if cache is not None and cache.shape is not None and len(cache.shape) == 2:
                rows = cache.shape[0]
                if isinstance(rows, int) and rows > 0:
                    bounds.append(rows)
        elif depth < 4 and any(is_op(node, op) for op in _PASSTHROUGH) and use.idx == 0:
            inner = _embedding_bound(node.outputs[0], depth + 1)
            if inner is not None:
                bounds.append(inner)
    return min(bounds) if bounds else None


def input_specs(model: ir.Model) -> list[InputSpec]:
    specs = []
    for value in model.graph.inputs:
        if value.is_initializer():
            continue  # an overridable initializer: its stored value is the realistic input
        kind = _input_kind(value.type)
        if kind is None or value.dtype is None:
            raise CannotValidate(
                f"input '{value.name}' is of type {value.type}, which validation cannot generate "
                "(a tensor, an optional tensor or a sequence of tensors); pass --inputs or "
                "--no-validate"
            )
        if value.shape is None:
            raise CannotValidate(
                f"input '{value.name}' has no shape; pass --input-shape, --inputs or --no-validate"
            )
        dims: list[int | str | None] = []
        for dim in value.shape:
            if isinstance(dim, int):
                dims.append(dim)
            else:
                dims.append(dim.value if isinstance(dim, ir.SymbolicDim) else None)
        np_dtype = value.dtype.numpy()
        high = _embedding_bound(value) if np.issubdtype(np_dtype, np.integer) else None
        specs.append(InputSpec(str(value.name), np_dtype, tuple(dims), high, kind))
    facts = kv_cache_facts(model)
    return _with_kv_cache(specs, facts) if facts is not None else specs


def _with_kv_cache(specs: list[InputSpec], facts: KVCacheFacts) -> list[InputSpec]:
    """``specs`` with the dims GroupQueryAttention fixes set (a past's head count and head size,
    by name wherever the name appears), and, when one other non-batch name can be the new
    tokens' length, the mask's length written as past + that length and the roles marked."""
    named: dict[str, set[int]] = {}
    for spec in specs:
        for axis, dim in enumerate(spec.dims):
            size = facts.fixed.get((spec.name, axis))
            if size is not None and isinstance(dim, str):
                named.setdefault(dim, set()).add(size)
    by_name = {name: sizes.pop() for name, sizes in named.items() if len(sizes) == 1}
    total = None
    if facts.past is not None and facts.total is not None:
        symbols = DimSymbols.of(specs)
        new = [
            a
            for a in symbols.atoms
            if a not in (facts.past, facts.total, *by_name) and a not in symbols.leading
        ]
        if len(new) == 1 and facts.total in symbols.atoms and facts.past in symbols.atoms:
            total = f"{facts.past} + {new[0]}"
    caches = {name for name, _ in facts.fixed}
    out = []
    for spec in specs:
        dims: list[int | str | None] = []
        for axis, dim in enumerate(spec.dims):
            fixed = facts.fixed.get((spec.name, axis))
            if isinstance(dim, str) and dim in by_name:
                dims.append(by_name[dim])
            elif dim is None and fixed is not None:
                dims.append(fixed)
            elif dim == facts.total and total is not None:
                dims.append(total)
            else:
                dims.append(dim)
        role = None
        if total is not None and spec.name in caches:
            role = "past"
        elif total is not None and total in dims and np.issubdtype(spec.dtype, np.integer):
            role = "mask"
        out.append(dataclasses.replace(spec, dims=tuple(dims), kv_role=role))
    return out


def kv_cache_steps(
    specs: Sequence[InputSpec], symbols: DimSymbols, given: Mapping[str, int] | None = None
) -> list[tuple[str, SizePlan]]:
    """A decode step (past 7, 1 new token) and a prompt (no past, 5 tokens), 2 sequences each,
    described, for a model whose GroupQueryAttention reads a past from its inputs (roles set by
    :func:`_with_kv_cache`); [] otherwise. With a sliding-window ring buffer of w rows the total
    is w or more in both (rows past the tokens written are left unset by ORT: not comparable)."""
    pasts = {s.dims[2] for s in specs if s.kv_role == "past" and isinstance(s.dims[2], str)}
    past = pasts.pop() if len(pasts) == 1 else None
    if not isinstance(past, str) or past not in symbols.atoms:
        return []
    new = {
        name
        for tree in symbols.expressions.values()
        if past in input_sizes.names_in(tree)
        for name in input_sizes.names_in(tree)
        if name != past
    }
    if not new:
        return []
    ring = max(
        (s.dims[2] for s in specs if s.kv_role == "past" and isinstance(s.dims[2], int)),
        default=0,
    )
    base = symbols.distinct(given)
    batch = dict.fromkeys((a for a in symbols.atoms if a in symbols.leading), 2)
    decode_past, prompt_tokens = max(7, ring), max(5, ring)
    steps = (
        (
            f"a decode step: past {decode_past}, 1 new token",
            {past: decode_past, **dict.fromkeys(new, 1)},
        ),
        (
            f"a prompt: no past, {prompt_tokens} tokens",
            {past: 0, **dict.fromkeys(new, prompt_tokens)},
        ),
    )
    return [(what, SizePlan({**base.sizes, **batch, **step}, base.unnamed)) for what, step in steps]


def _input_kind(type_: ir.TypeProtocol | None) -> str | None:
    if isinstance(type_, ir.TensorType):
        return "tensor"
    if isinstance(type_, ir.OptionalType) and isinstance(type_.elem_type, ir.TensorType):
        return "optional"
    if isinstance(type_, ir.SequenceType) and isinstance(type_.elem_type, ir.TensorType):
        return "sequence"
    return None


def make_inputs(
    specs: Sequence[InputSpec], size_of: Callable[[int | str | None], int], rng: np.random.Generator
) -> dict[str, Feed] | None:
    """Random inputs with each dim sized by ``size_of``; None if they are too large to generate."""
    return inputs_of_shapes(specs, [tuple(size_of(d) for d in s.dims) for s in specs], rng)


def inputs_of_shapes(
    specs: Sequence[InputSpec],
    shapes: Sequence[tuple[int, ...]],
    rng: np.random.Generator,
) -> dict[str, Feed] | None:
    """Random inputs of these shapes (in ``specs``' order); None if they are too large to generate.

    An optional input is given; a sequence input gets :data:`SEQUENCE_LENGTH` tensors of its shape.
    """
    feeds: dict[str, Feed] = {}
    total = 0
    for spec, shape in zip(specs, shapes, strict=True):
        count = SEQUENCE_LENGTH if spec.kind == "sequence" else 1
        total += count * int(np.prod(shape, dtype=np.int64))
        if total > MAX_TRIAL_ELEMENTS:
            return None
        arrays = [_random_array(spec, shape, rng) for _ in range(count)]
        feeds[spec.name] = arrays if spec.kind == "sequence" else arrays[0]
    return feeds


def _keeps_a_token(spec: InputSpec, array: np.ndarray) -> np.ndarray:
    """A 0/1 input named as a mask (``attention_mask``, TF1 BERT's ``input_mask``...) with a real
    token in every row, as a tokenizer writes it: a row of padding alone is an empty sequence.
    Its attention is ill-conditioned where the model masks with a finite constant (TensorFlow's
    and older transformers' -10000): every score is s - 10000, rounded to 1/1024, so one
    rounding difference upstream (a fused LayerNorm) moves that row's outputs by ~2e-4, beyond
    float32's tolerance, though the export's own row is no closer to the exact result. Such a row
    gets its last token kept. Fully padded rows are checked with given inputs (tests,
    benchmarks/padded_masks.py)."""
    if "mask" not in spec.name.lower() or array.ndim < 2 or array.shape[-1] == 0:
        return array
    empty = ~array.astype(np.bool_).any(axis=-1)
    array[empty, -1] = 1
    return array


def _random_array(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = spec.dtype
    if spec.kv_role == "mask":
        # GroupQueryAttention reads each row's sum as its length (padding after the tokens):
        # holes would be neither padding nor realistic, and unwritten cache rows are unset.
        return np.ones(shape, dtype=dtype)
    if dtype == np.bool_:
        return _keeps_a_token(spec, rng.integers(0, 2, size=shape).astype(np.bool_))
    if np.issubdtype(dtype, np.integer):
        high = spec.int_high if spec.int_high is not None else 2
        array = rng.integers(0, max(high, 1), size=shape).astype(dtype)
        return _keeps_a_token(spec, array) if high == 2 else array
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V":
        array = rng.standard_normal(size=shape).astype(np.float32)
        return array.astype(dtype) if dtype.kind != "V" else array
    if dtype == np.object_:  # ONNX strings
        letters = np.array(list("abcdefgh"), dtype=object)
        return np.array(
            ["".join(rng.choice(letters, size=3)) for _ in range(int(np.prod(shape)))],
            dtype=object,
        ).reshape(shape)
    raise CannotValidate(f"input '{spec.name}' has dtype {dtype}, which validation cannot generate")


_SESSIONS: contextvars.ContextVar[dict[tuple[object, int], Any] | None] = contextvars.ContextVar(
    "onnxopt_validation_sessions", default=None
)


@contextlib.contextmanager
def shared_sessions() -> Iterator[None]:
    """Within this block, ``validate`` and ``compare_to_eager`` share one ORT session per model.

    ``optimize`` validates and then compares with eager PyTorch: without this each model (hundreds
    of MB of weights) would be loaded into ORT twice. The models must not change inside the block.
    """
    token = _SESSIONS.set({})
    try:
        yield
    finally:
        _SESSIONS.reset(token)


def _session(model: ir.Model | Path, threads: int = 2, role: str = "the model") -> Any:
    """An ORT session of ``model``; ``role`` ("the original model") names it in crash reports."""
    cache = _SESSIONS.get()
    key = (model if isinstance(model, Path) else id(model), threads)
    if cache is not None and key in cache:
        return cache[key]
    with doing(f"ONNX Runtime loaded {role}"):
        session = _new_session(model, threads)
    session.onnxopt_role = role
    if cache is not None:
        cache[key] = session
    return session


def release_session(model: ir.Model | Path) -> None:
    """Drop ``model``'s shared sessions, so that the weights they hold can be freed."""
    cache = _SESSIONS.get()
    if cache is not None:
        key = model if isinstance(model, Path) else id(model)
        for cached in [k for k in cache if k[0] == key]:
            del cache[cached]
    _return_freed_memory()


def _return_freed_memory() -> None:
    """Hand the heap a released session freed back to the OS (glibc keeps it otherwise), so that
    the next session's weights do not add to the process's peak. The session is freed by its
    reference count; a full ``gc.collect()`` here made thousands of small validations crawl."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _new_session(model: ir.Model | Path, threads: int, ort_optimized: bool = False) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if ort_optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = threads
    options.log_severity_level = 4  # fatal only: run errors come back as exceptions, in one line
    options.add_session_config_entry("session.disable_prepacking", "1")
    # ORT's memory-pattern planner lays the weights out in one block, placing each with a scan
    # over those placed: quadratic in their count (a chain of 50k Adds, each with its own
    # one-element constant: 67 s to make the session, 13 s without). A validation session runs a
    # few times; the pattern's faster reruns buy nothing here.
    options.enable_mem_pattern = False
    if isinstance(model, Path):
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    # Weights mapped from the source file are handed to ORT as buffers (no copy, no temp file);
    # the model bytes then carry only the graph.
    mapped = io.mapped_arrays(model)
    buffers = [ort.OrtValue.ortvalue_from_numpy(array) for array in mapped.values()]
    if buffers:
        options.add_external_initializers(list(mapped), buffers)
    with io.ort_model_source(model, mapped_in_memory=bool(buffers)) as source:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    session.onnxopt_buffers = buffers  # ORT reads the weights from these: keep them alive
    return session


def _looser(a: str | None, b: str | None) -> str | None:
    """Of two float type names, the one with the wider tolerance (None: neither is a float type)."""
    known = [t for t in (a, b) if t in TOLERANCES]
    return max(known, key=lambda t: sum(TOLERANCES[t])) if known else None


def output_precisions(model: ir.Model) -> dict[str, str]:
    """Per graph output, the least precise float type it is computed through (its own included).

    A model converted to float16 with float32 inputs and outputs (``keep_io_types``) computes its
    outputs in float16: they are compared with float16's tolerance, not float32's. Outputs of a
    model with no float type narrower than their own keep their own (nothing is loosened).

    Only computed values count: weights stored as float16 and cast up to float32 (or float16
    inputs cast up) are exact in float32 and do not loosen a float32 computation. A Cast counts
    its target type only when it rounds a computed value.
    """
    computed: dict[int, str | None] = {}  # per value: the loosest float type in its history

    def own(value: ir.Value) -> str | None:
        if value.dtype is None or not value.dtype.is_floating_point():
            return None
        with contextlib.suppress(TypeError, ValueError):
            return np.dtype(value.dtype.numpy()).name  # "float16", as TOLERANCES names it
        return None

    def through_subgraphs(node: ir.Node) -> str | None:  # If/Loop/Scan bodies, by their types
        found = None
        for attribute in node.attributes.values():
            if attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                graphs = attribute.value if isinstance(attribute.value, list) else [attribute.value]
                for graph in graphs:
                    for inner in ir.traversal.RecursiveGraphIterator(graph):
                        for out in inner.outputs:
                            found = _looser(found, own(out))
        return found

    # Depth-first from each output (the node list need not be sorted: converters append Casts).
    for output in model.graph.outputs:
        stack: list[tuple[ir.Value, bool]] = [(output, False)]
        while stack:
            value, inputs_done = stack.pop()
            if id(value) in computed:
                continue
            node = value.producer()
            if node is None or node.graph is not model.graph:
                # graph inputs and initializers are data, not computed (subgraph captures: own type)
                data = node is None and (value.is_graph_input() or value.is_initializer())
                computed[id(value)] = None if data else own(value)
                continue
            if not inputs_done:
                stack.append((value, True))
                stack.extend((v, False) for v in node.inputs if v is not None)
                continue
            found = through_subgraphs(node)
            for v in node.inputs:
                if v is not None:
                    found = _looser(found, computed.get(id(v)))
            data_only = found is None and (is_op(node, "Constant") or is_op(node, "Cast"))
            for out in node.outputs:
                computed[id(out)] = None if data_only else _looser(found, own(out))
    result = {}
    for value in model.graph.outputs:
        found = computed.get(id(value))
        if found is not None:
            result[str(value.name)] = found
    return result


def compare_arrays(
    name: str, expected: np.ndarray, actual: np.ndarray, precision: str | None = None
) -> OutputComparison:
    """Compare one output; the tolerance is that of its dtype or of ``precision`` (the float type
    it was computed in, see :func:`output_precisions`), whichever is wider."""
    dtype = str(expected.dtype)
    atol, rtol = TOLERANCES.get(_looser(dtype, precision) or dtype, DEFAULT_TOLERANCE)
    if expected.shape != actual.shape:
        return OutputComparison(
            name,
            dtype,
            expected.size,
            float("inf"),
            float("inf"),
            max(expected.size, 1),
            atol,
            rtol,
        )
    if expected.size == 0:
        return OutputComparison(name, dtype, 0, 0.0, 0.0, 0, atol, rtol)
    if expected.dtype.kind == "V" and actual.dtype == expected.dtype:
        # ml_dtypes (bfloat16, float8, int4) are no numpy numbers: compare them widened, with the
        # tolerances of their own dtype (NaN == NaN, as for the native float types).
        wide = np.float32 if "float" in expected.dtype.name else np.int64
        expected, actual = expected.astype(wide), actual.astype(wide)
    if not (np.issubdtype(expected.dtype, np.number) or expected.dtype == np.bool_):
        bad = int(np.sum(expected != actual))
        return OutputComparison(
            name, dtype, expected.size, float(bad > 0), float(bad > 0), bad, 0.0, 0.0
        )
    if np.issubdtype(expected.dtype, np.floating):
        e = expected.astype(np.float64)
        a = actual.astype(np.float64)
        same_nan = np.isnan(e) == np.isnan(a)
        same_inf = (np.isinf(e) == np.isinf(a)) & ((e == a) | ~np.isinf(e))
        finite = np.isfinite(e) & np.isfinite(a)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is masked out below
            diff = np.where(finite, np.abs(e - a), 0.0)
        rel = np.where(finite, diff / np.maximum(np.abs(e), 1e-12), 0.0)
        bad = (~same_nan) | (~same_inf) | (diff > atol + rtol * np.abs(np.where(finite, e, 0.0)))
        return OutputComparison(
            name,
            dtype,
            expected.size,
            float(diff.max()),
            float(rel.max()),
            int(bad.sum()),
            atol,
            rtol,
        )
    e = expected.astype(np.int64) if expected.dtype != np.uint64 else expected
    a = actual.astype(np.int64) if actual.dtype != np.uint64 else actual
    diff_i = np.abs(e.astype(np.float64) - a.astype(np.float64))
    return OutputComparison(
        name,
        dtype,
        expected.size,
        float(diff_i.max()),
        float(diff_i.max()),
        int((diff_i > 0).sum()),
        0.0,
        0.0,
    )


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes and values, NaN equal to NaN where the dtype has NaN."""
    numeric = a.dtype.kind in "fc" and b.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=numeric))


def _flatten_output(
    name: str, expected: object, actual: object
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Pairs of arrays to compare: a sequence output ``s`` becomes ``s[0]``, ``s[1]``, ...

    A length or presence mismatch is reported as a shape mismatch of the whole output.
    """
    if isinstance(expected, list) or isinstance(actual, list):
        if not (isinstance(expected, list) and isinstance(actual, list)):
            return [(name, np.zeros((1,)), np.zeros((0,)))]
        if len(expected) != len(actual):
            return [(name, np.zeros((len(expected),)), np.zeros((len(actual),)))]
        if expected and all(isinstance(e, dict) for e in (*expected, *actual)):
            # ZipMap's per-row class scores: one [rows, classes] array, one line of the report
            keys = sorted(expected[0])
            if any(sorted(row) != keys for row in (*expected, *actual)):
                return [(name, np.zeros((1,)), np.zeros((0,)))]
            return [
                (
                    name,
                    np.stack([_map_values(row, keys) for row in expected]),
                    np.stack([_map_values(row, keys) for row in actual]),
                )
            ]
        pairs: list[tuple[str, np.ndarray, np.ndarray]] = []
        for index, (e, a) in enumerate(zip(expected, actual)):
            pairs.extend(_flatten_output(f"{name}[{index}]", e, a))
        return pairs
    if expected is None or actual is None:  # an optional output
        if expected is None and actual is None:
            return []
        return [(name, np.zeros((1,)), np.zeros((0,)))]
    if isinstance(expected, dict) or isinstance(actual, dict):  # a map: ZipMap's class scores
        if not (isinstance(expected, dict) and isinstance(actual, dict)):
            return [(name, np.zeros((1,)), np.zeros((0,)))]
        keys = sorted(expected)
        if sorted(actual) != keys:
            return [(name, np.zeros((len(expected),)), np.zeros((len(actual),)))]
        return [(name, _map_values(expected, keys), _map_values(actual, keys))]
    return [(name, np.asarray(expected), np.asarray(actual))]


def _map_values(found: dict[Any, Any], keys: list[Any]) -> np.ndarray:
    """A map's values in key order; ONNX Runtime hands float32 values over as Python floats."""
    values = np.asarray([found[key] for key in keys])
    return values.astype(np.float32) if values.dtype == np.float64 else values


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .* failed:)?")


def _ort_reason(exc: BaseException) -> str:
    """ORT's message without its status prefix and the temp path it loaded from."""
    return _ORT_PREFIX.sub("", _first_line(exc)).strip()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


# One ORT run during validation may take this long (a Loop of 10**12 iterations never ends).
DEFAULT_RUN_TIMEOUT = 600.0


class RunTimedOut(Exception):
    """An ORT run was stopped at the time limit."""


def describe_feeds(feeds: Mapping[str, Any]) -> str:
    """``x[1, 400], mask[1, 400]``: each input with its shape (a sequence input's: [])."""
    return ", ".join(f"{k}{list(getattr(v, 'shape', []))}" for k, v in feeds.items())


def _run_bounded(
    session: Any, names: Sequence[str], feeds: Mapping[str, Any], seconds: float
) -> list[Any]:
    """``session.run``, stopped (through ORT's terminate flag) after ``seconds``."""
    import threading

    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # the stop is reported by the exception, not by ORT's log
    timer = threading.Timer(seconds, lambda: setattr(options, "terminate", True))
    timer.daemon = True
    role = getattr(session, "onnxopt_role", "the model")
    timer.start()
    try:
        ran = f"ONNX Runtime ran {role} on inputs {describe_feeds(feeds)}"
        with doing(f"{ran} (--inputs FILE.npz gives other inputs)"):
            outputs: list[Any] = session.run(list(names), dict(feeds), options)
        return outputs
    except Exception as exc:
        if options.terminate:
            raise RunTimedOut(f"stopped after {seconds:g} s") from exc
        raise
    finally:
        timer.cancel()


def validate(
    original: ir.Model | Path,
    optimized: ir.Model,
    *,
    specs: Sequence[InputSpec] | None = None,
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    extra_inputs: Sequence[Mapping[str, np.ndarray]] = (),
    seed: int = 0,
    trials: int = 2,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
    precisions: Mapping[str, str] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> ValidationReport:
    """Compare outputs of ``original`` and ``optimized`` on ORT (graph optimizations disabled).

    Each output is compared with the tolerance of the float type it is computed in
    (``precisions``: output name -> float type, by default :func:`output_precisions` of
    ``original`` when it is a model; else each output's own dtype).

    Each ORT run is stopped after ``run_timeout`` seconds: the original's is a
    :class:`CannotValidate`, the optimized model's a validation error.

    ``original`` is a model or the path of the untouched file (cheapest: ORT reads it directly).
    ``specs`` describe the inputs to generate (from :func:`input_specs` of the original); by default
    they are derived from ``original`` when it is a model, else from ``optimized``. ``inputs``
    replace the generated inputs; ``extra_inputs`` (e.g. an export's example inputs) are tried too.
    ``sizes`` (symbolic dim name -> size, from ``--dim``) are the first generated sizes tried. When
    the generated sizes do not run, relations between dims are tried (``total = past + seq``, see
    :mod:`onnxopt.input_sizes`); the report's ``notes`` say which one was used.
    """
    # Two phases, one ORT session at a time (each holds a copy of the weights): the original runs
    # every trial first and its outputs are kept, then it is released and the optimized model runs.
    # Random ops are pinned (random_draws): the original's copy also gives its draws, the
    # optimized model's copy is fed them.
    pins: PinnedDraws | None = None
    unpinned = ""
    if unseeded_draws(optimized):
        try:
            pins = pin_draws(original, optimized)
        except CannotPin as exc:
            unpinned = str(exc)
    runs_original = pins.reference if pins is not None else original
    try:
        reference = _session(runs_original, role="the original model")
    except Exception as exc:
        raise CannotValidate(
            f"ONNX Runtime cannot load the original model, so it cannot be validated "
            f"({_ort_reason(exc)}); if it uses custom ops, rerun with --no-validate"
        ) from exc
    added = pins.added if pins is not None else ()
    output_names = [o.name for o in reference.get_outputs() if o.name not in added]
    fetched = [*output_names, *added]  # the original's run: its outputs, then the pins'
    hints = [d for o in reference.get_outputs() for d in o.shape or () if isinstance(d, str)]

    if precisions is None and isinstance(original, ir.Model):
        precisions = output_precisions(original)
    computed_in = dict(precisions or {})
    feed_sets = [dict(f) for f in inputs] if inputs is not None else []
    notes: list[str] = []
    runs: list[tuple[dict[str, Any], list[Any]]] = []  # (feeds, the original's outputs)
    rng = np.random.default_rng(seed)
    last_failure = ""

    def run_one(feeds: Mapping[str, Feed]) -> bool:
        """Run the original on ``feeds``; keep its outputs if it ran."""
        nonlocal last_failure
        try:
            expected = _run_bounded(reference, fetched, feeds, run_timeout)
        except RunTimedOut as exc:
            raise CannotValidate(
                f"the original model ran longer than --run-timeout ({run_timeout:g} s) on ONNX "
                f"Runtime with inputs {describe_feeds(feeds)}; pass --inputs FILE.npz, a longer --run-timeout "
                "or --no-validate"
            ) from exc
        except Exception as exc:
            last_failure = _ort_reason(exc)
            return False
        runs.append((dict(feeds), list(expected)))
        return True

    for feeds in [dict(f) for f in extra_inputs]:
        if not run_one(feeds):
            raise CannotValidate(
                f"the original model fails on the reference inputs: {last_failure}"
            )
    if feed_sets:
        for feeds in feed_sets:
            if not run_one(feeds):
                raise CannotValidate(
                    f"the original model fails on the given inputs: {last_failure}"
                )
    else:
        if specs is None:
            specs = input_specs(original if isinstance(original, ir.Model) else optimized)
        symbols = DimSymbols.of(specs)
        dynamic = any(not isinstance(d, int) for s in specs for d in s.dims)
        wanted = len(extra_inputs) + (trials if dynamic else 1)
        seen: set[tuple[tuple[int, ...], ...]] = set()
        too_big = False

        def attempt(plan: SizePlan | None) -> bool:
            """Run one size plan; True if it was new and the original ran on it."""
            nonlocal too_big
            shapes = symbols.shapes(specs, plan) if plan is not None else None
            if shapes is None or tuple(shapes) in seen:
                return False
            seen.add(tuple(shapes))
            generated = inputs_of_shapes(specs, shapes, rng)
            if generated is None:
                too_big = True
                return False
            return run_one(generated)

        def short() -> bool:
            return len(runs) < wanted

        # --dim sizes first (base_plans starts with them and twice them), then a KV cache's
        # decode step and prompt, then the other generated sizes.
        plans = symbols.base_plans(sizes)
        given = 2 if sizes and set(sizes) & set(symbols.atoms) else 0
        for plan in plans[:given]:
            if short():
                attempt(plan)
        spectral = spectral_signal(optimized, specs)
        if short() and spectral:
            # A spectral front end needs a frame of signal: ONNX Runtime 1.32 dies (SIGFPE, not
            # an exception) on onnx-asr's wespeaker features given fewer samples than its window.
            before = len(runs)
            for plan in symbols.signal_plans(spectral):
                if short():
                    attempt(plan)
            if len(runs) > before:
                notes.append(
                    f"input sizes chosen with {', '.join(spectral)} from "
                    f"{', '.join(map(str, SIGNAL_SIZES))} first (the model computes a spectrum "
                    "of that signal)"
                )
        steps = [
            what
            for what, plan in kv_cache_steps(specs, symbols, sizes)
            if short() and attempt(plan)
        ]
        if steps:
            notes.append(
                f"sized as GroupQueryAttention's KV-cache steps ({'; '.join(steps)}; 2 sequences)"
            )
        for plan in plans[given:]:
            if not short():
                break
            attempt(plan)
        if short() and symbols.atoms:
            # A KV-cache decoder runs only when e.g. total = past + seq: try relations between dims.
            for relation in symbols.relations(hints):
                if not short():
                    break
                base = symbols.distinct(sizes)
                if not attempt(symbols.one_batch(base).with_relation(relation)) and not attempt(
                    base.with_relation(relation)
                ):
                    continue
                notes.append(
                    f"input sizes chosen with {relation}, found by trying relations between "
                    f"dims (fewer than {wanted} generated sizes ran)"
                )
                for plan in symbols.base_plans(sizes):
                    if not short():
                        break
                    attempt(plan.with_relation(relation))
        signal = _signal_dims(specs, symbols) if len(runs) == len(extra_inputs) else []
        if short() and signal:
            # Nothing generated ran: a signal may need to be longer than any size tried so far.
            for plan in symbols.signal_plans(signal):
                if not short():
                    break
                attempt(plan)
            if len(runs) > len(extra_inputs):
                notes.append(
                    f"input sizes chosen with {', '.join(signal)} from "
                    f"{', '.join(map(str, SIGNAL_SIZES))} (the model did not run at "
                    f"{max(FALLBACK_SIZES)} or less)"
                )
        if not runs and too_big and not last_failure:
            raise CannotValidate(
                f"the inputs are too large to generate (over {MAX_TRIAL_ELEMENTS} elements in all); "
                "pass --input-shape, --inputs FILE.npz or --no-validate"
            )
        if not runs:
            raise CannotValidate(
                f"the original model does not run on ONNX Runtime with generated inputs ({last_failure}); "
                "give the sizes of its dims with --dim NAME=SIZE, or pass --inputs FILE.npz or --no-validate"
            )
        ran = len(runs) - len(extra_inputs)
        if short() and ran == 1 and dynamic:
            notes.append(
                "the model ran at one size of its dynamic dims only; give sizes that fit together "
                "with --dim NAME=SIZE (e.g. --dim past=5,seq=3,total=8) to try others"
            )
        # The first generated run, varied: its optional inputs left out, its flags flipped.
        first = runs[len(extra_inputs)][0] if len(runs) > len(extra_inputs) else None
        optional = {s.name for s in specs if s.kind == "optional"}
        if optional and first is not None:
            # An optional input is also left out once: the original's own "absent" path.
            absent = {k: v for k, v in first.items() if k not in optional}
            if not run_one(absent):
                notes.append(
                    "the original model does not run with its optional inputs left out "
                    f"({last_failure}); validated with them given"
                )
        flags = [
            s.name
            for s in specs
            if s.kind == "tensor" and s.dtype == np.bool_ and all(d == 1 for d in s.dims)
        ]
        if flags and first is not None:
            # A boolean flag (an If's condition: optimum's use_cache_branch) is also run flipped,
            # whatever the generated values were, so that both branches are compared.
            flipped = {
                k: (
                    np.asarray(np.logical_not(v), dtype=np.bool_).reshape(np.shape(v))
                    if k in flags
                    else v
                )
                for k, v in first.items()
            }
            if not run_one(flipped):
                notes.append(
                    f"the original model does not run with {', '.join(flags)} flipped "
                    f"({last_failure}); validated with one value"
                )

    drawn = unseeded_draws(original if isinstance(original, ir.Model) else optimized)
    if pins is not None:
        drawn = []
    if drawn and runs:
        # A model that draws random numbers unseeded, where they could not be pinned, gives other
        # outputs on every run: it has nothing to be compared with, and a mismatch would blame
        # the optimizer.
        feeds, expected = runs[-1]
        again = _run_bounded(reference, output_names, feeds, run_timeout)
        if any(
            not _same_values(e_item, a_item)
            for name, e, a in zip(output_names, expected, again)
            for _, e_item, a_item in _flatten_output(name, e, a)
        ):
            why = f": {unpinned}" if unpinned else ""
            raise CannotValidate(
                f"the original model's outputs change from run to run on the same inputs (it "
                f"draws random numbers: {describe(drawn)}), and the optimized model cannot "
                f"be run on the same draws{why}; rerun with --no-validate"
            )
    if pins is not None:
        notes.append(
            f"the model draws random numbers ({pins.ops}): the optimized model ran on the "
            "original's draws, and the inputs of each random op were compared too"
        )
        release_session(pins.reference)
    reference = None  # the closure above holds it too
    release_session(original)
    if pins is not None and runs:
        pins.type_feeds(dict(zip(fetched, runs[0][1], strict=True)))
    runs_optimized = pins.candidate if pins is not None else optimized
    try:
        candidate = _session(runs_optimized, role="the optimized model")
    except Exception as exc:
        return ValidationReport(
            (), (), (f"ONNX Runtime cannot load the optimized model: {_first_line(exc)}",)
        )
    checks = pins.checks if pins is not None else ()
    compared = [*output_names, *(name for name, _ in checks)]
    shown = [*output_names, *(label for _, label in checks)]
    candidate_outputs = {o.name for o in candidate.get_outputs()}
    missing = [n for n in compared if n not in candidate_outputs]
    if missing:
        return ValidationReport((), (), (f"optimized model lost outputs: {', '.join(missing)}",))

    worst = _Worst()
    errors: list[str] = []
    used: list[dict[str, tuple[int, ...]]] = []
    all_nan = tuple(
        name
        for index, name in enumerate(output_names)
        if runs and all(_nan_everywhere(expected[index]) for _, expected in runs)
    )
    for feeds, fetched_values in runs:
        found = dict(zip(fetched, fetched_values, strict=True))
        expected = [found[name] for name in compared]
        fed = dict(feeds)
        for drawn_name, input_name in pins.feeds if pins is not None else ():
            fed[input_name] = found[drawn_name]
        try:
            actual = _run_bounded(candidate, compared, fed, run_timeout)
        except Exception as exc:
            errors.append(f"optimized model fails where the original runs: {_first_line(exc)}")
            break
        for name, label, e, a in zip(compared, shown, expected, actual, strict=True):
            for item_name, e_item, a_item in _flatten_output(label, e, a):
                worst.add(compare_arrays(item_name, e_item, a_item, computed_in.get(name)))
        # Sequence and optional inputs (lists, None) have no single shape to report.
        used.append({k: tuple(v.shape) for k, v in feeds.items() if isinstance(v, np.ndarray)})
    if pins is not None:
        candidate = None
        release_session(pins.candidate)
    failing = [c for c in worst.comparisons.values() if not c.passed]
    if failing and not errors and pins is None and runs:
        candidate = None
        release_session(optimized)
        notes.extend(_ort_own_change(original, runs[0], fetched, failing, computed_in, run_timeout))
    return ValidationReport(
        tuple(used),
        tuple(worst.comparisons.values()),
        tuple(errors),
        tuple(notes),
        all_nan,
    )


def _ort_own_change(
    original: ir.Model | Path,
    run: tuple[dict[str, Any], list[Any]],
    fetched: Sequence[str],
    failing: Sequence[OutputComparison],
    computed_in: Mapping[str, str],
    run_timeout: float,
) -> list[str]:
    """For scale, when outputs mismatch: how far ONNX Runtime's own graph optimizations
    (ORT_ENABLE_ALL, which reassociate sums too) move each failing output of the original on the
    first inputs tried. A model that amplifies rounding shows it here as much as in the optimized
    model. Best effort: nothing when that session cannot be made or run."""
    feeds, expected = run
    by_name = dict(zip(fetched, expected, strict=True))
    names = [
        c.name for c in failing if c.name in by_name and isinstance(by_name[c.name], np.ndarray)
    ]
    if not names:
        return []
    try:
        with doing("ONNX Runtime loaded the original model with its own optimizations"):
            session = _new_session(original, 2, ort_optimized=True)
        moved = _run_bounded(session, names, feeds, run_timeout)
    except Exception:  # only a hint: a failure here changes nothing about the comparison
        return []
    notes = []
    for name, value in zip(names, moved, strict=True):
        change = compare_arrays(name, by_name[name], np.asarray(value), computed_in.get(name))
        notes.append(
            f"for scale: ONNX Runtime's own graph optimizations (ORT_ENABLE_ALL) move the "
            f"original's output '{name}' by up to {change.max_abs:.3g} on the first inputs tried "
            f"({change.mismatches}/{change.elements} beyond the same tolerance)"
        )
    return notes


def _nan_everywhere(output: Any) -> bool:
    """A non-empty float tensor that is NaN at every element."""
    return (
        isinstance(output, np.ndarray)
        and output.dtype.kind == "f"
        and output.size > 0
        and bool(np.isnan(output).all())
    )


def find_relation(
    model: Path,
    specs: Sequence[InputSpec],
    plan: SizePlan,
    *,
    seed: int = 0,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
) -> Relation | None:
    """A relation between dims that ``model`` needs, found by running it (optimizations off).

    None when it runs on inputs sized by ``plan`` as they are, or when no candidate relation
    (:meth:`DimSymbols.relations`: a KV-cache decoder's total = past + seq) makes it run.
    """
    symbols = DimSymbols.of(specs)
    session = _session(model)
    rng = np.random.default_rng(seed)

    def runs(candidate: SizePlan | None) -> bool:  # None: a relation no sizes satisfy
        if candidate is None:
            return False
        return _shapes_if_it_runs(session, specs, symbols, candidate, rng, run_timeout) is not None

    if runs(plan):
        return None
    hints = [d for o in session.get_outputs() for d in o.shape or () if isinstance(d, str)]
    # Checked at a second, distinct size per dim too: at batch = seq = 1, batch + past fits as well.
    other = symbols.one_batch(symbols.distinct())
    for relation in symbols.relations(hints):
        if runs(plan.with_relation(relation)) and runs(other.with_relation(relation)):
            return relation
    return None


# Ops of a spectral front end (short-time transforms of raw audio into features).
_SPECTRAL_OPS = frozenset({"DFT", "STFT", "MelWeightMatrix"})


def spectral_signal(model: ir.Model, specs: Sequence[InputSpec]) -> list[str]:
    """The signal dims (:func:`_signal_dims`) of a model that computes a spectrum, else none."""
    signal = _signal_dims(specs, DimSymbols.of(specs))
    if not signal:
        return []
    for graph in all_graphs(model):
        for node in graph:
            if node.op_type in _SPECTRAL_OPS and is_onnx_domain(node.domain):
                return signal
    return []


def _signal_dims(specs: Sequence[InputSpec], symbols: DimSymbols) -> list[str]:
    """Names only float inputs of rank <= 3 carry past their first dim: a signal's length
    (raw audio [batch, samples], features [batch, mels, frames]); names any other input carries,
    and batch dims, are not."""
    signal: dict[str, None] = {}
    elsewhere: set[str] = set()
    for spec in specs:
        is_signal = spec.kind == "tensor" and spec.dtype.kind == "f" and len(spec.dims) <= 3
        for axis, dim in enumerate(spec.dims):
            if not isinstance(dim, str) or dim not in symbols.atoms:
                continue
            if is_signal and axis > 0:
                signal.setdefault(dim, None)
            elif axis > 0 or dim not in symbols.batch:
                elsewhere.add(dim)
    return [name for name in signal if name not in elsewhere and name not in symbols.batch]


# Tried by :func:`sizes_that_run` in this order: a benchmark wants realistic sizes, so the larger
# ones come first, and every dim at 1 last.
_BENCH_FALLBACK_SIZES = (128, 224, 64, 256, 32, 16, 8, 2)


def sizes_that_run(
    model: Path,
    specs: Sequence[InputSpec],
    *,
    seed: int = 0,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
    spectral: Sequence[str] = (),
) -> dict[str, tuple[int, ...]] | None:
    """Input shapes ``model`` runs at (optimizations off), for when a benchmark's defaults do not:
    every dynamic dim at one size (unnamed dims too, which a benchmark sizes apart), larger
    sizes first, then a signal's length at validation's signal sizes, then distinct sizes per
    name, then 1; None when none runs. The ``spectral`` signal dims (:func:`spectral_signal`)
    are tried at signal lengths first: shorter signals can crash ONNX Runtime."""
    symbols = DimSymbols.of(specs)
    session = _session(model)
    rng = np.random.default_rng(seed)
    signal = symbols.signal_plans(list(spectral) or _signal_dims(specs, symbols))
    plans = [] if spectral else [symbols.constant(size) for size in _BENCH_FALLBACK_SIZES]
    plans += signal
    plans += [symbols.distinct(), symbols.one_batch(symbols.distinct()), symbols.constant(1)]
    for plan in plans:
        shapes = _shapes_if_it_runs(session, specs, symbols, plan, rng, run_timeout)
        if shapes is not None:
            return {spec.name: shape for spec, shape in zip(specs, shapes, strict=True)}
    return None


def _shapes_if_it_runs(
    session: Any,
    specs: Sequence[InputSpec],
    symbols: DimSymbols,
    plan: SizePlan,
    rng: np.random.Generator,
    run_timeout: float,
) -> list[tuple[int, ...]] | None:
    """The input shapes ``plan`` gives, if the session runs on inputs of those shapes."""
    shapes = symbols.shapes(specs, plan)
    feeds = inputs_of_shapes(specs, shapes, rng) if shapes is not None else None
    if shapes is None or feeds is None:
        return None
    try:
        _run_bounded(session, [o.name for o in session.get_outputs()], feeds, run_timeout)
    except Exception:
        return None
    return shapes


@dataclass(frozen=True)
class ReferenceReport:
    """The exported model (``export``) and the optimized one (``optimized``) against eager PyTorch outputs.

    Diagnostic: it tells which step lost accuracy. Whether optimization preserved the model is
    :class:`ValidationReport`'s verdict (which also runs the reference inputs).
    """

    source: str
    metadata: dict[str, str]
    export: tuple[OutputComparison, ...]
    optimized: tuple[OutputComparison, ...]
    errors: tuple[str, ...] = ()

    @property
    def export_passed(self) -> bool:
        return not self.errors and all(c.passed for c in self.export)

    @property
    def optimized_passed(self) -> bool:
        return not self.errors and all(c.passed for c in self.optimized)


def compare_to_eager(
    model: ir.Model | Path, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]
) -> tuple[tuple[OutputComparison, ...], str | None]:
    """Run ``model`` on ORT (optimizations off) on ``inputs``; compare each output named in ``expected``.

    Returns the comparisons and an error message (the model fails to load or run, an output is missing).
    """
    try:
        session = _session(model)
        names = {i.name for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        missing = [n for n in expected if n not in outputs]
        if missing:
            return (
                (),
                f"the model has no output named {', '.join(missing)} (the reference names {', '.join(expected)})",
            )
        feeds = {k: v for k, v in inputs.items() if k in names}
        with doing(
            f"ONNX Runtime ran the model on the eager reference's inputs {describe_feeds(feeds)}"
        ):
            actual = session.run(list(expected), feeds)
    except Exception as exc:
        return (), f"ONNX Runtime fails on the reference inputs: {_first_line(exc)}"
    return tuple(
        compare_arrays(n, np.asarray(expected[n]), np.asarray(a))
        for n, a in zip(expected, actual, strict=True)
    ), None


def load_inputs(path: str | Path) -> list[dict[str, np.ndarray]]:
    """Inputs from a .npz file: one set (arrays named after inputs)."""
    target = Path(path)
    if not target.is_file():
        raise UsageError(f"--inputs {target}: no such file")
    from onnxopt.reference import check_npz_size

    check_npz_size(target, "--inputs")
    try:
        with np.load(target, allow_pickle=False) as data:
            return [{k: data[k] for k in data.files}]
    except (ValueError, OSError) as exc:
        raise UsageError(f"--inputs {target}: not a readable .npz file ({exc})") from None
