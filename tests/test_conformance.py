"""ONNX's own conformance data still gives the expected outputs after ``onnxopt.optimize``.

Two sources, both shipped with the ``onnx`` package:

* the backend *node* cases (``onnx.backend.test.case.node.collect_testcases``, ~1,900 models of one
  op each, with inputs and expected outputs);
* the model data in the wheel (``onnx/backend/test/data/{light,simple,pytorch-converted,
  pytorch-operator}``).

For every case that ONNX Runtime runs correctly *unmodified* (checked first, with the case's own
rtol/atol), the model is optimized at the default level with the case's inputs as validation feeds;
validation must pass and the optimized model, serialized and run on ONNX Runtime, must still give the
case's expected outputs. Cases ORT itself cannot run or gets wrong are skipped with the reason.

The harness runs whatever passes ``onnxopt.passes.levels`` registers, so it is re-run as passes land.
A deterministic sample (every ``NODE_SAMPLE_STEP``-th node case) runs by default; the full sweep is::

    .venv/bin/python -m pytest -m slow tests/test_conformance.py -n 2
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import onnxopt
from onnxopt import io

DATA_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODEL_KINDS = ("light", "simple", "pytorch-converted", "pytorch-operator")
NODE_SAMPLE_STEP = 13

Feeds = dict[str, Any]
DataSet = tuple[Feeds, list[Any]]


@dataclass(frozen=True)
class Case:
    name: str
    model: onnx.ModelProto | Path
    data_sets: tuple[DataSet, ...]
    rtol: float
    atol: float


# ---------------------------------------------------------------------------------------------
# Loading the cases


def _to_value(item: Any) -> Any:
    """numpy (or a list of numpy for sequences, None for an empty optional) from a case's value."""
    if isinstance(item, onnx.TensorProto):
        return onnx.numpy_helper.to_array(item)
    if isinstance(item, onnx.SequenceProto):
        return [_to_value(x) for x in onnx.numpy_helper.to_list(item)]
    if isinstance(item, onnx.OptionalProto):
        return onnx.numpy_helper.to_optional(item)
    if isinstance(item, list):
        return [_to_value(x) for x in item]
    if isinstance(item, np.generic):  # numpy scalars: ORT wants 0-d arrays
        return np.asarray(item)
    return item


