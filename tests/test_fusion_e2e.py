"""End to end: export small PyTorch models, optimize at the default level, check fusions and numerics."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from onnxopt.api import TARGET_METADATA_KEY, optimize  # noqa: E402

pytestmark = pytest.mark.torch


def _export(
    module, args, path: Path, dynamo: bool, names: list[str], dynamic: dict[str, dict[int, str]]
) -> Path:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            shapes = {
                n: {axis: torch.export.Dim.AUTO for axis in axes} for n, axes in dynamic.items()
            }
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                dynamic_shapes=shapes,
                dynamo=True,
                verbose=False,
            )
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                dynamic_axes=dynamic,
                opset_version=17,
                dynamo=False,
            )
    return path


class TinyCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(
            nn.ZeroPad2d(1), nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(2)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6())
        self.up = nn.Sequential(
            nn.ConvTranspose2d(8, 4, 2, stride=2), nn.BatchNorm2d(4), nn.Sigmoid()
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5), nn.BatchNorm1d(5)
        )

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.head(self.up(self.block(self.pool(self.stem(x)))))


def _randomize_bn(module) -> None:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(0)
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=generator))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=generator) + 0.5)
            layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=generator))


@pytest.mark.parametrize("dynamo", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tiny_cnn(tmp_path: Path, dynamo: bool) -> None:
    torch.manual_seed(0)
    model = TinyCnn().eval()
    with torch.no_grad():
        _randomize_bn(model)
    path = _export(
        model,
        (torch.randn(2, 3, 16, 16),),
        tmp_path / "cnn.onnx",
        dynamo,
        ["x"],
        {"x": {0: "batch"}},
    )
    result = optimize(path)
    assert result.validated, result.report.validation
    ops = result.report.after.op_counts
    assert "BatchNormalization" not in ops
    assert "Pad" not in ops  # TorchScript computes the pads at run time: folded first, then fused
    assert ops.get("com.microsoft::FusedConv") == 2  # Conv+Relu, Conv+Clip (ReLU6)
    assert result.model.metadata_props[TARGET_METADATA_KEY] == "ort"
    portable = optimize(path, target="onnx")
    assert portable.validated
    assert not any(op.startswith("com.microsoft") for op in portable.report.after.op_counts)


class BertWrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        self.inner = BertModel(config)

    def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state


def _export_tiny_bert(tmp_path: Path, dynamo: bool, *, trained_like: bool = False) -> Path:
    """BertWrapper exported with dynamic batch and sequence; ``trained_like``: every parameter
    whose elements are all equal (zero biases, unit LayerNorm scales) perturbed first."""
    pytest.importorskip("transformers")
    from onnxopt.zoo._common import perturb_constant_parameters

    torch.manual_seed(0)
    model = BertWrapper().eval()
    if trained_like:
        perturb_constant_parameters(model)
    args = (torch.randint(0, 100, (2, 7)), torch.ones(2, 7, dtype=torch.int64))
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return _export(
        model, args, tmp_path / "bert.onnx", dynamo, ["input_ids", "attention_mask"], dynamic
    )


@pytest.mark.parametrize("dynamo", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tiny_bert(tmp_path: Path, dynamo: bool) -> None:
    path = _export_tiny_bert(tmp_path, dynamo)
    result = optimize(path)
    assert result.validated, result.report.validation
    assert len(result.report.validation.trials) >= 2  # type: ignore[union-attr]
    ops = result.report.after.op_counts
    # SkipLayerNormalization is opt-in (slower kernel on ORT CPU); Gelu is fused (TorchScript at
    # opset 17: com.microsoft Gelu) or exported natively (dynamo, opset 18+ / 20+). No BiasGelu:
    # transformers initializes Linear biases to zero, so the bias Add folds away first.
    assert "Erf" not in ops
    assert ops.get("com.microsoft::Gelu", 0) + ops.get("Gelu", 0) == 2 or dynamo
    assert "com.microsoft::SkipLayerNormalization" not in ops
    # Masked attention with its Q/K/V projections: one packed Attention per layer (the dynamo
    # export reads T off the attention mask and writes d as a constant in its key reshapes).
    assert ops.get("com.microsoft::Attention") == 2, ops
    assert "com.microsoft::MultiHeadAttention" not in ops
    portable = optimize(path, target="onnx")
    assert portable.validated
    assert not any(op.startswith("com.microsoft") for op in portable.report.after.op_counts)


@pytest.mark.parametrize("dynamo", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tiny_bert_with_trained_like_weights(tmp_path: Path, dynamo: bool) -> None:
    """Non-zero biases and non-unit LayerNorm scales (as a checkpoint has): the bias paths of the
    attention fusion (MultiHeadAttention's bias input) and of Gelu are exercised, with padding."""
    path = _export_tiny_bert(tmp_path, dynamo, trained_like=True)
    result = optimize(path)
    assert result.validated, result.report.validation
    ops = result.report.after.op_counts
    assert (
        ops.get("com.microsoft::MultiHeadAttention", 0) + ops.get("com.microsoft::Attention", 0)
        == 2
    ), ops
    assert "Softmax" not in ops and "Erf" not in ops
    # every bias survives somewhere: nothing in the graph is a zero that could be dropped
    assert ops.get("Add", 0) >= 4, ops


class LlamaWrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        self.inner = LlamaModel(config)

    def forward(self, input_ids):  # type: ignore[no-untyped-def]
        return self.inner(input_ids=input_ids, use_cache=False).last_hidden_state


@pytest.mark.slow
def test_tiny_llama_rms_norm(tmp_path: Path) -> None:
    """TorchScript cannot export current LLaMA (aten::diff), so only the dynamo export is tested."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    args = (torch.randint(0, 100, (2, 7)),)
    path = _export(
        LlamaWrapper().eval(),
        args,
        tmp_path / "llama.onnx",
        True,
        ["input_ids"],
        {"input_ids": {0: "b", 1: "s"}},
    )
    result = optimize(path)
    assert result.validated, result.report.validation
    ops = result.report.after.op_counts
    assert ops.get("SimplifiedLayerNormalization") == 5  # 2 per layer and the final norm
    assert "Pow" not in ops and "ReduceMean" not in ops


def test_tiny_convnext_bias_gelu_and_channels_last_residual(tmp_path: Path) -> None:
    """The zoo's ConvNeXt (depths 1-1): each block's Linear + GELU becomes MatMul + BiasGelu, and
    the first stage's residual Add runs channels-last, so its last Transpose cancels the
    downsampling LayerNorm's (8 -> 6 Transposes; ORT's transformer optimizer does the same)."""
    from onnxopt.zoo.vision import convnext_tiny_tiny

    module, inputs, dynamic = convnext_tiny_tiny()
    path = _export(
        module,
        tuple(inputs.values()),
        tmp_path / "convnext.onnx",
        False,
        list(inputs),
        dict(dynamic),
    )
    result = optimize(path)
    assert result.validated, result.report.validation
    before, after = result.report.before.op_counts, result.report.after.op_counts
    assert (before["Transpose"], after["Transpose"]) == (8, 6)
    assert after["com.microsoft::BiasGelu"] == 2
    assert "Gelu" not in after and "Erf" not in after
    portable = optimize(path, target="onnx")
    assert portable.validated
    assert portable.report.after.op_counts["Transpose"] == 6
    assert not any(op.startswith("com.microsoft") for op in portable.report.after.op_counts)
