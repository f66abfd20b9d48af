"""Valid but unusual models: they optimize correctly (validated on ONNX Runtime) or are refused.

Found by ``scripts/hostile_probe.py``; the hostile ones are in ``test_bad_input.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx.parser
import onnx_ir

from onnxopt import api
from onnxopt.io import load_model, model_from_proto
from onnxopt.validate import CannotValidate, input_specs, validate

ADD_W = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
    y = Add(x, w)
}
"""


def _sparse(name: str) -> onnx.SparseTensorProto:
    values = onh.from_array(np.array([5.0, 7.0], np.float32), name)
    indices = onh.from_array(np.array([1, 3], np.int64), f"{name}_indices")
    return oh.make_sparse_tensor(values, indices, [4])


def _optimized_and_checked(proto: onnx.ModelProto) -> onnx.ModelProto:
    model = model_from_proto(proto)
    result = api.optimize(model)
    assert result.validated
    optimized = result.model
    report = validate(model, optimized)
    assert report.passed, report
    from onnxopt.io import to_proto

    return to_proto(optimized)


def test_sparse_initializer_is_stored_dense() -> None:
    """onnx-ir drops sparse initializers; the loader makes them dense so the model stays whole."""
    proto = onnx.parser.parse_model(ADD_W)
    proto.graph.sparse_initializer.append(_sparse("w"))
    model = model_from_proto(proto)
    weight = model.graph.initializers["w"].const_value
    assert weight is not None
    np.testing.assert_array_equal(weight.numpy(), [0.0, 5.0, 0.0, 7.0])
    optimized = _optimized_and_checked(proto)
    assert not optimized.graph.sparse_initializer


def test_sparse_initializer_with_coordinate_indices(tmp_path: Path) -> None:
    values = onh.from_array(np.array([1.0, 2.0], np.float32), "w")
    indices = onh.from_array(np.array([[0, 1], [1, 0]], np.int64), "w_indices")
    proto = onnx.parser.parse_model(ADD_W.replace("[4]", "[2, 2]"))
    proto.graph.sparse_initializer.append(oh.make_sparse_tensor(values, indices, [2, 2]))
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    weight = load_model(path).model.graph.initializers["w"].const_value
    assert weight is not None
    np.testing.assert_array_equal(weight.numpy(), [[0.0, 1.0], [2.0, 0.0]])


def test_constant_with_sparse_value() -> None:
    proto = onnx.parser.parse_model(ADD_W)
    proto.graph.node.insert(0, oh.make_node("Constant", [], ["w"], sparse_value=_sparse("v")))
    optimized = _optimized_and_checked(proto)
    assert [n.op_type for n in optimized.graph.node] == ["Add"]


def test_string_inputs_are_generated_for_validation() -> None:
    graph = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.STRING, [2, 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.STRING, [2, 3])],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    _optimized_and_checked(proto)


def test_ci_reports_stay_well_formed_with_odd_names(tmp_path: Path) -> None:
    """Value and file names may hold control characters, '<&>', '|' and backticks."""
    import xml.etree.ElementTree as ET

    from click.testing import CliRunner

    from onnxopt.cli import main

    name_in, name_out = 'x<&>"\x01', "]]>y\x1b[31m|`"
    graph = oh.make_graph(
        [oh.make_node("Relu", [name_in], [name_out])],
        "g",
        [oh.make_tensor_value_info(name_in, onnx.TensorProto.FLOAT, [4])],
        [oh.make_tensor_value_info(name_out, onnx.TensorProto.FLOAT, [4])],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    model = tmp_path / "m\x1b|`.onnx"
    model.write_bytes(proto.SerializeToString())
    junit, markdown = tmp_path / "j.xml", tmp_path / "r.md"
    args = ["check", str(model), "--max-abs-error", "1e-3", "--junit", str(junit)]
    result = CliRunner().invoke(main, [*args, "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2"
    assert "\\x1b" in suite[0].get("classname", "")
    rows = [line for line in markdown.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].count(" | ") == 5, rows


def test_shape_inference_skips_data_propagation_for_long_vectors() -> None:
    """ONNX's data propagation holds each element of a 1-D tensor as a dim: a [50M] float Add
    took 8 GB and a minute. Past 65536 elements the pass infers without it, and says so."""
    from onnxopt.passes.infer_shapes import InferShapesPass

    n = 5_000_000
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "w"], ["s"]), oh.make_node("Relu", ["s"], ["y"])],
        "g",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n]),
            oh.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [n]),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = model_from_proto(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    )
    result = InferShapesPass()(model)
    assert any("without data propagation" in note for note in result.notes)
    assert model.graph.outputs[0].shape == onnx_ir.Shape([n])


