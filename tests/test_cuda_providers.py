"""--ort-providers cuda on a real CUDA session: what the CPU form breaks there, and that the cuda
form runs on the GPU. Skipped where ONNX Runtime cannot make a CUDA session (no onnxruntime-gpu,
or no GPU); the rest of the suite checks the rewrites themselves on the CPU."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxopt import io
from onnxopt.passes.fuse_conv_activation import FuseConvActivationPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.options import PassOptions
from tests.test_fuse_conv_activation import _model as conv_model
from tests.test_fuse_group_query_attention import _feeds
from tests.test_fuse_group_query_attention import _model as attention_model

CPU = PassOptions(ort_providers=("cpu",))
CUDA = PassOptions(ort_providers=("cpu", "cuda"))


def _cuda_session_works() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    with tempfile.TemporaryDirectory() as folder:
        path = io.save_model(conv_model("Relu (c)"), Path(folder) / "probe.onnx")
        try:
            session = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
        except Exception:  # no GPU, no driver: the tests here do not apply
            return False
    return session.get_providers()[0] == "CUDAExecutionProvider"


pytestmark = pytest.mark.skipif(
    not _cuda_session_works(), reason="ONNX Runtime cannot make a CUDA session here"
)


def _session(model: ir.Model, folder: Path, profile: bool = False) -> ort.InferenceSession:
    folder.mkdir(exist_ok=True)
    options = ort.SessionOptions()
    options.enable_profiling = profile
    options.profile_file_prefix = str(folder / "profile")
    path = io.save_model(model, folder / "model.onnx")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ort.InferenceSession(str(path), options, providers=providers)


def test_fused_conv_with_sigmoid_breaks_a_cuda_session_and_the_cuda_form_runs(
    tmp_path: Path,
) -> None:
    model = conv_model("Sigmoid (c)")
    for_cpu = model.clone()
    assert FuseConvActivationPass(CPU)(for_cpu).modified  # FusedConv(Sigmoid)
    with pytest.raises(Exception, match="activation"):
        _session(for_cpu, tmp_path / "a").run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})
    for_cuda = model.clone()
    assert not FuseConvActivationPass(CUDA)(for_cuda).modified
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(
        str(io.save_model(model, tmp_path / "m.onnx")), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})[0]
    got = _session(for_cuda, tmp_path / "b").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def _attention_provider(model: ir.Model, folder: Path) -> str:
    """The provider ORT's profiler names for the model's attention node."""
    session = _session(model, folder, profile=True)
    session.run(None, _feeds(2, 5, 0))
    events = json.loads(Path(session.end_profiling()).read_text())
    return next(
        e["args"]["provider"]
        for e in events
        if e.get("cat") == "Node" and "Attention" in e["args"].get("op_name", "")
    )


def test_float32_attention_for_cuda_runs_on_the_gpu(tmp_path: Path) -> None:
    for_cpu = attention_model()
    assert FuseGroupQueryAttentionPass(CPU)(for_cpu).modified  # float32 GroupQueryAttention
    assert _attention_provider(for_cpu, tmp_path / "cpu") == "CPUExecutionProvider"
    for_cuda = attention_model()
    assert not FuseGroupQueryAttentionPass(CUDA)(for_cuda).modified  # MultiHeadAttention
    assert _attention_provider(for_cuda, tmp_path / "cuda") == "CUDAExecutionProvider"
