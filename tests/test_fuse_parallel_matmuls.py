"""fuse-parallel-matmuls: summed products of one input by constant matrices become one MatMul."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import onnxopt
from onnxopt.passes.fuse_parallel_matmuls import FuseParallelMatMulsPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_determinism import _assert_deterministic
from tests.test_eliminate_noops import model

RULE = "matmul+matmul->matmul"


def _weights(name: str, shape: tuple[int, ...], seed: int) -> str:
    values = np.random.default_rng(seed).normal(0, 0.5, shape).round(3)
    dims = ",".join(map(str, shape))
    return f"float[{dims}] {name} = {{{', '.join(map(str, values.ravel()))}}}"


W = _weights("w", (8, 6), 1)
W2 = _weights("w2", (8, 6), 2)
W3 = _weights("w3", (8, 6), 3)
A = _weights("a", (8, 2), 4)
B = _weights("b", (2, 6), 5)
A1 = _weights("a1", (8, 1), 6)
B1 = _weights("b1", (1, 6), 7)
A1B = _weights("a1b", (8, 1), 11)
B1B = _weights("b1b", (1, 6), 12)
WT = _weights("wt", (6, 8), 8)  # a Gemm's transB weight: [N, K]
WT2 = _weights("wt2", (6, 8), 9)
BIAS = (
    "float[6] c = {0.1, -0.2, 0.3, 0.0, 0.5, -1.0}, float[6] c2 = {0.5, 0.25, -1.0, 2.0, 0.0, 1.0}"
)
BN = (
    "float[8] g = {1.5, 0.5, 2.0, -1.0, 1.0, 0.75, 1.25, 0.5}, "
    "float[8] beta = {0.1, 0.2, 0.3, 0.4, -0.1, -0.2, 0.0, 0.5}, "
    "float[8] mu = {0.5, -0.5, 0.25, 0.0, 0.1, 0.2, -0.3, 0.0}, "
    "float[8] var = {1.0, 2.0, 0.5, 4.0, 1.5, 0.25, 1.0, 3.0}"
)
TOKENS = {"inputs": "float[N,S,8] x", "outputs": "float[N,S,6] y"}
ROWS = {"inputs": "float[N,8] x", "outputs": "float[N,6] y"}


@pytest.mark.parametrize(
    ("constants", "body", "io", "count", "ops"),
    [
        # PEFT's LoRA: base(x) + B(A(x)) * alpha / r, the base with a bias
        (
            f"{W}, {A}, {B}, {BIAS}, float s = {{2.0}}",
            "p = MatMul(x, w)\n q = Add(c, p)\n h = MatMul(x, a)\n l = MatMul(h, b)\n"
            " m = Mul(l, s)\n y = Add(q, m)",
            TOKENS,
            1,
            ["MatMul", "Add"],
        ),
        # the scaling as a Div, a bias on the adapter, none on the base
        (
            f"{W}, {A}, {B}, {BIAS}, float s = {{4.0}}",
            "p = MatMul(x, w)\n h = MatMul(x, a)\n l = MatMul(h, b)\n k = Add(l, c2)\n"
            " m = Div(k, s)\n y = Add(m, p)",
            TOKENS,
            1,
            ["MatMul", "Add"],
        ),
        # twin classifier heads, each a BatchNormalization and a Gemm; the average's / 2 stays
        (
            f"{WT}, {WT2}, {BIAS}, {BN}, float two = {{2.0}}",
            "n = BatchNormalization(x, g, beta, mu, var)\n p = Gemm <transB = 1> (n, wt, c)\n"
            " o = BatchNormalization(x, beta, g, mu, var)\n q = Gemm <transB = 1> (o, wt2, c2)\n"
            " s = Add(p, q)\n y = Div(s, two)",
            ROWS,
            1,
            ["MatMul", "Add", "Div"],
        ),
        # a difference of two products, one of a per-feature scaling of x
        (
            f"{W}, {W2}, float[8] f = {{1.0, 2.0, 0.5, -1.0, 3.0, 0.25, 1.0, -2.0}}",
            "p = MatMul(x, w)\n z = Mul(x, f)\n q = MatMul(z, w2)\n y = Sub(p, q)",
            TOKENS,
            1,
            ["MatMul"],
        ),
        # PEFT's DoRA: base + ((m - 1) * base + m * s * B(A(x))), the base product read twice
        (
            f"{W}, {A}, {B}, {BIAS}, float s = {{2.0}}",
            "p = MatMul(x, w)\n q = Add(p, c)\n r = Mul(p, c2)\n h = MatMul(x, a)\n"
            " l = MatMul(h, b)\n m = Mul(l, s)\n d = Add(r, m)\n y = Add(q, d)",
            TOKENS,
            1,
            ["MatMul", "Add"],
        ),
        # three products summed: two merges
        (
            f"{W}, {W2}, {W3}",
            "p = MatMul(x, w)\n q = MatMul(x, w2)\n r = MatMul(x, w3)\n s = Add(p, q)\n"
            " y = Add(r, s)",
            TOKENS,
            2,
            ["MatMul"],
        ),
    ],
    ids=["lora", "lora-div-bias", "twin-heads", "sub-scaled-input", "dora", "three-products"],
)
def test_summed_products_become_one_matmul(
    constants: str, body: str, io: dict[str, str], count: int, ops: list[str]
) -> None:
    text = model(f"<{constants}> {{ {body} }}", **io)
    merged = assert_rewrites(FuseParallelMatMulsPass, text, {RULE: count}, ops, 2)
    product = next(iter(merged.graph))
    assert product.inputs[0] is not None and product.inputs[0].name == "x"


def test_the_merged_weight_is_the_base_plus_the_scaled_adapter() -> None:
    """``x @ W + c + (x @ A @ B) * 2`` -> ``W + 2 * A @ B`` (float64, rounded once), bias c."""
    text = model(
        f"<{W}, {A}, {B}, {BIAS}, float s = {{2.0}}> {{ p = MatMul(x, w)\n q = Add(p, c)\n"
        " h = MatMul(x, a)\n l = MatMul(h, b)\n m = Mul(l, s)\n y = Add(q, m) }",
        **TOKENS,
    )
    original = load(text)
    arrays = {v.name: v.const_value.numpy() for v in original.graph.initializers.values()}
    result = FuseParallelMatMulsPass()(original.clone())
    product, add = result.model.graph
    weight = product.inputs[1].const_value.numpy()
    expected = arrays["w"].astype(np.float64) + 2.0 * (
        arrays["a"].astype(np.float64) @ arrays["b"].astype(np.float64)
    )
    np.testing.assert_array_equal(weight, expected.astype(np.float32))
    np.testing.assert_array_equal(add.inputs[1].const_value.numpy(), arrays["c"])


@pytest.mark.parametrize(
    ("constants", "body", "reason"),
    [
        # two rank-1 chains: one dense product would cost more than both
        (
            f"{A1}, {B1}, {A1B}, {B1B}",
            "h = MatMul(x, a1)\n l = MatMul(h, b1)\n i = MatMul(x, a1b)\n k = MatMul(i, b1b)\n"
            " y = Add(l, k)",
            "one product would cost 48 multiply-adds per row, the summands 28",
        ),
        # the same weight in both products: merging would copy it
        (
            f"{W}",
            "p = MatMul(x, w)\n z = Mul(x, x)\n q = MatMul(z, w)\n r = MatMul(x, w)\n"
            " s = Add(p, r)\n y = Add(s, q)",
            "is shared with",
        ),
        # a scale that varies along the sequence is not one per feature
        (
            f"{W}, {W2}, float[2,1] t = {{2.0, 3.0}}",
            "p = MatMul(x, w)\n q = MatMul(x, w2)\n m = Mul(q, t)\n y = Add(p, m)",
            "is not per-channel",
        ),
        (
            f"{W}, {W2}, float[6] zero = {{1.0, 1.0, 0.0, 1.0, 1.0, 1.0}}",
            "p = MatMul(x, w)\n q = MatMul(x, w2)\n m = Div(q, zero)\n y = Add(p, m)",
            "a Div by a constant holding 0",
        ),
        (
            "float[8,6] big = {" + ", ".join(["3e38"] * 48) + "}, "
            "float[8,6] big2 = {" + ", ".join(["3e38"] * 48) + "}",
            "p = MatMul(x, big)\n q = MatMul(x, big2)\n y = Add(p, q)",
            "the folded weights overflow float32",
        ),
    ],
    ids=["two-low-rank", "shared-weight", "per-position-scale", "div-by-zero", "overflow"],
)
def test_sums_it_leaves_are_explained(constants: str, body: str, reason: str) -> None:
    assert_refuses(FuseParallelMatMulsPass, model(f"<{constants}> {{ {body} }}", **TOKENS), reason)


@pytest.mark.parametrize(
    "body",
    [
        # the adapter's output is read elsewhere: merging would still need it
        "p = MatMul(x, w)\n h = MatMul(x, a)\n l = MatMul(h, b)\n s = Add(p, l)\n y = Mul(s, l)",
        # products of two different inputs (a residual beside a projection)
        "z = Relu(x)\n p = MatMul(x, w)\n q = MatMul(z, w2)\n y = Add(p, q)",
        # a residual: x itself is no product
        "p = MatMul(x, w8)\n y = Add(p, x)",
    ],
    ids=["adapter-read-elsewhere", "different-inputs", "residual"],
)
def test_sums_that_are_no_candidates_stay_without_a_note(body: str) -> None:
    square = _weights("w8", (8, 8), 10)
    io = {"inputs": "float[N,S,8] x", "outputs": "float[N,S,?] y"}
    text = model(f"<{W}, {W2}, {A}, {B}, {square}> {{ {body} }}", **io)
    result = FuseParallelMatMulsPass(PassOptions(explain=True))(load(text))
    assert not result.modified and result.notes == []


SHAPE_READS = dict.fromkeys(("Shape", "Unsqueeze"), 1 << 30)


@pytest.mark.torch
@pytest.mark.parametrize(
    "exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize(
    ("base", "factory", "merges"),
    [
        ("bert-tiny", "bert_lora_tiny", 4),
        ("distilbert-tiny", "distilbert_lora_tiny", 12),
        ("gpt2-tiny", "gpt2_lora_tiny", 8),
        ("llama-tiny", "llama_lora_tiny", 14),
        ("llama-tiny", "llama_dora_tiny", 14),
        ("vit-tiny", "vit_lora_tiny", 12),
        ("whisper-encoder-tiny", "whisper_encoder_lora_tiny", 12),
    ],
)
def test_lora_adapted_transformers_fuse_as_their_base_models(
    base: str, factory: str, merges: int, exporter: str, tmp_path: Path
) -> None:
    """The tiny zoo transformers with unmerged rank-8 adapters (BERT on query and value, the
    others on every projection; LLaMA with DoRA ones too): every adapter merges (GPT-2's TorchScript Conv1D, a Gemm
    between two Reshapes, and Whisper's query scaled after the sum too), and the optimized graph
    has the ops of the optimized base model (packed Attention, GroupQueryAttention); validated
    against ORT and the eager model, dynamic dims kept, a fixed point."""
    pytest.importorskip("transformers")
    from onnxopt.export import export

    optimized = {}
    for name in (base, f"benchmarks.lora:{factory}"):
        path = tmp_path / f"{name.split(':')[-1]}.onnx"
        export(name, path, exporter=exporter)  # type: ignore[arg-type]
        result = onnxopt.optimize(path, find_reference=True)
        assert result.validated, result.report.validation
        optimized[name] = result
    adapted = result
    stats = {name: s for name, _, _, s in adapted.report.pass_totals()}
    assert stats["fuse-parallel-matmuls"] == {RULE: merges}
    # the same ops; the dims the fix-ups read may come off other tensors (GPT-2 TorchScript's
    # sequence length: off the ids where the base model still reads it for the positions, off
    # the packed projection where the adapted model's read of it died first), same count
    ops, base_ops = Counter(op_types(adapted.model)), Counter(op_types(optimized[base].model))
    assert ops.total() == base_ops.total()
    assert ops - Counter(SHAPE_READS) == base_ops - Counter(SHAPE_READS)
    assert isinstance(adapted.model.graph.inputs[0].shape[0], ir.SymbolicDim)  # the batch
    _assert_deterministic(path, tmp_path)


def test_an_input_of_unknown_shape_still_merges() -> None:
    """An already optimized model (shape annotations dropped, contrib ops that shape inference
    does not know): the products alone need no shape of their input."""
    text = model(
        f"<{W}, {A}, {B}> {{ z = Relu(x)\n p = MatMul(z, w)\n h = MatMul(z, a)\n"
        " l = MatMul(h, b)\n y = Add(p, l) }",
        **TOKENS,
    )
    original = load(text)
    blind = original.clone()
    for node in blind.graph:
        for value in node.outputs:
            value.shape = None
    result = FuseParallelMatMulsPass()(blind)
    assert dict(result.stats) == {RULE: 1}
    assert op_types(result.model) == ["Relu", "MatMul"]
    assert validate(original, result.model).passed
