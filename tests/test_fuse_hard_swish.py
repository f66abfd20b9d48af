"""fuse-hard-swish: hand-written relu6(x + 3) / 6 -> HardSigmoid, x * relu6(x + 3) / 6 -> HardSwish."""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxopt
from onnxopt.passes.fuse_hard_swish import SIXTH, FuseHardSwishPass
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

SWISH = "x*relu6(x+3)/6->HardSwish ({})"
SIGMOID = "relu6(x+3)/6->HardSigmoid ({})"
GATED = "x*HardSigmoid(x)->HardSwish"
CONSTANTS = (
    "<float three = {3.0}, float zero = {0.0}, float six = {6.0}, float sixth = {0.16666667}>"
)
IO = {"inputs": "float[N,3,4] x", "outputs": "float[N,3,4] y"}


@pytest.mark.parametrize(
    ("body", "stats", "ops"),
    [
        # x * F.relu6(x + 3) / 6 (timm's hard_swish, YOLOv5's export-friendly Hardswish)
        (
            "{ a = Add(x, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n h = Div(m, six)\n y = Relu(h) }",
            {SWISH.format("Div"): 1},
            ["HardSwish", "Relu"],
        ),
        # x * (x + 3).clamp(0, 6) * (1 / 6), the constant first
        (
            "{ a = Add(three, x)\n c = Clip(a, zero, six)\n m = Mul(c, x)\n h = Mul(sixth, m)\n y = Relu(h) }",
            {SWISH.format("Mul"): 1},
            ["HardSwish", "Relu"],
        ),
        # x * (relu6(x + 3) / 6): the hard-sigmoid first, then the gate (MobileNetV3's h_swish)
        (
            "{ a = Add(x, three)\n c = Clip(a, zero, six)\n s = Div(c, six)\n h = Mul(x, s)\n y = Relu(h) }",
            {SIGMOID.format("Div"): 1, GATED: 1},
            ["HardSwish", "Relu"],
        ),
        # relu6(x + 3) / 6 alone (the squeeze-excite gate)
        (
            "{ a = Add(x, three)\n c = Clip(a, zero, six)\n h = Div(c, six)\n y = Relu(h) }",
            {SIGMOID.format("Div"): 1},
            ["HardSigmoid", "Relu"],
        ),
        # relu6(z) / 6: a Conv's bias took the 3
        (
            "{ c = Clip(x, zero, six)\n h = Mul(c, sixth)\n y = Relu(h) }",
            {SIGMOID.format("Mul"): 1},
            ["HardSigmoid", "Relu"],
        ),
    ],
    ids=["div", "mul-sixth", "gated", "hard-sigmoid", "relu6-sixth"],
)
def test_hand_written_forms_fuse(body: str, stats: dict[str, int], ops: list[str]) -> None:
    assert_rewrites(FuseHardSwishPass, model(CONSTANTS + body, opset=14, **IO), stats, ops, 2)


def test_below_opset_14_the_swish_is_a_gated_hard_sigmoid() -> None:
    body = "{ a = Add(x, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n h = Div(m, six)\n y = Relu(h) }"
    fused = assert_rewrites(
        FuseHardSwishPass,
        model(CONSTANTS + body, opset=13, **IO),
        {SWISH.format("Div"): 1},
        ["HardSigmoid", "Mul", "Relu"],
        2,
    )
    gate = fused.graph.node(0)
    assert gate.attributes.get_float("alpha") == SIXTH and gate.attributes.get_float("beta") == 0.5


def test_clip_with_attribute_bounds_below_opset_11() -> None:
    body = (
        "{ a = Add(x, three)\n c = Clip<min = 0.0, max = 6.0>(a)\n h = Div(c, six)\n y = Relu(h) }"
    )
    assert_rewrites(
        FuseHardSwishPass,
        model(CONSTANTS + body, opset=10, **IO),
        {SIGMOID.format("Div"): 1},
        ["HardSigmoid", "Relu"],
        2,
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "{ a = Add(x, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n h = Div(m, six)\n y = Add(h, c) }",
            "a partial result of the hard-swish has other users",
        ),
        (
            "{ a = Add(x, three)\n c = Clip(a, zero, six)\n h = Div(c, six)\n y = Add(h, c) }",
            "the clipped value has other users",
        ),
    ],
    ids=["swish-clip-shared", "sigmoid-clip-shared"],
)
def test_shared_partial_results_are_explained(body: str, reason: str) -> None:
    assert_refuses(FuseHardSwishPass, model(CONSTANTS + body, opset=14, **IO), reason)


