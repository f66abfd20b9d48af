"""Model forms third-party tools produce, found by ``scripts/realworld_probe.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx.parser
import onnxruntime as ort
import pytest

from onnxopt import api
from onnxopt.io import MappedTensor, load_model, model_from_proto, save_model

T = onnx.TensorProto


def _duplicate_names() -> onnx.ModelProto:
    """Relu -> Add -> Relu -> Add, with names repeated the way hand edits and some exporters leave them."""
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="block"),
        oh.make_node("Add", ["a", "x"], ["b"], name="block"),
        oh.make_node("Relu", ["b"], ["c"], name="block_1"),  # the name a rename would pick first
        oh.make_node("Add", ["c", "x"], ["d"], name="block"),
        oh.make_node("Sigmoid", ["d"], ["y"], name=""),
        oh.make_node("Neg", ["d"], ["z"], name=""),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [
            oh.make_tensor_value_info("y", T.FLOAT, [2, 3]),
            oh.make_tensor_value_info("z", T.FLOAT, [2, 3]),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_duplicate_node_names_are_made_unique_and_the_file_validates(tmp_path: Path) -> None:
    source = tmp_path / "dup.onnx"
    onnx.save(_duplicate_names(), str(source))

    result = api.optimize(source)

    assert result.validated
    assert result.report.warnings == (
        "2 nodes renamed: their names repeated another node's, which ONNX Runtime refuses to load",
    )
    target = tmp_path / "out.onnx"
    save_model(result.model, target)
    names = [node.name for node in onnx.load(str(target)).graph.node]
    repeated = [name for name, count in Counter(names).items() if name and count > 1]
    assert not repeated
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    y, z = session.run(None, {"x": x})
    d = np.maximum(np.maximum(x, 0) + x, 0) + x
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-d)), rtol=1e-6)
    np.testing.assert_allclose(z, -d)


def test_renaming_is_deterministic_and_skips_names_in_use(tmp_path: Path) -> None:
    source = tmp_path / "dup.onnx"
    onnx.save(_duplicate_names(), str(source))

    loaded = load_model(source)

    assert loaded.renamed_nodes == 2
    assert [n.name for n in loaded.model.graph] == [
        "block",
        "block_2",
        "block_1",
        "block_3",
        "",
        "",
    ]
    assert [n.name for n in model_from_proto(_duplicate_names()).graph] == [
        n.name for n in loaded.model.graph
    ]


def test_unique_names_are_left_alone(tmp_path: Path) -> None:
    proto = _duplicate_names()
    for index, node in enumerate(proto.graph.node):
        node.name = f"n{index}"
    source = tmp_path / "unique.onnx"
    onnx.save(proto, str(source))

    loaded = load_model(source)

    assert loaded.renamed_nodes == 0
    assert [n.name for n in loaded.model.graph] == [f"n{i}" for i in range(6)]
    assert api.optimize(source).report.warnings == ()


ML_WITHOUT_IMPORT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
    s = ai.onnx.ml.Scaler <offset = [0.5, 0.5, 0.5, 0.5], scale = [2.0, 2.0, 2.0, 2.0]> (x)
    shape = Shape(s)
    y = Reshape(s, shape)
}
"""


def test_missing_ml_import_is_added_so_shapes_are_inferred(tmp_path: Path) -> None:
    source = tmp_path / "ml.onnx"
    onnx.save(onnx.parser.parse_model(ML_WITHOUT_IMPORT), str(source))

    result = api.optimize(source)

    assert result.validated
    assert result.report.warnings == (
        "the model uses ai.onnx.ml ops without importing that domain: imported ai.onnx.ml opset 5 "
        "(ONNX Runtime, too, reads a missing import as the newest version)",
    )
    assert result.model.opset_imports == {"": 17, "ai.onnx.ml": 5}
    # With shapes known, the Reshape to the input's own shape is a no-op and goes.
    assert [node.op_type for node in result.model.graph] == ["Scaler"]


def test_imported_ml_domain_is_left_as_it_is(tmp_path: Path) -> None:
    proto = onnx.parser.parse_model(ML_WITHOUT_IMPORT)
    proto.opset_import.append(oh.make_opsetid("ai.onnx.ml", 2))
    source = tmp_path / "ml.onnx"
    onnx.save(proto, str(source))

    result = api.optimize(source)

    assert result.report.warnings == ()
    assert result.model.opset_imports == {"": 17, "ai.onnx.ml": 2}


def test_bench_times_a_model_with_repeated_node_names(tmp_path: Path) -> None:
    from onnxopt.bench.run import BenchOptions, run_bench

    source = tmp_path / "dup.onnx"
    onnx.save(_duplicate_names(), str(source))
    options = BenchOptions(
        ort_levels=("all",),
        budget_seconds=0.2,
        sessions=1,
        memory=False,
        min_rounds=3,
        warmup_runs=1,
    )

    report = run_bench(source, options)

    assert (
        "original: 2 repeated node names made unique (ONNX Runtime refuses them) and timed so"
        in (report.notes)
    )
    [variants] = [group.variants for point in report.points for group in point.groups]
    assert [v.name for v in variants] == ["original", "optimized"]


def _weight_only(dtype: int, array: np.ndarray) -> onnx.ModelProto:
    """y = x @ dequantize(w): a weight of a type numpy lacks, large enough to be memory-mapped."""
    weight = onh.from_array(array, "w")
    assert weight.data_type == dtype
    nodes = [
        oh.make_node("Cast", ["w"], ["wf"], to=T.FLOAT)
        if dtype == T.BFLOAT16
        else oh.make_node("DequantizeLinear", ["w", "scale"], ["wf"], axis=0, block_size=32),
        oh.make_node("MatMul", ["x", "wf"], ["m"]),
        oh.make_node("Relu", ["m"], ["r"]),
        oh.make_node("Identity", ["r"], ["y"]),
    ]
    scale = onh.from_array(np.full((4, 128), 0.05, np.float32), "scale")
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, ["n", 128])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["n", 128])],
        [weight] if dtype == T.BFLOAT16 else [weight, scale],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize(
    ("dtype", "numpy_type"), [(T.BFLOAT16, ml_dtypes.bfloat16), (T.INT4, ml_dtypes.int4)]
)
def test_mapped_weights_of_types_numpy_lacks_validate(
    tmp_path: Path, dtype: int, numpy_type: type
) -> None:
    """bfloat16 LLMs and int4 blockwise-QDQ models: their weights are mapped, not copied, on load."""
    rng = np.random.default_rng(0)
    array = rng.integers(-8, 8, (128, 128)).astype(numpy_type)
    source = tmp_path / "weights.onnx"
    onnx.save(_weight_only(dtype, array), str(source))
    loaded = load_model(source)
    assert isinstance(loaded.model.graph.initializers["w"].const_value, MappedTensor)

    result = api.optimize(source)

    assert result.validated, result.report.validation
    assert [n.op_type for n in result.model.graph] == [
        "Cast" if dtype == T.BFLOAT16 else "DequantizeLinear",
        "MatMul",
        "Relu",
    ]


def test_ort_format_model_is_named_as_such(tmp_path: Path) -> None:
    """ORT can save its optimized graph as a .ort flatbuffer; users then hand that file over."""
    from onnxopt.errors import ModelLoadError

    proto = _duplicate_names()
    for index, node in enumerate(proto.graph.node):
        node.name = f"n{index}"
    source = tmp_path / "m.onnx"
    onnx.save(proto, str(source))
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "m.ort")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])

    with pytest.raises(ModelLoadError, match=r"m\.ort: this is an ORT format model \(\.ort\)"):
        load_model(tmp_path / "m.ort")
