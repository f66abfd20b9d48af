"""Inline weights are read in place from the model file (MappedTensor) and streamed back on save."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir

from onnxopt import io
from onnxopt.passes.deduplicate_initializers import DeduplicateInitializersPass
from onnxopt.validate import validate

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 64] x) => (float[N, 64] y) {
    h = MatMul(x, w)
    z = Add(h, b)
    y = MatMul(z, v)
}
"""


def _write(path: Path, w: np.ndarray, v: np.ndarray) -> Path:
    model = onnx.parser.parse_model(MODEL)
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(w, "w"),
            onnx.numpy_helper.from_array(np.arange(64, dtype=np.float32), "b"),
            onnx.numpy_helper.from_array(v, "v"),
        ]
    )
    onnx.save(model, str(path))
    return path


def _initializers(path: Path) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer}


def test_large_inline_weights_are_mapped_and_written_back_inline(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    v = rng.standard_normal((64, 64)).astype(np.float32)
    source = _write(tmp_path / "m.onnx", w, v)
    loaded = io.load_model(source)
    tensors = {name: value.const_value for name, value in loaded.model.graph.initializers.items()}
    assert isinstance(tensors["w"], io.MappedTensor)
    assert isinstance(tensors["v"], io.MappedTensor)
    assert not isinstance(tensors["b"], io.MappedTensor)  # 256 bytes: parsed as usual
    assert tensors["w"] is not None and np.array_equal(tensors["w"].numpy(), w)
    assert not io.has_external_tensors(loaded.model)

    out = io.save_model(loaded.model, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx.data").exists()
    written = _initializers(out)
    assert list(written) == ["w", "b", "v"]  # initializer order is kept
    for name, expected in _initializers(source).items():
        assert written[name].data_location == onnx.TensorProto.DEFAULT
        assert np.array_equal(
            onnx.numpy_helper.to_array(written[name]), onnx.numpy_helper.to_array(expected)
        )
    onnx.checker.check_model(str(out))
    # ONNX Runtime runs the mapped model (through a streamed temp file) like the original.
    assert validate(source, loaded.model).passed


def test_hard_linked_file_is_parsed_whole(tmp_path: Path) -> None:
    w = np.ones((64, 64), np.float32)
    source = _write(tmp_path / "m.onnx", w, w * 2)
    os.link(source, tmp_path / "other.onnx")  # onnx-ir refuses to map files with several links
    loaded = io.load_model(source)
    assert not any(
        isinstance(v.const_value, io.MappedTensor) for v in loaded.model.graph.initializers.values()
    )
    out = io.save_model(loaded.model, tmp_path / "out.onnx")
    assert np.array_equal(onnx.numpy_helper.to_array(_initializers(out)["v"]), w * 2)


def test_mapped_weights_deduplicate_by_contents_not_by_sample(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    same = _write(tmp_path / "same.onnx", w, w.copy())
    result = DeduplicateInitializersPass()(io.load_model(same).model)
    assert result.stats == {"initializers merged": 1}

    # Equal first and last 4 KiB (what the prefilter reads) but one element apart in the middle.
    v = w.copy()
    v[32, 5] += 1.0
    near = _write(tmp_path / "near.onnx", w, v)
    assert not DeduplicateInitializersPass()(io.load_model(near).model).modified


def test_validation_and_eager_comparison_share_one_session_per_model(tmp_path: Path) -> None:
    from onnxopt import validate as validation

    w = np.ones((64, 64), np.float32)
    loaded = io.load_model(_write(tmp_path / "m.onnx", w, w))
    with validation.shared_sessions():
        first = validation._session(loaded.model)
        assert validation._session(loaded.model) is first
        assert validation._session(tmp_path / "m.onnx") is validation._session(tmp_path / "m.onnx")
    assert validation._session(loaded.model) is not first  # outside the block: a new session


def test_saving_over_the_source_file_keeps_the_loaded_weights(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    source = _write(tmp_path / "m.onnx", w, w * 3)
    loaded = io.load_model(source)
    w_value = loaded.model.graph.initializers["w"]
    w_value.const_value = ir.Tensor(w * 2, name="w")
    loaded.model.graph.doc_string = "moves every weight in the file " * 40
    io.save_model(loaded.model, source)  # what --overwrite does
    v = loaded.model.graph.initializers["v"].const_value
    assert v is not None and np.array_equal(v.numpy(), w * 3)
    assert np.array_equal(onnx.numpy_helper.to_array(_initializers(source)["w"]), w * 2)


def test_a_model_reached_through_a_symlink_elsewhere_loads_and_optimizes(tmp_path: Path) -> None:
    # The loader maps inline weights by the real file's name; a symlink in another folder under
    # another name made that look like missing external data ("file 'm.onnx' does not exist").
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    v = rng.standard_normal((64, 64)).astype(np.float32)
    source = _write(tmp_path / "m.onnx", w, v)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "link.onnx"
    link.symlink_to(source)
    loaded = io.load_model(link)
    tensors = {name: value.const_value for name, value in loaded.model.graph.initializers.items()}
    assert isinstance(tensors["w"], io.MappedTensor)
    assert tensors["v"] is not None and np.array_equal(tensors["v"].numpy(), v)
    from onnxopt import api

    result = api.optimize(link)
    assert result.validated


def test_many_mapped_weights_share_one_map_and_validate_under_a_low_file_limit(
    tmp_path: Path,
) -> None:
    """onnx-ir maps the whole file once per tensor, each map holding a file descriptor: a model of
    20k weights of 4 kB failed validation with "Too many open files" (here 1500 at a limit of
    1024, the common default). The file's tensors now share one map, handed to ORT as buffers."""
    import resource

    count = 1500
    weights = [np.full(1024, i, np.float32) for i in range(count)]  # 4 kB each: mapped
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Concat", ["x", *(f"w{i}" for i in range(count))], ["y"], axis=0)],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1024 * (count + 1)])],
        [onnx.numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    source = tmp_path / "m.onnx"
    onnx.save(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), source
    )
    loaded = io.load_model(source)
    tensors = [v.const_value for v in loaded.model.graph.initializers.values()]
    assert all(isinstance(t, io.MappedTensor) for t in tensors)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        open_before = len(os.listdir("/proc/self/fd"))
        arrays = io.mapped_arrays(loaded.model)
        assert len(os.listdir("/proc/self/fd")) <= open_before + 1  # one map of the one file
        report = validate(loaded.model, loaded.model)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert report.passed, report.errors
    assert np.array_equal(arrays["w1499"], weights[1499])
    assert len({id(t.file_map) for t in tensors if isinstance(t, io.MappedTensor)}) == 1


def test_a_mapped_weight_no_node_reads_does_not_stop_validation(tmp_path: Path) -> None:
    """A pass that replaces a weight leaves the old one behind until dead-code elimination (what
    ``--bisect`` validates): ORT drops unread initializers before taking the mapped buffers, so
    one of those handed to it failed the load ("Failed to find existing initializer")."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    v = rng.standard_normal((64, 64)).astype(np.float32)
    source = _write(tmp_path / "m.onnx", w, v)
    model = io.load_model(source).model
    scaled = ir.Value(name="w_scaled", const_value=ir.tensor(w * np.float32(2.0)))
    model.graph.register_initializer(scaled)
    matmul = next(node for node in model.graph if node.inputs[1] is model.graph.initializers["w"])
    matmul.replace_input_with(1, scaled)
    assert not model.graph.initializers["w"].uses()  # still listed, mapped, read by no node
    report = validate(source, model)
    assert not report.errors, report.errors
    assert not report.passed  # the doubled weight is seen: the session ran


def test_a_weight_a_fusion_replaced_lets_go_of_its_pages_and_reads_again(tmp_path: Path) -> None:
    """fuse-conv-bn folds the Add into MatMul w's weights (a new tensor): the mapped w, read by
    nothing now, releases its data and its map pages (a merge of every weight would otherwise
    keep old and new resident: LLaMA-style with LoRA adapters peaked at 1.7x its file); read
    again, it comes back from the file."""
    from onnxopt.passes.fuse_conv_bn import FuseConvBnPass
    from onnxopt.passes.infer_shapes import InferShapesPass

    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    source = _write(tmp_path / "m.onnx", w, rng.standard_normal((64, 64)).astype(np.float32))
    model = onnx.parser.parse_model(MODEL.replace("z = Add(h, b)", "z = Mul(h, b)"))
    model.graph.initializer.extend(
        onnx.load(str(source), load_external_data=False).graph.initializer
    )
    onnx.save(model, str(source))
    loaded = io.load_model(source).model
    old = loaded.graph.initializers["w"].const_value
    assert isinstance(old, io.MappedTensor) and np.array_equal(old.numpy(), w)
    InferShapesPass()(loaded)
    assert FuseConvBnPass()(loaded).stats == {"matmul+mul->matmul": 1}
    assert not list(loaded.graph.initializers["w"].uses())
    assert old.raw is None  # let go of
    assert np.array_equal(old.numpy(), w)  # and read again from the file
    assert validate(source, loaded).passed