def _strict(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


def test_json_report_is_strict_json_when_an_error_is_infinite(tmp_path: Path) -> None:
    """A shape mismatch reports an infinite error; ``json.dumps`` would write ``Infinity``."""
    import json

    from click.testing import CliRunner

    from onnxopt.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(onnx.parser.parse_model(ADD_W.replace("w)", "x)")).SerializeToString())
    arrays = {"input/x": np.ones(4, np.float32), "output/y": np.ones((3, 3), np.float32)}
    np.savez(tmp_path / "m.ref.npz", **arrays)  # type: ignore[arg-type]
    result = CliRunner().invoke(main, ["optimize", str(model), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout, parse_constant=_strict)
    assert data["reference"]["export"][0]["max_abs"] is None


def _optional_and_sequence_model(absent_op: str = "Identity") -> onnx.ModelProto:
    """y = o if o is given else absent_op(x); z = concat of the sequence s."""
    vector = oh.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["N"])
    then_branch = oh.make_graph(
        [oh.make_node("OptionalGetElement", ["o"], ["got"])],
        "then",
        [],
        [oh.make_tensor_value_info("got", onnx.TensorProto.FLOAT, ["N"])],
    )
    else_branch = oh.make_graph(
        [oh.make_node(absent_op, ["x"], ["fallback"])],
        "else",
        [],
        [oh.make_tensor_value_info("fallback", onnx.TensorProto.FLOAT, ["N"])],
    )
    graph = oh.make_graph(
        [
            oh.make_node("OptionalHasElement", ["o"], ["has"]),
            oh.make_node("If", ["has"], ["y"], then_branch=then_branch, else_branch=else_branch),
            oh.make_node("ConcatFromSequence", ["s"], ["z"], axis=0),
        ],
        "g",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N"]),
            oh.make_value_info("o", oh.make_optional_type_proto(vector)),
            oh.make_value_info("s", oh.make_sequence_type_proto(vector)),
        ],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N"]),
            oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["M"]),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_optional_and_sequence_inputs_are_generated_for_validation() -> None:
    model = model_from_proto(_optional_and_sequence_model())
    result = api.optimize(model)
    validation = result.report.validation
    assert result.validated and validation is not None
    tried = validation.trials
    # Two sizes of N with the optional input given, then once without it.
    assert [sorted(t) for t in tried] == [["o", "x"], ["o", "x"], ["x"]]
    assert {t["x"] for t in tried[:2]} == {(1,), (3,)}
    # Each sequence gives two tensors of N: z holds 2 * N values per run.
    z = next(c for c in validation.outputs if c.name == "z")
    assert z.elements == 2 * (1 + 3 + 1)


def test_validation_runs_the_absent_optional_path() -> None:
    """A model that differs only when the optional input is left out must fail validation."""
    original = model_from_proto(_optional_and_sequence_model("Identity"))
    changed = model_from_proto(_optional_and_sequence_model("Neg"))
    report = validate(original, changed)
    assert not report.passed
    assert report.failing_outputs() == ["y"]


def test_nested_sequence_input_is_refused_for_validation_with_its_type() -> None:
    nested = oh.make_sequence_type_proto(
        oh.make_sequence_type_proto(oh.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2]))
    )
    graph = oh.make_graph(
        [oh.make_node("SequenceLength", ["s"], ["n"])],
        "g",
        [oh.make_value_info("s", nested)],
        [oh.make_tensor_value_info("n", onnx.TensorProto.INT64, [])],
    )
    model = model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    try:
        input_specs(model)
    except CannotValidate as exc:
        assert "input 's' is of type" in str(exc) and "--inputs" in str(exc)
    else:
        raise AssertionError("a sequence of sequences was generated")


def test_optional_nodes_with_a_type_attribute_do_not_crash_cse() -> None:
    """onnx-ir's CSE hashes attribute values, and Optional's ``type`` is unhashable: optimize
    stopped with an internal error (main graph) or in an If branch (ONNX's test_if_opt)."""
    vector = oh.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2])
    graph = oh.make_graph(
        [
            oh.make_node("Optional", [], ["o1"], type=vector),
            oh.make_node("Optional", [], ["o2"], type=vector),
            oh.make_node("OptionalHasElement", ["o1"], ["h1"]),
            oh.make_node("OptionalHasElement", ["o2"], ["h2"]),
            oh.make_node("And", ["h1", "h2"], ["h"]),
            oh.make_node("Relu", ["x"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("h", onnx.TensorProto.BOOL, []),
        ],
    )
    _optimized_and_checked(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))


def test_optional_input_when_only_the_reference_inputs_run() -> None:
    """No generated size runs (x must have 7 elements), only the reference inputs: the
    left-out-optional run, made from the first generated run, is skipped (it raised IndexError)."""
    vector = oh.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["N"])
    weight = onh.from_array(np.ones((7, 2), np.float32), "w")
    graph = oh.make_graph(
        [
            oh.make_node("OptionalHasElement", ["o"], ["h"]),
            oh.make_node("Unsqueeze", ["x", "zero"], ["row"]),
            oh.make_node("MatMul", ["row", "w"], ["y"]),
        ],
        "g",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N"]),
            oh.make_value_info("o", oh.make_optional_type_proto(vector)),
        ],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2]),
            oh.make_tensor_value_info("h", onnx.TensorProto.BOOL, []),
        ],
        [weight, onh.from_array(np.array([0], np.int64), "zero")],
    )
    model = model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    x = np.arange(7, dtype=np.float32)
    report = validate(model, model, extra_inputs=[{"x": x, "o": x}])
    assert report.passed and report.trials == ({"x": (7,), "o": (7,)},)