def _feed_names(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


@functools.cache
def node_cases() -> dict[str, Case]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collected = collect_testcases(None)
    cases: dict[str, Case] = {}
    for test in collected:
        assert test.model is not None and test.data_sets is not None
        names = _feed_names(test.model)
        data_sets = tuple(
            (
                {n: _to_value(v) for n, v in zip(names, inputs)},
                [_to_value(v) for v in outputs],
            )
            for inputs, outputs in test.data_sets
        )
        cases[test.name] = Case(test.name, test.model, data_sets, test.rtol, test.atol)
    return cases


def _read_pb(path: Path) -> Any:
    """A test_data_set file: a TensorProto, or a SequenceProto/OptionalProto when it parses as one."""
    data = path.read_bytes()
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    if tensor.data_type != 0 or not data:
        return onnx.numpy_helper.to_array(tensor)
    sequence = onnx.SequenceProto()
    sequence.ParseFromString(data)
    if sequence.elem_type != 0:
        return _to_value(sequence)
    optional = onnx.OptionalProto()
    optional.ParseFromString(data)
    return _to_value(optional)


def _light_input(value: onnx.ValueInfoProto) -> np.ndarray:
    """The inputs onnx's runner feeds light_* models (``generate_dummy_data(random=False)``)."""
    assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    shape = tuple(
        d.dim_value if d.HasField("dim_value") else 1 for d in value.type.tensor_type.shape.dim
    )
    count = int(np.prod(shape))
    return (np.arange(count).reshape(shape) / count).astype(np.float32)


def _model_case(kind: str, name: str) -> Case:
    if kind == "light":
        path = DATA_DIR / "light" / f"{name}.onnx"
        proto = onnx.load(str(path), load_external_data=False)
        initializers = {t.name for t in proto.graph.initializer}
        feeds = {v.name: _light_input(v) for v in proto.graph.input if v.name not in initializers}
        expected = []
        for index in range(len(proto.graph.output)):
            expected.append(_read_pb(DATA_DIR / "light" / f"{name}_output_{index}.pb"))
        # rtol/atol as given for these models in onnx/backend/test/data/real/*/data.json.
        return Case(name, path, ((feeds, expected),), rtol=1e-3, atol=1e-7)
    folder = DATA_DIR / kind / name
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    names = _feed_names(proto)
    data_sets = []
    for data_dir in sorted(folder.glob("test_data_set_*")):
        inputs = [_read_pb(p) for p in sorted(data_dir.glob("input_*.pb"), key=_pb_index)]
        outputs = [_read_pb(p) for p in sorted(data_dir.glob("output_*.pb"), key=_pb_index)]
        data_sets.append((dict(zip(names, inputs)), outputs))
    return Case(f"{kind}/{name}", folder / "model.onnx", tuple(data_sets), rtol=1e-3, atol=1e-7)


def _pb_index(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


def model_case_ids() -> list[str]:
    ids = []
    for kind in MODEL_KINDS:
        root = DATA_DIR / kind
        if kind == "light":
            ids += [f"light/{p.stem}" for p in sorted(root.glob("light_*.onnx"))]
        else:
            ids += [
                f"{kind}/{p.name}" for p in sorted(root.iterdir()) if (p / "model.onnx").is_file()
            ]
    return ids


# ---------------------------------------------------------------------------------------------
# Running and comparing


def _session(model: onnx.ModelProto | Path | bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(
        str(source) if isinstance(source, Path) else source,
        options,
        providers=["CPUExecutionProvider"],
    )


def assert_similar(
    expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float
) -> None:
    """The comparison of onnx's backend runner (shape, dtype, allclose with the case's tolerances)."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for index, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, list) or isinstance(a, list):
            assert isinstance(e, list) and isinstance(a, list), (
                f"output {index}: sequence vs tensor"
            )
            assert_similar(e, a, rtol, atol)
            continue
        if e is None or a is None:
            assert e is None and a is None, f"output {index}: optional presence differs"
            continue
        e, a = np.asarray(e), np.asarray(a)
        assert a.shape == e.shape, f"output {index}: shape {a.shape}, expected {e.shape}"
        if e.dtype == object:
            np.testing.assert_array_equal(a, e)
            continue
        assert a.dtype == e.dtype, f"output {index}: dtype {a.dtype}, expected {e.dtype}"
        if e.dtype.kind == "V" or e.dtype.name in ("bfloat16",) or "float8" in e.dtype.name:
            e, a = e.astype(np.float32), a.astype(np.float32)
            rtol = max(rtol, 2**-6)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {index}")


def _run(session: Any, feeds: Feeds) -> list[Any]:
    names = [o.name for o in session.get_outputs()]
    return session.run(names, feeds)


def ort_runs_case(case: Case) -> str | None:
    """None when ORT, unmodified, gives the case's expected outputs; else why not."""
    try:
        session = _session(case.model)
    except Exception as exc:
        return f"ORT cannot load it: {_short(exc)}"
    for feeds, expected in case.data_sets:
        try:
            actual = _run(session, feeds)
        except Exception as exc:
            return f"ORT cannot run it: {_short(exc)}"
        try:
            assert_similar(expected, actual, case.rtol, case.atol)
        except AssertionError as exc:
            return f"ORT itself does not match: {_short(exc)}"
    return None


def _short(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]


def check_optimized(case: Case, tmp_path: Path) -> onnxopt.OptimizeResult:
    """Optimize ``case`` (default level, its inputs as validation feeds) and check the expected outputs."""
    reason = ort_runs_case(case)
    if reason is not None:
        pytest.skip(reason)
    feeds = [f for f, _ in case.data_sets]
    if isinstance(case.model, Path):
        source: Any = case.model
    else:
        source = io.model_from_proto(case.model, where=case.name)
    result = onnxopt.optimize(source, inputs=feeds)
    validation = result.report.validation
    assert validation is not None
    assert validation.passed, (
        f"{case.name}: validation failed: {validation.errors or validation.failing_outputs()}"
    )
    written = io.save_model(result.model, tmp_path / "optimized.onnx")
    session = _session(written)
    for data_feeds, expected in case.data_sets:
        assert_similar(expected, _run(session, data_feeds), case.rtol, case.atol)
    return result


# ---------------------------------------------------------------------------------------------
# Tests


def _node_ids(step: int) -> list[str]:
    return sorted(node_cases())[::step]


@pytest.mark.parametrize("name", _node_ids(NODE_SAMPLE_STEP))
def test_node_case_sample(name: str, tmp_path: Path) -> None:
    check_optimized(node_cases()[name], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", _node_ids(1))
def test_node_case(name: str, tmp_path: Path) -> None:
    check_optimized(node_cases()[name], tmp_path)


@pytest.mark.parametrize("case_id", model_case_ids())
def test_model_data(case_id: str, tmp_path: Path) -> None:
    kind, name = case_id.split("/", 1)
    check_optimized(_model_case(kind, name), tmp_path)
