from __future__ import annotations

import numpy as np
import pytest

from onnxopt.passes.fuse_pad import FusePadPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

PAD_OP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 3, H, W] y) {{
    pads = Constant <value = int64[8] {{0, 0, 1, 2, 0, 0, 2, 1}}> ()
    p = Pad (x, pads{value})
    y = {op}
}}
"""


def _model(op: str, value: float | None = None):  # type: ignore[no-untyped-def]
    arrays = {"w": rng_array(3, 3, 3, 3)}
    if value is not None:
        arrays["v"] = np.float32(value)
    return parse(PAD_OP.format(op=op, value=", v" if value is not None else ""), **arrays)


@pytest.mark.parametrize(
    ("op", "value", "rule"),
    [
        ("Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (p, w)", None, "pad+conv->conv"),
        ("AveragePool <kernel_shape = [3, 3]> (p)", 0.0, "pad+averagepool->averagepool"),
        (
            "MaxPool <kernel_shape = [3, 3], strides = [2, 2]> (p)",
            float("-inf"),
            "pad+maxpool->maxpool",
        ),
    ],
)
def test_pad_folds(op: str, value: float | None, rule: str) -> None:
    result = run_checked(FusePadPass(), _model(op, value))
    assert result.stats == {rule: 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == [op.split()[0]]


@pytest.mark.parametrize(
    ("op", "value", "reason"),
    [
        ("Conv <kernel_shape = [3, 3]> (p, w)", 1.0, "Pad value 1.0 is not 0"),
        (
            "MaxPool <kernel_shape = [3, 3]> (p)",
            0.0,
            "Pad value 0.0 is not -inf, which MaxPool's padding means",
        ),
        (
            "AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (p)",
            0.0,
            "AveragePool excludes its own padding from the average but would include the Pad's",
        ),
    ],
)
def test_pad_not_folded(op: str, value: float, reason: str) -> None:
    result = FusePadPass(PassOptions(explain=True))(_model(op, value))
    assert not result.modified
    assert [n.split(": ", 2)[2] for n in result.notes] == [reason]


# tf2onnx's Conv1D with explicit padding: the 1-D input padded, unsqueezed, a 2-D Conv of height 1
CONV1D_PAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 10] x) => (float[N, 4, 1, L] y) {{
    pads = Constant <value = int64[6] {{0, 0, {begin}, 0, 0, 2}}> ()
    p = Pad (x, pads)
    axes = Constant <value = int64[1] {{{axis}}}> ()
    u = Unsqueeze (p, axes)
    y = Conv <kernel_shape = [1, 3]> (u, w)
}}
"""


def test_pad_before_an_unsqueeze_folds_into_the_conv() -> None:
    model = parse(CONV1D_PAD.format(begin=1, axis=2), w=rng_array(4, 3, 1, 3))
    result = run_checked(FusePadPass(), model)
    assert result.stats == {"pad+conv->conv": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == ["Unsqueeze", "Conv"]
    (conv,) = [n for n in result.model.graph if n.op_type == "Conv"]
    assert list(conv.attributes.get_ints("pads")) == [0, 1, 0, 2]


def test_pad_before_an_unsqueeze_of_the_channel_axis_stays() -> None:
    # the Unsqueeze inserts the channel axis: the input's channels become a spatial axis
    text = CONV1D_PAD.format(begin=1, axis=1).replace("[1, 3]", "[3, 3]")
    model = parse(text, w=rng_array(4, 1, 3, 3))
    result = FusePadPass()(model)
    assert not result.modified
