"""--ort-version and --ort-providers: the ONNX Runtime a --target ort output must run on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxopt import api, io
from onnxopt.errors import UsageError
from onnxopt.ort_versions import (
    GQA_CAUSAL_ATTRIBUTE,
    GQA_HEAD_SINK,
    GQA_WITHOUT_PRESENT,
    OLDEST,
    installed_providers,
    installed_version,
    model_requirement,
    parse_version,
    provider_problem,
    requested_providers,
    requested_version,
)
from tests.test_cli import DEFAULT_MODEL, cli, one_error_line


@pytest.mark.parametrize(
    ("text", "version"), [("1.24", (1, 24)), (" 1.30.2 ", (1, 30)), ("2.0", (2, 0))]
)
def test_a_release_is_read_as_major_minor(text: str, version: tuple[int, int]) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1", "expected a release"),
        ("1.x", "expected a release"),
        ("1.21.1", "1.22 or newer"),
        ("1.2", "1.22 or newer"),
    ],
)
def test_a_bad_or_too_old_release_is_refused(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=re.escape(words)):
        parse_version(text)


def test_target_onnx_takes_any_release_but_not_garbage() -> None:
    assert requested_version("1.18", target="onnx") == OLDEST  # no contrib op is written
    with pytest.raises(UsageError, match="expected a release"):
        requested_version("latest", target="onnx")
    with pytest.raises(UsageError, match=re.escape("1.22 or newer")):
        requested_version("1.18", target="ort")


def test_the_default_is_the_installed_release() -> None:
    found = re.match(r"(\d+)\.(\d+)", ort.__version__)
    assert found is not None
    installed = (int(found.group(1)), int(found.group(2)))
    assert installed_version() == installed
    assert requested_version(None) == max(installed, OLDEST)


def _gqa_model(causal: int | None = 1, outputs: int = 3, sinks: bool = False) -> ir.Model:
    """One GroupQueryAttention with attention_bias; ``causal`` None leaves the attribute out."""
    names = ", ".join(["q", "", "", "", "", "seqlens", "total", "", "", "", "bias"])
    names += ", sinks" if sinks else ""
    attributes = "num_heads = 2, kv_num_heads = 2"
    attributes += f", causal = {causal}" if causal is not None else ""
    results = ", ".join(["y", "present_k", "present_v"][:outputs])
    text = f"""
        <ir_version: 9, opset_import: ["" : 18, "com.microsoft" : 1]>
        g (float[1, 4, 48] q, int32[1] seqlens, int32 total, float[1, 1, 4, 4] bias,
           float[2] sinks) => (float[1, 4, 16] y) {{
            {results} = com.microsoft.GroupQueryAttention<{attributes}>({names})
        }}
    """
    return ir.serde.deserialize_model(onnx.parser.parse_model(text))


def test_a_model_needs_the_release_of_its_newest_form() -> None:
    # attention_bias with the present outputs, causal by default: every supported release
    assert model_requirement(_gqa_model(None)) is None
    for model, release in [
        (_gqa_model(None, sinks=True), GQA_HEAD_SINK),
        (_gqa_model(None, outputs=1), GQA_WITHOUT_PRESENT),
        (_gqa_model(1), GQA_CAUSAL_ATTRIBUTE),
        (_gqa_model(0, outputs=1, sinks=True), GQA_CAUSAL_ATTRIBUTE),
    ]:
        found = model_requirement(model)
        assert found is not None and found[0] == release, (found, release)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [("--ort-version", "1.18", "1.22 or newer"), ("--ort-providers", "gpu", "'gpu': expected")],
)
def test_cli_refuses_a_runtime_target_ort_cannot_write_for(
    option: str, value: str, words: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.onnx"
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "-o", out, option, value)
    assert code == 2
    assert words in one_error_line(stderr)
    assert not out.exists()


def test_the_release_is_recorded_and_a_newer_form_already_there_is_warned_of(
    tmp_path: Path,
) -> None:
    result = api.optimize(DEFAULT_MODEL, ort_version="1.26", check=False)
    assert result.model.metadata_props["onnxopt.ort_version"] == "1.26"
    assert result.report.to_json()["ort_version"] == "1.26"
    assert (
        api.optimize(DEFAULT_MODEL, target="onnx", check=False).model.metadata_props.get(
            "onnxopt.ort_version"
        )
        is None
    )
    # causal=0 has no form before 1.30 (a causal=1 one is rewritten: test_fuse_group_query_attention)
    path = io.save_model(_gqa_model(0, outputs=1), tmp_path / "gqa.onnx")
    report = api.optimize(path, ort_version="1.26", check=False).report
    assert any(
        "needs ONNX Runtime 1.30" in w and "not run on 1.26" in w for w in report.warnings
    ), report.warnings


def test_inspect_says_which_release_a_model_needs(tmp_path: Path) -> None:
    path = io.save_model(_gqa_model(1, outputs=1), tmp_path / "gqa.onnx")
    code, stdout, _ = cli("inspect", path, "--json")
    assert code == 0
    needed = json.loads(stdout)["onnxruntime_needed"]
    assert needed["version"] == "1.30" and "GroupQueryAttention" in needed["why"]
    code, stdout, _ = cli("inspect", path)
    assert code == 0 and "needs ONNX Runtime 1.30 or newer" in stdout
    code, stdout, _ = cli("inspect", DEFAULT_MODEL, "--json")
    assert code == 0 and json.loads(stdout)["onnxruntime_needed"] is None


def test_providers_are_read_and_checked() -> None:
    assert requested_providers("CUDA, cpu") == ("cpu", "cuda")
    assert requested_providers("cuda") == ("cuda",)
    assert requested_providers(None) == installed_providers()
    for bad in ("gpu", "", "cpu,tensorrt"):
        with pytest.raises(UsageError, match="expected cpu, cuda or cpu,cuda"):
            requested_providers(bad)


def _fused_conv(activation: str) -> ir.Node:
    return ir.node("FusedConv", [], {"activation": activation}, domain="com.microsoft")


def test_what_cuda_cannot_run() -> None:
    cuda = ("cpu", "cuda")
    assert provider_problem(_fused_conv("Relu"), cuda) is None
    found = provider_problem(_fused_conv("Sigmoid"), cuda)
    assert found is not None and "FusedConv with activation Sigmoid" in found
    assert provider_problem(_fused_conv("Sigmoid"), ("cpu",)) is None
    gqa = next(n for n in _gqa_model(None).graph if n.op_type == "GroupQueryAttention")
    found = provider_problem(gqa, cuda)
    assert found is not None and "float32 GroupQueryAttention" in found
    # what ORT's own CPU optimizer saves: left to the CPU provider, or not CUDA's at all
    gemm = ir.node("FusedGemm", [], {"activation": "Relu"}, domain="com.microsoft")
    found = provider_problem(gemm, cuda)
    assert found is not None and "FusedGemm" in found
    reorder = ir.node("ReorderInput", [], domain="com.microsoft.nchwc")
    found = provider_problem(reorder, cuda)
    assert found is not None and "NCHWc" in found
    assert provider_problem(reorder, ("cpu",)) is None


def test_the_providers_are_recorded_and_a_gqa_cuda_lacks_is_warned_of(tmp_path: Path) -> None:
    result = api.optimize(DEFAULT_MODEL, ort_providers="cpu,cuda", check=False)
    assert result.model.metadata_props["onnxopt.ort_providers"] == "cpu,cuda"
    assert list(result.report.to_json()["ort_providers"]) == ["cpu", "cuda"]
    path = io.save_model(_gqa_model(None), tmp_path / "gqa.onnx")
    report = api.optimize(path, ort_providers="cuda", check=False).report
    assert any(
        "float32 GroupQueryAttention" in w and "it is for cuda" in w for w in report.warnings
    ), report.warnings


def test_inspect_says_what_cuda_would_refuse(tmp_path: Path) -> None:
    text = """
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[1, 3, 8, 8] x, float[4, 3, 3, 3] w) => (float[1, 4, 6, 6] y) {
            y = com.microsoft.FusedConv <kernel_shape = [3, 3], activation = "Sigmoid"> (x, w)
        }
    """
    path = tmp_path / "fused.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    code, stdout, _ = cli("inspect", path, "--json")
    assert code == 0 and "FusedConv with activation Sigmoid" in json.loads(stdout)["cuda_problem"]
    code, stdout, _ = cli("inspect", path)
    assert code == 0 and "not for CUDA as it is" in " ".join(stdout.split())
    code, stdout, _ = cli("inspect", DEFAULT_MODEL, "--json")
    assert code == 0 and json.loads(stdout)["cuda_problem"] is None