@pytest.mark.parametrize(
    "body",
    [
        # other constants: not the hard-sigmoid's 3, 0, 6
        "{ a = Add(x, five)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n y = Div(m, six) }",
        "{ a = Add(x, three)\n c = Clip(a, zero, five)\n m = Mul(x, c)\n y = Div(m, six) }",
        "{ a = Add(x, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n y = Div(m, five) }",
        "{ a = Add(x, three)\n c = Clip(a, zero, six)\n y = Mul(c, fifth) }",
        # the gate of another value than the one it multiplies
        "{ r = Relu(x)\n a = Add(r, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n y = Div(m, six) }",
        # a [1, 1, 1, 1] constant raises a rank-3 x to rank 4
        "{ a = Add(x, three)\n c = Clip(a, zero, six)\n y = Div(c, six4) }",
    ],
    ids=["add-5", "clip-5", "div-5", "mul-fifth", "other-x", "rank-raising"],
)
def test_near_misses_stay(body: str) -> None:
    constants = (
        CONSTANTS[:-1] + ", float five = {5.0}, float fifth = {0.2}, float[1,1,1,1] six4 = {6.0}>"
    )
    outputs = "float[1,N,3,4] y" if "six4" in body else "float[N,3,4] y"
    text = model(constants + body, inputs="float[N,3,4] x", outputs=outputs, opset=14)
    result = FuseHardSwishPass()(load(text))
    assert not result.modified, result.stats
    assert not {"HardSwish", "HardSigmoid"} & set(op_types(result.model))


def _hand_written_mobilenet_v3(exporter: str, path: Path) -> None:
    """A MobileNetV3 block as it was written before nn.Hardswish (d-li14/mobilenetv3.pytorch's
    h_sigmoid and h_swish): expand, depthwise, squeeze-excite with the hard-sigmoid gate, project."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)

    class HSigmoid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.relu = nn.ReLU6()

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.relu(x + 3) / 6

    class HSwish(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sigmoid = HSigmoid()

        def forward(self, x):  # type: ignore[no-untyped-def]
            return x * self.sigmoid(x)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.expand = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), HSwish())
            self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), HSwish())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.excite = nn.Sequential(
                nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1), HSigmoid()
            )
            self.project = nn.Conv2d(16, 8, 1)

        def forward(self, x):  # type: ignore[no-untyped-def]
            y = self.depthwise(self.expand(x))
            y = y * self.excite(self.pool(y))
            return x + self.project(y)

    module = Block().eval()
    with torch.no_grad():  # not the identity statistics of a fresh BatchNorm
        module.expand[1].running_mean.uniform_(-1, 1)
        module.expand[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 8, 16, 16)
    if exporter == "torchscript":
        torch.onnx.export(module, (x,), str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch", 2: "h", 3: "w"}}, opset_version=17)  # fmt: skip
        return
    dims = {0: torch.export.Dim("batch"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")}
    program = torch.onnx.export(
        module, (x,), dynamo=True, input_names=["x"], dynamic_shapes=(dims,)
    )
    assert program is not None
    program.save(str(path))


@pytest.mark.torch
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_hand_written_mobilenet_v3_block(exporter: str, tmp_path: Path) -> None:
    path = tmp_path / "block.onnx"
    _hand_written_mobilenet_v3(exporter, path)
    result = onnxopt.optimize(path)
    assert result.report.validation is not None and result.report.validation.passed
    ops = op_types(result.model)
    assert ops.count("HardSwish") == 2, ops
    # the squeeze-excite gate's hard-sigmoid went into its Conv
    fused = [node for node in result.model.graph if node.op_type == "FusedConv"]
    activations = [node.attributes.get_string("activation") for node in fused]
    assert "HardSigmoid" in activations, activations
    assert "Clip" not in ops and "Div" not in ops, ops
    again = onnxopt.optimize(result.model, check=False)
    assert op_types(again.model) == ops
