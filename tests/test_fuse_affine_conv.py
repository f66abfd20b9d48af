"""fuse-affine-conv: a per-channel affine that a Conv reads -> the Conv's weights and bias."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import onnxopt
from onnxopt.passes.fuse_affine_conv import FuseAffineConvPass, FuseAffineMatMulPass
from onnxopt.passes.options import PassOptions
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

RULE = "affine+conv->conv"
W = "float[4,4,1,1] w = {1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0}"
W3 = "float[4,2,3,3] w3 = {" + ", ".join(f"{(i * 7 % 11 - 5) / 8}" for i in range(72)) + "}"
IO = {"inputs": "float[N,4,6,5] x", "outputs": "float[N,4,6,5] y"}
VALID = {"inputs": "float[N,4,6,5] x", "outputs": "float[N,4,4,3] y"}
A = "float[4,1,1] a = {1.5, 0.5, 2.0, -1.0}"
B = "float[1,4,1,1] b = {0.1, 0.2, 0.3, 0.4}"
BN = (
    "float[4] g = {1.5, 0.5, 2.0, -1.0}, float[4] beta = {0.1, 0.2, 0.3, 0.4}, "
    "float[4] mu = {0.5, -0.5, 0.25, 0.0}, float[4] var = {1.0, 2.0, 0.5, 4.0}"
)


@pytest.mark.parametrize(
    ("constants", "body", "io", "ops"),
    [
        # PP-LCNetV3's learnable affine block after an activation, read by a pointwise Conv
        (
            f"{W}, float s = {{1.5}}, float t = {{-0.25}}",
            "r = Relu(x)\n m = Mul(r, s)\n h = Add(m, t)\n y = Conv(h, w)",
            IO,
            ["Relu", "Conv"],
        ),
        # per-channel, constants first, into an unpadded grouped 3x3 Conv with a bias
        (
            f"{W3}, {A}, {B}, float[4] cb = {{1.0, 2.0, 3.0, 4.0}}",
            "r = Relu(x)\n m = Mul(a, r)\n h = Add(b, m)\n y = Conv <group = 2> (h, w3, cb)",
            VALID,
            ["Relu", "Conv"],
        ),
        # a pre-activation BatchNormalization
        (
            f"{W}, {BN}",
            "r = Relu(x)\n h = BatchNormalization(r, g, beta, mu, var)\n y = Conv(h, w)",
            IO,
            ["Relu", "Conv"],
        ),
        # an input normalization on the graph input, subtracted the other way round
        (
            f"{W}, {A}, {B}",
            "s = Sub(b, x)\n h = Div(s, a)\n y = Conv(h, w)",
            IO,
            ["Conv"],
        ),
        # a padded Conv takes the scale; the shift before it stays
        (
            f"{W3}, {A}, {B}",
            "s = Sub(x, b)\n h = Div(s, a)\n y = Conv <group = 2, pads = [1, 1, 1, 1]> (h, w3)",
            IO,
            ["Sub", "Conv"],
        ),
        # SAME padding with a 1-wide window pads nothing
        (
            f"{W}, {A}, {B}",
            'm = Mul(x, a)\n h = Add(m, b)\n y = Conv <auto_pad = "SAME_UPPER"> (h, w)',
            IO,
            ["Conv"],
        ),
    ],
    ids=["scalar-lab", "grouped-valid", "batch-norm", "input-normalization", "padded", "same-1x1"],
)
def test_affines_fold_into_the_conv_they_feed(
    constants: str, body: str, io: dict[str, str], ops: list[str]
) -> None:
    assert_rewrites(
        FuseAffineConvPass, model(f"<{constants}> {{ {body} }}", **io), {RULE: 1}, ops, 2
    )


def test_a_one_dimensional_conv() -> None:
    text = model(
        "<float[3,4,1] w = {1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5}, "
        "float[4,1] a = {1.5, 0.5, 2.0, -1.0}, float b = {0.5}> "
        "{ r = Relu(x)\n m = Mul(r, a)\n h = Add(m, b)\n y = Conv(h, w) }",
        inputs="float[N,4,T] x",
        outputs="float[N,3,T] y",
    )
    assert_rewrites(FuseAffineConvPass, text, {RULE: 1}, ["Relu", "Conv"], 2)


def test_folded_weights_are_the_affine_applied_to_the_conv() -> None:
    text = model(
        f"<{W3}, {A}, {B}> {{ r = Relu(x)\n m = Mul(r, a)\n h = Add(m, b)\n"
        " y = Conv <group = 2> (h, w3) }",
        **VALID,
    )
    fused = FuseAffineConvPass()(load(text)).model
    conv = next(node for node in fused.graph if node.op_type == "Conv")
    weight, bias = (np.asarray(v.const_value.numpy()) for v in conv.inputs[1:3])  # type: ignore[union-attr]
    w3 = np.array([(i * 7 % 11 - 5) / 8 for i in range(72)], np.float64).reshape(4, 2, 3, 3)
    a, b = np.array([1.5, 0.5, 2.0, -1.0]), np.array([0.1, 0.2, 0.3, 0.4])
    groups = np.array([[0, 1], [0, 1], [2, 3], [2, 3]])  # the input channels each output reads
    np.testing.assert_allclose(weight, w3 * a[groups][:, :, None, None], rtol=1e-7)
    np.testing.assert_allclose(
        bias, (w3 * b[groups][:, :, None, None]).sum(axis=(1, 2, 3)), rtol=1e-6
    )


@pytest.mark.parametrize(
    ("body", "io", "reason"),
    [
        (
            "h = Add(x, b)\n y = Conv <group = 2, pads = [1, 1, 1, 1]> (h, w3)",
            IO,
            "the Conv pads with zeros",
        ),
        (
            "m = Mul(x, a)\n h = Add(m, b)\n c = Conv <group = 2> (h, w3)\n p = Pad(c, p4)\n"
            " y = Add(p, h)",
            IO,
            "the Add's output has other users",
        ),
        (
            "h = Mul(x, grid)\n y = Conv <group = 2> (h, w3)",
            VALID,
            "is not per-channel",
        ),
        (
            "h = Div(x, z)\n y = Conv <group = 2> (h, w3)",
            VALID,
            "the Div's divisor has a zero",
        ),
        # a one-channel activation that a four-channel constant broadcasts up to the Conv's four
        (
            "h = Mul(x1, a)\n y = Conv <group = 2> (h, w3)",
            {"inputs": "float[N,1,6,5] x1", "outputs": "float[N,4,4,3] y"},
            "not known to be rank 4 with 4 channels",
        ),
    ],
    ids=["padded-shift", "shared", "spatial-constant", "div-zero", "broadcast"],
)
def test_affines_it_leaves_are_explained(body: str, io: dict[str, str], reason: str) -> None:
    constants = (
        f"{W3}, {A}, {B}, float[4,1,1] z = {{1.0, 0.0, 2.0, 1.0}}, float[1,1,6,5] grid = {{"
        + ", ".join(str(i / 10) for i in range(30))
        + "}, int64[8] p4 = {0, 0, 1, 1, 0, 0, 1, 1}"
    )
    assert_refuses(FuseAffineConvPass, model(f"<{constants}> {{ {body} }}", **io), reason)


def test_a_shared_weight_is_kept_unless_the_file_may_grow() -> None:
    text = model(
        f"<{W}, {A}, {B}> {{ m = Mul(x, a)\n h = Add(m, b)\n c = Conv(h, w)\n y = Conv(c, w) }}",
        **IO,
    )
    assert_refuses(FuseAffineConvPass, text, "is shared with 1 other node")
    result = FuseAffineConvPass(PassOptions(fold_may_grow=True))(load(text))
    assert result.stats == {RULE: 1} and op_types(result.model) == ["Conv", "Conv"]


def _lcnet_block(exporter: str, path: Path) -> None:
    """A PP-LCNetV3-style block (depthwise, pointwise, each with BatchNorm, hard-swish and a
    learnable affine), after an input normalization, as a torch user writes it."""
    torch = pytest.importorskip("torch")
    from onnxopt.export import Exportable, _export_dynamo, _export_torchscript

    nn = torch.nn
    torch.manual_seed(0)

    class Affine(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor([1.25]))
            self.bias = nn.Parameter(torch.tensor([-0.1]))

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.scale * x + self.bias

    def unit(cin: int, cout: int, k: int, groups: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.Hardswish(),
            Affine(),
        )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
            self.stem = unit(3, 8, 3, 1)
            self.blocks = nn.Sequential(unit(8, 8, 3, 8), unit(8, 16, 1, 1), unit(16, 16, 5, 16))
            self.head = nn.Conv2d(16, 4, 1)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.head(self.blocks(self.stem((x - self.mean) / self.std)))

    module = Net().eval()
    with torch.no_grad():  # trained-like statistics, not a fresh BatchNorm's identity
        for layer in module.modules():
            if isinstance(layer, nn.BatchNorm2d):
                layer.running_mean.uniform_(-1, 1)
                layer.running_var.uniform_(0.5, 2)
    axes = {"x": {0: "batch", 2: "h", 3: "w"}}
    model = Exportable("lcnet block", module, {"x": torch.rand(2, 3, 16, 16)}, axes)
    run, opset = (_export_torchscript, 17) if exporter == "torchscript" else (_export_dynamo, None)
    run(model, path, ["y"], opset, True, False)


@pytest.mark.torch
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_an_lcnet_block_folds_its_affines(exporter: str, target: str, tmp_path: Path) -> None:
    path = tmp_path / "lcnet.onnx"
    _lcnet_block(exporter, path)
    result = onnxopt.optimize(path, target=target)
    assert result.report.validation is not None and result.report.validation.passed
    ops = op_types(result.model)
    # the normalization's Div and the affines before the pointwise Convs folded; the shifts
    # before the padded stem and depthwise Convs stay (a depthwise Conv for ort)
    assert ops.count("Div") == 0 and ops.count("Sub") == 1, ops
    totals = {name: stats for name, _, _, stats in result.report.pass_totals()}
    # the normalization's Div, the affines before the pointwise Conv and before the head
    assert totals["fuse-affine-conv"] == {RULE: 3}, totals["fuse-affine-conv"]
    again = onnxopt.optimize(result.model, check=False, target=target)
    assert op_types(again.model) == ops


PRODUCT = {"inputs": "float[N,4] x", "outputs": "float[N,3] y"}
G = "float[3,4] gw = {1.0, 0.5, -1.0, 0.25, 0.0, 2.0, 0.5, -0.5, 1.5, 0.0, 1.0, 1.0}"
M = "float[4,3] mw = {1.0, 0.5, -1.0, 0.25, 0.0, 2.0, 0.5, -0.5, 1.5, 0.0, 1.0, 1.0}"
VEC = "float[4] va = {1.5, 0.5, 2.0, -1.0}, float[1,4] vb = {0.1, 0.2, 0.3, 0.4}"


@pytest.mark.parametrize(
    ("constants", "body", "io", "stats", "ops"),
    [
        # a tabular MLP's BatchNorm1d after the activation, before the next Linear
        (
            f"{G}, {BN}, float[3] gc = {{1.0, 2.0, 3.0}}",
            "r = Relu(x)\n h = BatchNormalization(r, g, beta, mu, var)\n"
            " y = Gemm <transB = 1> (h, gw, gc)",
            PRODUCT,
            {"affine+gemm->gemm": 1},
            ["Relu", "Gemm"],
        ),
        # an input standardization into a Gemm with alpha and beta and no transpose
        (
            f"{M}, {VEC}, float[1,3] gc = {{1.0, 2.0, 3.0}}",
            "s = Sub(x, vb)\n h = Div(s, va)\n y = Gemm <alpha = 0.5, beta = 2.0> (h, mw, gc)",
            PRODUCT,
            {"affine+gemm->gemm": 1},
            ["Gemm"],
        ),
        # a rank-3 activation, the shift joining the Linear's bias Add
        (
            f"{M}, {VEC}, float[3] mb = {{1.0, 2.0, 3.0}}",
            "r = Relu(x)\n m = Mul(r, va)\n h = Add(m, vb)\n p = MatMul(h, mw)\n y = Add(p, mb)",
            {"inputs": "float[N,S,4] x", "outputs": "float[N,S,3] y"},
            {"affine+matmul->matmul": 1},
            ["Relu", "MatMul", "Add"],
        ),
        # no bias to join: an Add of the shift's image replaces the two affine ops
        (
            f"{M}, {VEC}",
            "m = Mul(x, va)\n h = Sub(vb, m)\n y = MatMul(h, mw)",
            PRODUCT,
            {"affine+matmul->matmul": 1},
            ["MatMul", "Add"],
        ),
        # TorchScript's addmm on a flattened view: the affine folds through the Reshape, which
        # stays (fuse-matmul makes Reshape + Gemm a MatMul later; before, a second run folded it)
        (
            f"{G}, {VEC}, float[3] gc = {{1.0, 2.0, 3.0}}, int64[2] flat = {{-1, 4}}",
            "m = Mul(x, va)\n h = Add(m, vb)\n f = Reshape(h, flat)\n"
            " y = Gemm <transB = 1> (f, gw, gc)",
            {"inputs": "float[N,S,4] x", "outputs": "float[M,3] y"},
            {"affine+gemm->gemm": 1},
            ["Reshape", "Gemm"],
        ),
        # the same into a MatMul with its bias Add, the view splitting the rows instead
        (
            f"{M}, {VEC}, float[3] mb = {{1.0, 2.0, 3.0}}, int64[3] rows = {{1, -1, 4}}",
            "m = Mul(x, va)\n f = Reshape(m, rows)\n p = MatMul(f, mw)\n y = Add(p, mb)",
            {"inputs": "float[N,4] x", "outputs": "float[1,N,3] y"},
            {"affine+matmul->matmul": 1},
            ["Reshape", "MatMul", "Add"],
        ),
    ],
    ids=[
        "batch-norm-gemm",
        "standardize-gemm",
        "matmul-bias",
        "matmul-no-bias",
        "through-flatten",
        "through-split-rows",
    ],
)
def test_affines_fold_into_the_product_they_feed(
    constants: str, body: str, io: dict[str, str], stats: dict[str, int], ops: list[str]
) -> None:
    text = model(f"<{constants}> {{ {body} }}", **io)
    assert_rewrites(FuseAffineMatMulPass, text, stats, ops, 2)


@pytest.mark.parametrize(
    ("body", "io", "reason"),
    [
        ("h = Add(x, vb)\n y = MatMul(h, mw)", PRODUCT, "the shift would need an Add of its own"),
        (
            "h = BatchNormalization(x, g, beta, mu, var)\n y = MatMul(h, mw)",
            {"inputs": "float[N,4,4] x", "outputs": "float[N,4,3] y"},
            "normalizes axis 1, the product reads axis 2",
        ),
        (
            "h = Mul(x, va)\n y = Gemm <transA = 1> (h, mw)",
            {"inputs": "float[4,N] x", "outputs": "float[N,3] y"},
            "transA=1",
        ),
        ("h = Mul(x, va)\n y = MatMul(h, x4)", PRODUCT, "weight is not a constant"),
    ],
    ids=["lone-shift", "batch-norm-axis", "trans-a", "no-weight"],
)
def test_product_affines_it_leaves_are_explained(
    body: str, io: dict[str, str], reason: str
) -> None:
    inputs = io["inputs"] + (", float[4,3] x4" if "x4" in body else "")
    text = model(f"<{M}, {VEC}, {BN}> {{ {body} }}", inputs=inputs, outputs=io["outputs"])
    assert_refuses(FuseAffineMatMulPass, text, reason)


@pytest.mark.parametrize(
    "shape",
    ["int64[2] flat = {-1, 2}", "int64[3] flat = {-1, 2, 2}"],
    ids=["last-dim-split", "last-dim-moved"],
)
def test_a_reshape_that_moves_features_stops_the_fold(shape: str) -> None:
    """Only a Reshape that keeps the last dim keeps each element's feature index."""
    text = model(
        f"<{VEC}, {shape}, float[2,3] w2 = {{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}}> "
        "{ m = Mul(x, va)\n f = Reshape(m, flat)\n y = MatMul(f, w2) }",
        inputs="float[N,4] x",
        outputs="float[M,3] y" if "{-1, 2}" in shape else "float[M,2,3] y",
    )
    result = FuseAffineMatMulPass()(load(text))
    assert not result.modified, result.stats


def test_a_weight_over_the_fold_limit_stays() -> None:
    text = model(f"<{M}, {VEC}> {{ h = Mul(x, va)\n y = MatMul(h, mw) }}", **PRODUCT)
    result = FuseAffineMatMulPass(PassOptions(fold_limit_bytes=16, explain=True))(load(text))
    assert not result.modified
    assert any("over the fold limit" in note for note in result.notes), result.notes


@pytest.mark.torch
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_tabular_mlp_folds_its_batch_norms(exporter: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from onnxopt.export import export

    path = tmp_path / "tabular.onnx"
    export("benchmarks.hand_written:tabular_mlp_tiny", path, exporter=exporter)  # type: ignore[arg-type]
    result = onnxopt.optimize(path)
    assert result.report.validation is not None and result.report.validation.passed
    assert op_types(result.model) == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    again = onnxopt.optimize(result.model, check=False)
    assert op_types(again.model) == op_types(result.model)
