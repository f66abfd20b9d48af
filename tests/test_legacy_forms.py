"""Model forms of the opset 6-12 era and of older converters, found by ``scripts/legacy_probe.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx.parser
import pytest

from onnxopt import api
from onnxopt.errors import ModelLoadError
from onnxopt.io import load_model, model_from_proto, save_model

REPO = Path(__file__).resolve().parent.parent

# What skl2onnx writes for a LogisticRegression with target_opset={"": 15, "ai.onnx.ml": 3}:
# ai.onnx.ml first, then the default domain imported twice at the same version.
CLASSIFIER = """
<ir_version: 8, opset_import: ["ai.onnx.ml" : 1, "" : 15]>
g (float[N, 4] X) => (int64[N] label, float[N, 3] probabilities) {
    label, scores = ai.onnx.ml.LinearClassifier <classlabels_ints = [0, 1, 2],
        coefficients = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2],
        intercepts = [0.1, 0.2, 0.3], multi_class = 1, post_transform = "LOGISTIC"> (X)
    probabilities = ai.onnx.ml.Normalizer <norm = "L1"> (scores)
}
"""


def _repeated_import(version: int) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(CLASSIFIER)
    proto.opset_import.append(oh.make_opsetid("", version))
    return proto


def test_an_opset_imported_twice_at_one_version_loads_with_one_import(tmp_path: Path) -> None:
    source = tmp_path / "skl.onnx"
    onnx.save(_repeated_import(15), str(source))
    onnx.checker.check_model(onnx.load(str(source)))  # onnx and ONNX Runtime accept it

    result = api.optimize(source)

    assert result.validated
    assert result.report.warnings == ("opset 15 of domain '' was imported twice: kept one import",)
    assert result.model.opset_imports == {"ai.onnx.ml": 1, "": 15}
    assert model_from_proto(_repeated_import(15)).opset_imports == {"ai.onnx.ml": 1, "": 15}


def test_an_opset_imported_at_two_versions_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "skl.onnx"
    onnx.save(_repeated_import(13), str(source))

    with pytest.raises(ModelLoadError, match="imported twice, at versions 15 and 13"):
        load_model(source)


@pytest.mark.parametrize(
    ("op", "attributes"),
    [
        ("ImageScaler", "bias = [-0.5, -0.4, -0.3], scale = 0.0039"),
        ("Affine", "alpha = 2.0, beta = 0.5"),
        ("ScaledTanh", "alpha = 2.0, beta = 0.5"),
        ("ParametricSoftplus", "alpha = 2.0, beta = 0.5"),
        ("ThresholdedRelu", "alpha = 0.1"),
    ],
)
def test_a_conv_after_an_op_onnx_dropped_the_schema_of_is_still_fused(
    tmp_path: Path, op: str, attributes: str
) -> None:
    """tiny-YOLOv2 (opset 8) starts with ImageScaler: onnx no longer infers its type, ORT runs it."""
    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 4, opset_import: ["" : 8]>
        g (float[1, 3, 8, 8] image) => (float[1, 4, 8, 8] y) {{
            scaled = {op} <{attributes}> (image)
            c = Conv <pads = [1, 1, 1, 1]> (scaled, w, b)
            y = LeakyRelu <alpha = 0.1> (c)
        }}
        """
    )
    proto.graph.initializer.extend(
        [
            onh.from_array(np.linspace(-1, 1, 108, dtype=np.float32).reshape(4, 3, 3, 3), "w"),
            onh.from_array(np.array([0.1, -0.2, 0.3, 0.0], np.float32), "b"),
        ]
    )
    source = tmp_path / "yolo.onnx"
    onnx.save(proto, str(source))

    result = api.optimize(source)

    assert result.validated
    assert [node.op_type for node in result.model.graph] == [op, "FusedConv"]


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("after_conv", [True, False], ids=["conv-bn", "bn-alone"])
def test_a_batch_norm_listing_its_statistics_outputs_is_training_mode_and_not_folded(
    tmp_path: Path, opset: int, after_conv: bool
) -> None:
    """Before opset 14 the extra outputs, even unused, make ORT normalize with the batch's stats."""
    source_op = "Conv <pads = [1, 1, 1, 1]> (x, w, b)" if after_conv else "Identity(x)"
    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 4, opset_import: ["" : {opset}]>
        g (float[N, 3, 6, 6] x) => (float[N, 3, 6, 6] y) {{
            c = {source_op}
            n, mean, var, saved_mean, saved_var = BatchNormalization <epsilon = 0.00001> (c, g, be, mu, v)
            y = Relu(n)
        }}
        """
    )
    rng = np.random.default_rng(0)
    proto.graph.initializer.extend(
        onh.from_array(array.astype(np.float32), name)
        for name, array in (
            ("w", rng.standard_normal((3, 3, 3, 3)) * 0.3),
            ("b", rng.standard_normal(3)),
            ("g", rng.standard_normal(3) + 1.0),
            ("be", rng.standard_normal(3)),
            ("mu", rng.standard_normal(3) * 3.0),
            ("v", np.abs(rng.standard_normal(3)) + 4.0),
        )
    )
    source = tmp_path / "bn.onnx"
    onnx.save(proto, str(source))

    result = api.optimize(source, explain=True, enable=["decompose-batch-norm"])

    assert result.validated
    assert "BatchNormalization" in [node.op_type for node in result.model.graph]
    if after_conv:
        assert any(
            "BatchNormalization lists its running-statistics outputs" in note
            for note in result.report.explain_notes(fusions=True)
        )


def _optimize_in_a_process(source: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """``onnxopt optimize`` in a process of its own: an ORT crash must not take pytest with it."""
    return subprocess.run(
        [sys.executable, "-m", "onnxopt", "optimize", str(source), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )


def test_empty_trailing_outputs_are_dropped_so_ort_does_not_crash(tmp_path: Path) -> None:
    """``BatchNormalization-7 (..) -> (y, "", "", "", "")`` makes ORT count five outputs, run in
    training mode and crash the process; an empty name means an absent output, so they go at load.
    A real process: before the fix the crash took the caller with it."""
    proto = onnx.parser.parse_model(
        """
        <ir_version: 4, opset_import: ["" : 7]>
        g (float[N, 3, 4, 4] x) => (float[N, 3, 4, 4] y) {
            y = BatchNormalization <epsilon = 0.00001> (x, g, b, m, v)
        }
        """
    )
    proto.graph.initializer.extend(
        onh.from_array(np.array(values, np.float32), name)
        for name, values in (("g", [1, 2, 3]), ("b", [0, 1, 2]), ("m", [0.5] * 3), ("v", [2] * 3))
    )
    proto.graph.node[0].output.extend([""] * 4)
    source, target = tmp_path / "bn.onnx", tmp_path / "out.onnx"
    onnx.save(proto, str(source))

    done = _optimize_in_a_process(source, target)

    assert done.returncode == 0, done.stderr
    assert "1 nodes ended their outputs with empty names" in done.stdout
    assert [list(n.output) for n in onnx.load(str(target)).graph.node] == [["y"]]
    assert load_model(source).trimmed_nodes == 1
    assert not load_model(source).runs_as_is


def test_empty_trailing_outputs_inside_a_local_function_branch_are_dropped(tmp_path: Path) -> None:
    """The repair walked the main graph's subgraphs and the functions' top-level nodes only: an If
    inside a local function kept ``BatchNormalization -> (y, "", "", "", "")``, and ORT, which
    inlines the function at load, crashed validating the original (exit 139)."""
    f32 = onnx.TensorProto.FLOAT
    opsets = [oh.make_opsetid("", 9)]

    def branch(node: onnx.NodeProto) -> onnx.GraphProto:
        name = node.output[0]
        return oh.make_graph([node], name, [], [oh.make_tensor_value_info(name, f32, None)])

    norm = oh.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["t", "", "", "", ""])
    dropout = oh.make_node("Dropout", ["x"], ["e", ""])  # (output, mask): the mask absent

    params = ["x", "c", "g", "b", "m", "v"]
    function = oh.make_function(
        "local",
        "f",
        params,
        ["y"],
        [oh.make_node("If", ["c"], ["y"], then_branch=branch(norm), else_branch=branch(dropout))],
        opsets,
    )
    graph = oh.make_graph(
        [oh.make_node("f", params, ["y"], domain="local")],
        "g",
        [
            oh.make_tensor_value_info("x", f32, ["N", 3, 4, 4]),
            oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y", f32, ["N", 3, 4, 4])],
        [
            onh.from_array(np.array(values, np.float32), name)
            for name, values in (
                ("g", [1, 2, 3]),
                ("b", [0, 1, 2]),
                ("m", [0.5] * 3),
                ("v", [2] * 3),
            )
        ],
    )
    proto = oh.make_model(
        graph,
        opset_imports=[*opsets, oh.make_opsetid("local", 1)],
        functions=[function],
        ir_version=8,
    )
    onnx.checker.check_model(proto)
    source, target = tmp_path / "bn.onnx", tmp_path / "out.onnx"
    onnx.save(proto, str(source))

    done = _optimize_in_a_process(source, target)

    assert done.returncode == 0, done.stderr
    assert "2 nodes ended their outputs with empty names" in done.stdout
    assert "c[]" in done.stdout  # the flag ran both ways: both branches were compared
    assert load_model(source).trimmed_nodes == 2
    assert not load_model(source).runs_as_is
    written = onnx.load(str(target))
    branches = [a.g for n in written.graph.node for a in n.attribute if a.HasField("g")]
    assert sorted(list(n.output) for b in branches for n in b.node) == [["e"], ["t"]]


def _classifier(scale: float = 0.1, cast: bool = True) -> onnx.ModelProto:
    """As skl2onnx converts a classifier by default: scores, a Cast, and a ZipMap whose output is
    a ``seq(map(int64, float))`` (one map of class scores per row)."""
    nodes = [
        oh.make_node(
            "LinearClassifier",
            ["X"],
            ["label", "probabilities"],
            domain="ai.onnx.ml",
            classlabels_ints=[0, 1, 2],
            coefficients=[scale * i for i in range(12)],
            intercepts=[0.1, 0.2, 0.3],
            post_transform="SOFTMAX",
        ),
        oh.make_node("Cast", ["label"], ["output_label"], to=onnx.TensorProto.INT64),
        oh.make_node(
            "ZipMap",
            ["probabilities"],
            ["output_probability"],
            name="ZipMap",
            domain="ai.onnx.ml",
            classlabels_int64s=[0, 1, 2],
        ),
    ]
    if not cast:
        nodes[1] = oh.make_node("Identity", ["label"], ["output_label"])
    seq_map = oh.make_sequence_type_proto(
        oh.make_map_type_proto(onnx.TensorProto.INT64, oh.make_tensor_type_proto(1, []))
    )
    graph = oh.make_graph(
        nodes,
        "classifier",
        [oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [None, 4])],
        [
            oh.make_tensor_value_info("output_label", onnx.TensorProto.INT64, [None]),
            oh.make_value_info("output_probability", seq_map),
        ],
        value_info=[oh.make_value_info("annotated", seq_map)],
    )
    opsets = [oh.make_opsetid("", 9), oh.make_opsetid("ai.onnx.ml", 1)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=8)


def test_a_zipmap_classifier_is_optimized_and_its_class_scores_compared(tmp_path: Path) -> None:
    """skl2onnx and onnxmltools end every classifier in ZipMap by default; onnx-ir holds no map
    type, so the output's type is kept aside and written back, and validation compares the
    per-row maps of class scores as one [rows, classes] array."""
    source = tmp_path / "skl.onnx"
    onnx.save(_classifier(), str(source))
    target = tmp_path / "out.onnx"

    result = api.optimize(source)
    save_model(result.model, target)

    validation = result.report.validation
    assert validation is not None and validation.passed
    compared = {c.name: c for c in validation.outputs}
    assert compared["output_probability"].dtype == "float32"
    rows = sum(trial["X"][0] for trial in validation.trials)
    assert compared["output_probability"].elements == rows * 3 > 3  # three classes per row
    written = onnx.load(str(target))
    assert [n.op_type for n in written.graph.node] == ["LinearClassifier", "ZipMap"]
    assert written.graph.output[1] == _classifier().graph.output[1]  # seq(map(int64, float))
    dims = written.graph.output[0].type.tensor_type.shape.dim
    assert len(dims) == 1 and not dims[0].dim_param  # no made-up "unk__0" in the interface
    from onnxopt.report import ModelSummary

    outputs = ModelSummary.of(load_model(target).model).outputs
    assert [o.dtype for o in outputs] == ["int64", "seq(map(int64, float))"]  # as inspect shows
    # the output runs on ONNX Runtime as the original does, and optimizes to itself
    again = tmp_path / "again.onnx"
    save_model(api.optimize(target).model, again)
    assert again.read_bytes() == target.read_bytes()


def test_a_changed_class_score_in_a_zipmap_output_fails_validation(tmp_path: Path) -> None:
    from onnxopt.validate import validate

    original = model_from_proto(_classifier(0.1, cast=False))
    changed = model_from_proto(_classifier(0.11, cast=False))

    report = validate(original, changed)

    assert "output_probability" in report.failing_outputs()


def test_a_map_input_is_refused_with_its_name(tmp_path: Path) -> None:
    """DictVectorizer reads a map(string, float): validation could not make such inputs."""
    node = oh.make_node(
        "DictVectorizer", ["D"], ["Y"], domain="ai.onnx.ml", string_vocabulary=["a", "b"]
    )
    map_type = oh.make_map_type_proto(onnx.TensorProto.STRING, oh.make_tensor_type_proto(1, []))
    graph = oh.make_graph(
        [node],
        "vectorizer",
        [oh.make_value_info("D", map_type)],
        [oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [None, 2])],
    )
    source = tmp_path / "dv.onnx"
    opsets = [oh.make_opsetid("", 9), oh.make_opsetid("ai.onnx.ml", 1)]
    onnx.save(oh.make_model(graph, opset_imports=opsets, ir_version=8), str(source))

    with pytest.raises(ModelLoadError) as caught:
        load_model(source)

    assert str(caught.value) == (
        f"{source}: input 'D' is a map or a sequence of maps; a map-typed input is not "
        "supported (onnx-ir holds no map types)"
    )


def test_a_zipmap_output_made_inside_a_local_function_keeps_its_type(tmp_path: Path) -> None:
    """Inlining the function puts another value in the output's place: the type set aside at
    load is found again by the output's name."""
    classifier = _classifier(cast=False)
    function = oh.make_function(
        "custom",
        "Classify",
        ["X"],
        ["output_label", "output_probability"],
        list(classifier.graph.node),
        [oh.make_opsetid("", 9), oh.make_opsetid("ai.onnx.ml", 1)],
    )
    graph = oh.make_graph(
        [oh.make_node("Classify", ["X"], ["label", "scores"], domain="custom")],
        "wrapped",
        list(classifier.graph.input),
        [
            oh.make_tensor_value_info("label", onnx.TensorProto.INT64, [None]),
            oh.make_value_info("scores", classifier.graph.output[1].type),
        ],
    )
    opsets = [*classifier.opset_import, oh.make_opsetid("custom", 1)]
    source = tmp_path / "wrapped.onnx"
    onnx.save(
        oh.make_model(graph, opset_imports=opsets, functions=[function], ir_version=8), str(source)
    )
    target = tmp_path / "out.onnx"

    result = api.optimize(source)
    save_model(result.model, target)

    assert result.validated
    written = onnx.load(str(target))
    assert [n.op_type for n in written.graph.node] == ["LinearClassifier", "ZipMap"]
    assert written.graph.output[1].type == classifier.graph.output[1].type
    onnx.checker.check_model(written)
    assert result.report.after.outputs[1].dtype == "seq(map(int64, float))"