_MANY_BIASES = """
import resource
import numpy as np, onnx, onnx.helper as oh, onnx.numpy_helper as onh
from onnxopt.io import model_from_proto
from onnxopt.passes.infer_shapes import InferShapesPass
n, width = 4000, 2048
nodes, weights, prev = [], [], "x"
for i in range(n):
    weights.append(onh.from_array(np.full(width, i, np.float32), f"b{i}"))
    nodes.append(oh.make_node("Add", [prev, f"b{i}"], [f"v{i}"]))
    prev = f"v{i}"
nodes += [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Reshape", [prev, "s"], ["y"])]
x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", width])
y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
graph = oh.make_graph(nodes, "g", [x], [y], weights)
model = model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = InferShapesPass()(model)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(grown, model.graph.outputs[0].shape, repr(result.notes))
"""


def test_many_vector_weights_keep_data_propagation_in_bounded_memory() -> None:
    """4000 biases of 2048 floats (32 MB): ONNX's data propagation held each element of every
    1-D *input* an Add reads as a dim, and weights go to ONNX as typed inputs: 650 MB for this
    model, 8 GB for 50k weights. Float vectors now go as initializers without data (propagation
    reads only integer data), so propagation stays on (the Reshape by Shape(x) is inferred) and
    the pass grows the process by a few MB."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", _MANY_BIASES],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
    )
    grown, shape, notes = proc.stdout.strip().split(" ", 2)
    assert shape == "[B,2048]" and notes == "[]", proc.stdout
    assert int(grown) < 150, f"inference grew the process by {grown} MiB"


def test_shape_inference_skips_data_propagation_for_many_vectors() -> None:
    """No single computed 1-D value is long (50 of 50_000 floats), but together they pass the
    total ONNX's propagation may hold as dims: the pass infers without it and says so."""
    from onnxopt.passes.infer_shapes import InferShapesPass

    n, count = 50_000, 50
    nodes = [oh.make_node("Relu", ["x"], ["r0"])]
    for i in range(1, count):
        nodes.append(oh.make_node("Add", [f"r{i - 1}", "x"], [f"r{i}"]))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n])],
        [oh.make_tensor_value_info(f"r{count - 1}", onnx.TensorProto.FLOAT, None)],
    )
    model = model_from_proto(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    )
    result = InferShapesPass()(model)
    assert any("2097152 in all" in note for note in result.notes), result.notes
    assert model.graph.outputs[0].shape == onnx_ir.Shape([n])


def _noisy_model(seed: float | None) -> onnx_ir.Model:
    """y = x + U(0, 1) noise of x's shape (ViT-MAE's random masking draws its noise so), after a
    string output (compared too, without NaNs)."""
    extra = {} if seed is None else {"seed": seed}
    labels = onh.from_array(np.array(["cat", "dog"], dtype=object), "labels_value")
    graph = oh.make_graph(
        [
            oh.make_node("Constant", [], ["labels"], value=labels),
            oh.make_node("RandomUniformLike", ["x"], ["noise"], name="draw", **extra),
            oh.make_node("Add", ["x", "noise"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [
            oh.make_tensor_value_info("labels", onnx.TensorProto.STRING, [2]),
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4]),
        ],
    )
    return model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))


def test_an_unseeded_random_model_validates_on_the_originals_draws() -> None:
    """The optimized copy is fed the original's noise (see tests/test_random_draws.py); the string
    output beside it is compared as before."""
    report = validate(_noisy_model(seed=None), _noisy_model(seed=None))
    assert report.passed
    assert [o.name for o in report.outputs] == ["labels", "y", "RandomUniformLike 'draw' input 0"]


def test_a_seeded_random_model_validates_run_by_run() -> None:
    """A seed makes every session draw the same numbers in the same order of runs."""
    model = _noisy_model(seed=3.0)
    assert validate(model, model.clone()).passed
