from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from graphs import parse_model

from onnxopt import io
from onnxopt.errors import ModelLoadError, UnsafeModelError, UsageError

WEIGHTS = ",".join(str(i) for i in range(256))
TEXT = (
    '<ir_version: 8, opset_import: ["" : 17]>\n'
    f"g (float[N, 256] x) => (float[N, 256] y) <float[256] w = {{{WEIGHTS}}}> {{ y = Add(x, w) }}"
)


def _save_external(model: ir.Model, path: Path) -> None:
    ir.save(model, path, external_data=path.name + ".data", size_threshold_bytes=16)


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    model = parse_model(TEXT)
    target = io.save_model(model, tmp_path / "out.onnx")
    assert target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
    assert io.load_model(target).model.graph.node(0).op_type == "Add"


def test_save_refuses_to_overwrite_the_input(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    io.save_model(parse_model(TEXT), path)
    before = path.read_bytes()
    loaded = io.load_model(path)
    with pytest.raises(UsageError, match="refusing to overwrite"):
        io.save_model(loaded.model, tmp_path / "." / "m.onnx", protected=(path,))
    assert path.read_bytes() == before


def test_external_data_is_memory_mapped_and_saved_externally(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _save_external(parse_model(TEXT), src / "m.onnx")
    loaded = io.load_model(src / "m.onnx")
    assert loaded.external_files == ((src / "m.onnx.data").resolve(),)
    assert isinstance(loaded.model.graph.initializers["w"].const_value, ir.ExternalTensor)
    out = io.save_model(
        loaded.model, tmp_path / "out.onnx", protected=(src / "m.onnx", *loaded.external_files)
    )
    assert (tmp_path / "out.onnx.data").exists()  # weights stayed external, as in the input
    again = io.load_model(out)
    np.testing.assert_array_equal(
        again.model.graph.initializers["w"].const_value.numpy(), np.arange(256, dtype=np.float32)
    )


def test_external_data_can_be_inlined_on_request(tmp_path: Path) -> None:
    _save_external(parse_model(TEXT), tmp_path / "m.onnx")
    loaded = io.load_model(tmp_path / "m.onnx")
    out = io.save_model(loaded.model, tmp_path / "inline.onnx", external_data=False)
    assert not (tmp_path / "inline.onnx.data").exists()
    proto = onnx.load(str(out), load_external_data=False)
    assert proto.graph.initializer[0].data_location == onnx.TensorProto.DEFAULT


def _with_location(tmp_path: Path, location: str) -> Path:
    _save_external(parse_model(TEXT), tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    path = tmp_path / "evil.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["/etc/passwd", "../outside.bin", "sub/../../outside.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 2048)
    with pytest.raises(UnsafeModelError):
        io.load_model(_with_location(inner, location))


def test_external_data_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 2048)
    os.symlink(tmp_path / "secret.bin", inner / "link.bin")
    with pytest.raises(UnsafeModelError, match="outside the model's folder"):
        io.load_model(_with_location(inner, "link.bin"))


def test_external_data_past_the_end_of_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "short.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ModelLoadError, match="has only 10 bytes"):
        io.load_model(_with_location(tmp_path, "short.bin"))


def test_unsorted_but_acyclic_graph_loads(tmp_path: Path) -> None:
    proto = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) { a = Relu(x) y = Abs(a) }
        """
    )
    proto.graph.node.reverse()
    path = tmp_path / "rev.onnx"
    path.write_bytes(proto.SerializeToString())
    assert io.load_model(path).model.graph.num_nodes() == 2
