"""fuse-parallel-convs: summed Conv branches of one input become one Conv (RepVGG / ACNet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import onnxopt
from onnxopt.passes.fuse_parallel_convs import FuseParallelConvsPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

RULE = "conv+conv->conv"


def _weights(name: str, shape: tuple[int, ...], seed: int) -> str:
    values = np.random.default_rng(seed).normal(0, 0.5, shape).round(3)
    dims = ",".join(map(str, shape))
    return f"float[{dims}] {name} = {{{', '.join(map(str, values.ravel()))}}}"


W33 = _weights("w33", (4, 4, 3, 3), 1)
W31 = _weights("w31", (4, 4, 3, 1), 2)
W33B = _weights("w33b", (4, 4, 3, 3), 8)
W13 = _weights("w13", (4, 4, 1, 3), 3)
W11 = _weights("w11", (4, 4, 1, 1), 4)
DW = _weights("dw", (4, 1, 3, 3), 5)
W3 = _weights("w3", (4, 4, 3), 6)
W1 = _weights("w1", (4, 4, 1), 7)
BIAS = "float[4] b1 = {0.1, -0.2, 0.3, 0.0}, float[4] b2 = {0.5, 0.25, -1.0, 2.0}"
BN = (
    "float[4] g = {1.5, 0.5, 2.0, -1.0}, float[4] beta = {0.1, 0.2, 0.3, 0.4}, "
    "float[4] mu = {0.5, -0.5, 0.25, 0.0}, float[4] var = {1.0, 2.0, 0.5, 4.0}"
)
IO = {"inputs": "float[N,4,H,W] x", "outputs": "float[N,4,H,W] y"}
HALF = {"inputs": "float[N,4,H,W] x", "outputs": "float[N,4,P,Q] y"}


@pytest.mark.parametrize(
    ("constants", "body", "io", "count"),
    [
        # ACNet / TextNet: a 3x3, a 3x1 and a 1x3 branch, each with a bias
        (
            f"{W33}, {W31}, {W13}, {BIAS}",
            "a = Conv <pads = [1, 1, 1, 1]> (x, w33, b1)\n"
            " b = Conv <pads = [1, 0, 1, 0]> (x, w31, b2)\n"
            " c = Conv <pads = [0, 1, 0, 1]> (x, w13)\n"
            " s = Add(a, b)\n y = Add(s, c)",
            IO,
            2,
        ),
        # RepVGG: 3x3 and 1x1 branches and an identity BatchNormalization, identity last
        (
            f"{W33}, {W11}, {BIAS}, {BN}",
            "a = Conv <pads = [1, 1, 1, 1]> (x, w33, b1)\n b = Conv (x, w11, b2)\n"
            " i = BatchNormalization(x, g, beta, mu, var)\n s = Add(a, b)\n y = Add(i, s)",
            IO,
            2,
        ),
        # a strided block: the 1x1 branch lands on the 3x3's centre tap
        (
            f"{W33}, {W11}, {BIAS}",
            "a = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (x, w33, b1)\n"
            " b = Conv <strides = [2, 2]> (x, w11, b2)\n y = Add(b, a)",
            HALF,
            1,
        ),
        # a depthwise 3x3 and the block's input itself (MobileOne's skip)
        (
            f"{DW}",
            "a = Conv <group = 4, pads = [1, 1, 1, 1]> (x, dw)\n y = Add(x, a)",
            IO,
            1,
        ),
        # dilated: the 1x1 sits on the centre of a 3x3 of dilation 2 (its pads 2)
        (
            f"{W33}, {W11}",
            "a = Conv <dilations = [2, 2], pads = [2, 2, 2, 2]> (x, w33)\n"
            " b = Conv (x, w11)\n y = Add(a, b)",
            IO,
            1,
        ),
        # 1-D branches (a TDNN-style block)
        (
            f"{W3}, {W1}, {BIAS}",
            "a = Conv <pads = [1, 1]> (x, w3, b1)\n b = Conv (x, w1, b2)\n y = Add(a, b)",
            {"inputs": "float[N,4,T] x", "outputs": "float[N,4,T] y"},
            1,
        ),
        # each branch with its own BatchNormalization (folded here, before fuse-conv-bn)
        (
            f"{W33}, {W11}, {BN}, float[4] g2 = {{0.5, 1.0, 1.5, 2.0}}",
            "a = Conv <pads = [1, 1, 1, 1]> (x, w33)\n b = Conv (x, w11)\n"
            " p = BatchNormalization(a, g, beta, mu, var)\n"
            " q = BatchNormalization(b, g2, beta, mu, var)\n y = Add(p, q)",
            IO,
            1,
        ),
        # a LoRA adapter on a Conv: base 3x3 + (1x1 up of a 3x3 down to 2 channels) * scale
        (
            f"{W33}, {BIAS}, {_weights('down', (2, 4, 3, 3), 10)}, "
            f"{_weights('up', (4, 2, 1, 1), 11)}, float s = {{2.0}}",
            "a = Conv <pads = [1, 1, 1, 1]> (x, w33, b1)\n"
            " d = Conv <pads = [1, 1, 1, 1]> (x, down)\n u = Conv (d, up, b2)\n"
            " m = Mul(u, s)\n y = Add(a, m)",
            IO,
            1,
        ),
        # FastViT's RepMixer: x + layer_scale * (mixer(x) - norm(x)), the mixer a depthwise Conv
        (
            f"{DW}, {BN}, float[4,1,1] ls = {{0.5, -1.0, 2.0, 0.25}}",
            "a = Conv <group = 4, pads = [1, 1, 1, 1]> (x, dw)\n"
            " n = BatchNormalization(x, g, beta, mu, var)\n d = Sub(a, n)\n"
            " m = Mul(d, ls)\n y = Add(x, m)",
            IO,
            2,
        ),
    ],
    ids=[
        "acnet",
        "repvgg",
        "strided",
        "depthwise-skip",
        "dilated",
        "conv1d",
        "branch-batch-norms",
        "conv-lora",
        "fastvit-repmixer",
    ],
)
def test_summed_branches_become_one_conv(
    constants: str, body: str, io: dict[str, str], count: int
) -> None:
    text = model(f"<{constants}> {{ {body} }}", **io)
    merged = assert_rewrites(FuseParallelConvsPass, text, {RULE: count}, ["Conv"], 2)
    conv = next(iter(merged.graph))
    assert conv.inputs[0] is not None and conv.inputs[0].name == "x"


def test_the_merged_kernel_is_the_branches_padded_into_one_window() -> None:
    """3x3 + 3x1 + 1x3 + identity: the 3x1 on the middle column, the 1x3 on the middle row,
    the identity on the centre of its own channel; the biases summed."""
    text = model(
        f"<{W33}, {W31}, {W13}, {BIAS}> {{ a = Conv <pads = [1, 1, 1, 1]> (x, w33, b1)\n"
        " b = Conv <pads = [1, 0, 1, 0]> (x, w31, b2)\n c = Conv <pads = [0, 1, 0, 1]> (x, w13)\n"
        " s = Add(a, b)\n t = Add(s, c)\n y = Add(t, x) }",
        **IO,
    )
    original = load(text)
    arrays = {v.name: v.const_value.numpy() for v in original.graph.initializers.values()}
    result = FuseParallelConvsPass()(original.clone())
    conv = next(iter(result.model.graph))
    weight, bias = (conv.inputs[i].const_value.numpy() for i in (1, 2))
    expected = arrays["w33"].astype(np.float64).copy()
    expected[:, :, :, 1:2] += arrays["w31"]
    expected[:, :, 1:2, :] += arrays["w13"]
    expected[np.arange(4), np.arange(4), 1, 1] += 1.0
    np.testing.assert_allclose(weight, expected, rtol=1e-6)
    np.testing.assert_allclose(bias, arrays["b1"] + arrays["b2"], rtol=1e-6)
    assert tuple(conv.attributes["pads"].as_ints()) == (1, 1, 1, 1)
    assert validate(original, result.model).passed


@pytest.mark.parametrize(
    ("constants", "body", "io", "reason"),
    [
        (
            f"{W33}, {W33B}",
            "a = Conv <pads = [1, 1, 1, 1]> (x, w33)\n"
            " b = Conv <dilations = [2, 2], pads = [2, 2, 2, 2]> (x, w33b)\n y = Add(a, b)",
            IO,
            "the Convs differ in dilations",
        ),
        # no branch covers the union of a 3x1 and a 1x3: the corners would be new reads
        (
            f"{W31}, {W13}",
            "a = Conv <pads = [1, 0, 1, 0]> (x, w31)\n b = Conv <pads = [0, 1, 0, 1]> (x, w13)\n"
            " y = Add(a, b)",
            IO,
            "no branch's window covers the others'",
        ),
        # the same weight in both branches: merging would copy it
        (
            f"{W11}",
            "a = Conv (x, w11)\n r = Relu(x)\n b = Conv (r, w11)\n c = Conv (x, w11)\n"
            " s = Add(a, c)\n y = Add(s, b)",
            IO,
            "is shared with",
        ),
        (
            f"{W33}",
            'a = Conv <auto_pad = "SAME_UPPER"> (x, w33)\n y = Add(a, x)',
            IO,
            "auto_pad",
        ),
        (
            "float[4,4,1,1] big = {" + ", ".join(["3e38"] * 16) + "}, "
            "float[4,4,1,1] big2 = {" + ", ".join(["3e38"] * 16) + "}",
            "a = Conv (x, big)\n b = Conv (x, big2)\n y = Add(a, b)",
            IO,
            "the merged weights overflow float32",
        ),
        # two rank-1 adapters alone: one dense 3x3 Conv would cost more than both
        (
            f"{_weights('d1', (1, 4, 3, 3), 12)}, {_weights('u1', (4, 1, 1, 1), 13)}, "
            f"{_weights('d2', (1, 4, 3, 3), 14)}, {_weights('u2', (4, 1, 1, 1), 15)}",
            "p = Conv <pads = [1, 1, 1, 1]> (x, d1)\n q = Conv (p, u1)\n"
            " r = Conv <pads = [1, 1, 1, 1]> (x, d2)\n t = Conv (r, u2)\n y = Add(q, t)",
            IO,
            "one Conv would cost 144 multiply-adds per position, the branches 80",
        ),
    ],
    ids=[
        "dilations",
        "no-covering-window",
        "shared-weight",
        "auto-pad",
        "overflow",
        "two-adapters",
    ],
)
def test_branches_it_leaves_are_explained(
    constants: str, body: str, io: dict[str, str], reason: str
) -> None:
    assert_refuses(FuseParallelConvsPass, model(f"<{constants}> {{ {body} }}", **io), reason)


def test_a_batch_norm_after_the_sum_meets_one_conv() -> None:
    """RepViT's ``bn(conv(x) + conv1(x) + x)``: the branches merge, then fuse-conv-bn (which runs
    after this pass in the levels) folds the BN into the one Conv."""
    text = model(
        f"<{DW}, {_weights('dw1', (4, 1, 1, 1), 9)}, {BN}> {{ a = Conv <group = 4, pads = [1, 1, 1, 1]> (x, dw)\n"
        " b = Conv <group = 4> (x, dw1)\n s = Add(a, b)\n t = Add(s, x)\n"
        " y = BatchNormalization(t, g, beta, mu, var) }",
        **IO,
    )
    result = onnxopt.optimize(load(text), passes=["fuse-parallel-convs", "fuse-conv-bn"])
    assert result.validated, result.report.validation
    assert op_types(result.model) == ["Conv"]


def test_a_branch_read_elsewhere_stays() -> None:
    text = model(
        f"<{W33}, {W11}> {{ a = Conv <pads = [1, 1, 1, 1]> (x, w33)\n b = Conv (x, w11)\n"
        " s = Add(a, b)\n y = Mul(s, a) }",
        **IO,
    )
    assert not FuseParallelConvsPass()(load(text)).modified


@pytest.mark.torch
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_repvgg_network_runs_one_conv_per_block(exporter: str, tmp_path: Path) -> None:
    """RepVGG blocks as trained (3x3 + BN, 1x1 + BN, identity BN, ReLU), exported without
    re-parameterizing: every block becomes one FusedConv, validated on ORT."""
    torch = pytest.importorskip("torch")
    from benchmarks.parallel_convs import repvgg
    from onnxopt.export import Exportable, _export_dynamo, _export_torchscript

    net = repvgg((2, 2), (8, 16))
    axes = {"x": {0: "batch", 2: "h", 3: "w"}}
    path = tmp_path / "repvgg.onnx"
    exportable = Exportable("repvgg", net, {"x": torch.rand(2, 3, 32, 32)}, axes)
    run, opset = (_export_torchscript, 17) if exporter == "torchscript" else (_export_dynamo, None)
    run(exportable, path, ["y"], opset, True, False)
    result = onnxopt.optimize(path)
    assert result.validated, result.report.validation
    assert [n.op_type for n in result.model.graph] == ["FusedConv"] * 4
    stats = {name: s for name, _, _, s in result.report.pass_totals()}
    assert stats["fuse-parallel-convs"] == {RULE: 6}
    assert isinstance(result.model.graph.inputs[0].shape[2], ir.SymbolicDim)


def test_float16_branches_merge_in_float64_and_round_once() -> None:
    """A half-precision model: the kernels are summed wide and rounded once to float16."""
    import onnx
    import onnx.numpy_helper as onh
    import onnx.parser

    proto = onnx.parser.parse_model(
        model(
            f"<{W33}, {W11}> {{ a = Conv <pads = [1, 1, 1, 1]> (x, w33)\n b = Conv (x, w11)\n"
            " y = Add(a, b) }",
            **IO,
        )
    )
    for index, tensor in enumerate(proto.graph.initializer):
        half = onh.to_array(tensor).astype(np.float16)
        proto.graph.initializer[index].CopyFrom(onh.from_array(half, tensor.name))
    for info in (*proto.graph.input, *proto.graph.output):
        info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    text = onnx.printer.to_text(proto)
    merged = assert_rewrites(FuseParallelConvsPass, text, {RULE: 1}, ["Conv"], 2)
    weight = next(iter(merged.graph)).inputs[1].const_value.numpy()
    halves = {t.name: onh.to_array(t) for t in proto.graph.initializer}
    expected = halves["w33"].astype(np.float64)
    expected[:, :, 1, 1] += halves["w11"][:, :, 0, 0]
    assert weight.dtype == np.float16
    np.testing.assert_array_equal(weight, expected.astype(np.float16))


def test_a_sum_without_a_conv_is_no_candidate() -> None:
    """``x + BN(x)`` has nothing to merge into: no change and no near-miss under --explain."""
    text = model(f"<{BN}> {{ n = BatchNormalization(x, g, beta, mu, var)\n y = Add(x, n) }}", **IO)
    result = FuseParallelConvsPass(PassOptions(explain=True))(load(text))
    assert not result.modified and result.notes == []
