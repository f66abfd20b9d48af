"""``optimize --opset N``: the model's opset is raised with onnx.version_converter before the passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from onnxopt import io
from onnxopt.api import optimize
from onnxopt.cli import EXIT_ERROR, EXIT_OK
from onnxopt.errors import UsageError
from onnxopt.validate import validate
from tests.test_cli import cli, one_error_line
from tests.test_fuse_rotary_embedding import _inv_freq, _rope_text, _slices

# A weight big enough (4 KiB) to be kept out of the protobuf the converter sees, and a Squeeze whose
# axes move from an attribute to an input at opset 13.
MATMUL = """
<ir_version: 7, opset_import: ["" : 11]>
g (float[B, 32] x) => (float[B] y) {
    h = MatMul (x, w)
    r = ReduceSum <axes = [1], keepdims = 1> (h)
    y = Squeeze <axes = [1]> (r)
}
"""


def _proto(text: str, **initializers: np.ndarray) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(text)
    for name, array in initializers.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(array), name))
    return proto


def _save(tmp_path: Path, text: str, **initializers: np.ndarray) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(_proto(text, **initializers), path)
    return path


def test_convert_opset_keeps_weights_out_of_protobuf_and_back() -> None:
    weight = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    model = io.model_from_proto(_proto(MATMUL, w=weight))
    converted = io.convert_opset(model, 23)
    assert converted.opset_imports[""] == 23
    assert [v.name for v in converted.graph.inputs] == ["x"]
    restored = converted.graph.initializers["w"].const_value
    assert restored is not None and np.array_equal(restored.numpy(), weight)
    squeeze = next(n for n in converted.graph if n.op_type == "Squeeze")
    assert len(squeeze.inputs) == 2  # axes became an input
    assert model.opset_imports[""] == 11 and "w" in model.graph.initializers  # source untouched
    report = validate(model, converted)
    assert report.passed, report


def test_api_opset_lets_onnx_target_fuse_rotary() -> None:
    model = io.model_from_proto(_proto(_rope_text(20), inv_freq=_inv_freq(), **_slices()))
    result = optimize(model, target="onnx", opset=23)
    assert result.report.opset_conversion == "opset 20 → 23 (onnx.version_converter)"
    assert result.report.before.opsets[""] == 20 and result.report.after.opsets[""] == 23
    assert result.report.after.op_counts.get("RotaryEmbedding") == 2
    assert result.validated, result.report.validation
    assert model.opset_imports[""] == 20  # validation compared against the unconverted original


def test_cli_opset_reports_the_conversion(tmp_path: Path) -> None:
    path = _save(tmp_path, _rope_text(20), inv_freq=_inv_freq(), **_slices())
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", path, "-o", out, "--target", "onnx", "--opset", "23")
    assert code == EXIT_OK, stderr
    assert "opset 20 → 23 (onnx.version_converter)" in stdout
    written = onnx.load(out)
    assert {o.domain: o.version for o in written.opset_import}[""] == 23
    assert [n.op_type for n in written.graph.node].count("RotaryEmbedding") == 2


def test_same_opset_is_not_a_conversion() -> None:
    model = io.model_from_proto(_proto(MATMUL, w=np.ones((32, 32), np.float32)))
    result = optimize(model, opset=11, check=False)
    assert result.report.opset_conversion is None
    assert result.report.after.opsets[""] == 11


@pytest.mark.parametrize(
    ("opset", "reason"),
    [
        ("19", "--opset 19: the model already uses opset 20; opsets can only be raised"),
        ("99", f"--opset 99: onnx {onnx.__version__} converts up to opset {io.MAX_OPSET}"),
    ],
)
def test_cli_opset_refused(opset: str, reason: str, tmp_path: Path) -> None:
    path = _save(tmp_path, _rope_text(20), inv_freq=_inv_freq(), **_slices())
    code, _, stderr = cli("optimize", path, "-o", tmp_path / "out.onnx", "--opset", opset)
    assert code == EXIT_ERROR
    assert one_error_line(stderr) == f"onnxopt: error: {reason}"
    assert not (tmp_path / "out.onnx").exists()


def test_cli_opset_conversion_failure_is_one_line(tmp_path: Path) -> None:
    """Upsample-9 takes its scales as an input; one given as an attribute cannot be converted."""
    text = """
    <ir_version: 7, opset_import: ["" : 9]>
    g (float[1, 1, 2, 2] x) => (float[1, 1, 4, 4] y) {
        y = Upsample <mode = "nearest"> (x)
    }
    """
    path = _save(tmp_path, text)
    code, _, stderr = cli("optimize", path, "-o", tmp_path / "out.onnx", "--opset", "23")
    assert code == EXIT_ERROR
    line = one_error_line(stderr)
    assert line.startswith(
        "onnxopt: error: --opset 23: onnx.version_converter cannot convert this model from opset 9: "
    )


def test_convert_opset_rejects_missing_default_domain() -> None:
    text = '<ir_version: 8, opset_import: ["custom" : 1]> g (float[2] x) => (float[2] y) { y = custom.Foo (x) }'
    model = io.model_from_proto(onnx.parser.parse_model(text))
    with pytest.raises(UsageError, match="imports no default-domain opset"):
        io.convert_opset(model, 23)


def test_cli_opset_of_a_model_whose_small_weights_are_external_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dynamo exporter stores every weight in model.onnx.data, small ones too: those (under
    onnx-ir's 1 KB limit) travel through the converter's protobuf as references to the file, which
    read back relative to no folder (FileNotFoundError once the working directory is elsewhere)."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((32, 32)).astype(np.float32)}  # 4 KiB: kept out
    text = MATMUL.replace("h = MatMul (x, w)", "m = MatMul (x, w)\n    h = Add (m, b)")
    proto = _proto(text, b=rng.standard_normal(32).astype(np.float32), **weights)  # 128 B
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(proto, folder / "model.onnx", save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "out.onnx"
    code, _, stderr = cli("optimize", folder / "model.onnx", "-o", out, "--opset", "23")
    assert code == EXIT_OK, stderr
    assert {o.domain: o.version for o in onnx.load(out).opset_import}[""] == 23
