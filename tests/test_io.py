from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from graphs import parse_model

from onnxopt import io
from onnxopt.errors import ModelLoadError, ModelSaveError, UnsafeModelError, UsageError

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


def _two_weights(start: int) -> ir.Model:
    """``y = x + w1 + w2``, each weight 2 kB (external data), its values counting from ``start``."""
    values = [",".join(str(start + k * 512 + i) for i in range(512)) for k in range(2)]
    return parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[512] x) => (float[512] y) <float[512] w1 = {{{values[0]}}}, "
        f"float[512] w2 = {{{values[1]}}}> {{ a = Add(x, w1) y = Add(a, w2) }}"
    )


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()]
)
def test_a_failure_mid_data_leaves_no_files_and_the_earlier_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """The .onnx was renamed into place, but onnx-ir replaced the .data before the model was
    written: a full disk after it left the earlier .onnx reading the new weights."""
    io.save_model(_two_weights(0), tmp_path / "out.onnx", external_data=True)
    earlier = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(earlier) == ["out.onnx", "out.onnx.data"]
    write = io._stream_tensor

    def full_at_the_second_tensor(tensor: ir.TensorProtocol, f: BinaryIO, count: int) -> None:
        if f.tell() == 0:
            write(tensor, f, count)
            return
        f.write(b"\0" * (count // 2))
        raise failure

    monkeypatch.setattr(io, "_stream_tensor", full_at_the_second_tensor)
    expected = ModelSaveError if isinstance(failure, OSError) else KeyboardInterrupt
    for name in ("out.onnx", "new.onnx"):
        with pytest.raises(expected):
            io.save_model(_two_weights(5000), tmp_path / name, external_data=True)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == earlier  # no temp file
    monkeypatch.undo()
    weights = io.load_model(tmp_path / "out.onnx").model.graph.initializers
    assert weights["w2"].const_value.numpy()[0] == 512  # type: ignore[union-attr]


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
