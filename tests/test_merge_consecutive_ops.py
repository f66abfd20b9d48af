from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.passes.merge_consecutive_ops import (
    EXACT_WIDENING,
    MergeConsecutiveOpsPass,
    compose_slices,
    merge_squeeze_axes,
    merge_unsqueeze_axes,
)
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load
from tests.test_eliminate_noops import model

T = "Transpose∘Transpose"

# (id, model, stats, ops after, trials)
POSITIVE = [
    (
        "transpose-compose",
        model(
            "{ a = Transpose <perm = [1, 0, 2]> (x)\n b = Transpose <perm = [0, 2, 1]> (a)\n y = Relu(b) }",
            outputs="float[3,4,2] y",
        ),
        {T: 1},
        ["Transpose", "Relu"],
        1,
    ),
    (
        "transpose-inverse",
        model(
            "{ a = Transpose <perm = [2, 0, 1]> (x)\n b = Transpose <perm = [1, 2, 0]> (a)\n y = Relu(b) }"
        ),
        {T: 1},
        ["Relu"],
        1,
    ),
    (
        "transpose-default-perms",
        model("{ a = Transpose(x)\n b = Transpose(a)\n y = Relu(b) }"),
        {T: 1},
        ["Relu"],
        1,
    ),
    (
        "transpose-chain-of-three",
        model(
            "{ a = Transpose <perm = [1, 0, 2]> (x)\n b = Transpose <perm = [0, 2, 1]> (a)\n"
            " c = Transpose <perm = [2, 1, 0]> (b)\n y = Relu(c) }",
            outputs="float[2,4,3] y",
        ),
        {T: 2},
        ["Transpose", "Relu"],
        1,
    ),
    (
        "transpose-shared-inner",
        model(
            "{ a = Transpose <perm = [1, 0, 2]> (x)\n r = Relu(a)\n b = Transpose <perm = [1, 0, 2]> (a)\n"
            " y = Add(x, b) }",
            outputs="float[2,3,4] y, float[3,2,4] r",
        ),
        {T: 1},
        ["Transpose", "Relu", "Add"],
        1,
    ),
    (
        "reshape-reshape",
        model(
            "<int64[3] s1 = {0, 3, 4}, int64[2] s2 = {-1, 6}> { a = Reshape(x, s1)\n b = Reshape(a, s2)\n y = Relu(b) }",
            inputs="float[N,12] x",
            outputs="float[M,6] y",
        ),
        {"Reshape∘Reshape": 1},
        ["Reshape", "Relu"],
        2,
    ),
    (
        "reshape-reshape-copy-dim",
        model(
            "<int64[2] s1 = {6, 4}, int64[3] s2 = {0, 2, 2}> { a = Reshape(x, s1)\n b = Reshape(a, s2)\n y = Relu(b) }",
            outputs="float[6,2,2] y",
        ),
        {"Reshape∘Reshape": 1},
        ["Reshape", "Relu"],
        1,
    ),
    (
        "reshape-after-flatten",
        model(
            "<int64[2] s = {4, -1}> { a = Flatten <axis = 2> (x)\n b = Reshape(a, s)\n y = Relu(b) }",
            outputs="float[4,6] y",
        ),
        {"Reshape∘Flatten": 1},
        ["Reshape", "Relu"],
        1,
    ),
    (
        "reshape-after-unsqueeze-copy-dim",
        model(
            "<int64[1] a1 = {1}, int64[3] s = {0, 0, -1}> { a = Unsqueeze(x, a1)\n b = Reshape(a, s)\n"
            " y = Relu(b) }",
            outputs="float[2,1,12] y",
        ),
        {"Reshape∘Unsqueeze": 1},
        ["Reshape", "Relu"],
        1,
    ),
    (
        "reshape-after-squeeze",
        model(
            "<int64[2] s = {-1, 3}> { a = Squeeze(x)\n b = Reshape(a, s)\n y = Relu(b) }",
            inputs="float[N,1,6] x",
            outputs="float[M,3] y",
        ),
        {"Reshape∘Squeeze": 1},
        ["Reshape", "Relu"],
        2,
    ),
    (
        "unsqueeze-unsqueeze-13",
        model(
            "<int64[1] a1 = {1}, int64[2] a2 = {0, -1}> { a = Unsqueeze(x, a1)\n b = Unsqueeze(a, a2)\n y = Relu(b) }",
            inputs="float[N,4] x",
            outputs="float[1,N,1,4,1] y",
        ),
        {"Unsqueeze∘Unsqueeze": 1},
        ["Unsqueeze", "Relu"],
        2,
    ),
    (
        "unsqueeze-unsqueeze-11",
        model(
            "{ a = Unsqueeze <axes = [0, 3]> (x)\n b = Unsqueeze <axes = [2]> (a)\n y = Relu(b) }",
            inputs="float[2,3] x",
            outputs="float[1,2,1,3,1] y",
            opset=11,
        ),
        {"Unsqueeze∘Unsqueeze": 1},
        ["Unsqueeze", "Relu"],
        1,
    ),
    (
        "squeeze-squeeze-13",
        model(
            "<int64[1] a1 = {1}, int64[1] a2 = {-1}> { a = Squeeze(x, a1)\n b = Squeeze(a, a2)\n y = Relu(b) }",
            inputs="float[2,1,3,1] x",
            outputs="float[2,3] y",
        ),
        {"Squeeze∘Squeeze": 1},
        ["Squeeze", "Relu"],
        1,
    ),
    (
        "squeeze-then-squeeze-all",
        model(
            "{ a = Squeeze <axes = [0]> (x)\n b = Squeeze(a)\n y = Relu(b) }",
            inputs="float[1,2,1] x",
            outputs="float[2] y",
            opset=11,
        ),
        {"Squeeze∘Squeeze": 1},
        ["Squeeze", "Relu"],
        1,
    ),
    (
        "cast-f32-f64-f32",
        model("{ a = Cast <to = 11> (x)\n b = Cast <to = 1> (a)\n y = Relu(b) }"),
        {"Cast∘Cast": 1},
        ["Relu"],
        1,
    ),
    (
        "cast-i32-i64-i32",
        model(
            "{ a = Cast <to = 7> (x)\n b = Cast <to = 6> (a)\n y = Abs(b) }",
            inputs="int32[5] x",
            outputs="int32[5] y",
        ),
        {"Cast∘Cast": 1},
        ["Abs"],
        1,
    ),
    (
        "cast-u8-i32-f32",
        model(
            "{ a = Cast <to = 6> (x)\n b = Cast <to = 1> (a)\n y = Relu(b) }",
            inputs="uint8[5] x",
            outputs="float[5] y",
        ),
        {"Cast∘Cast": 1},
        ["Cast", "Relu"],
        1,
    ),
    (
        "slice-same-axis",
        model(
            "<int64[1] s1 = {1}, int64[1] e1 = {20}, int64[1] a = {1}, int64[1] st1 = {2},"
            " int64[1] s2 = {1}, int64[1] e2 = {-1}, int64[1] st2 = {2}>"
            " { p = Slice(x, s1, e1, a, st1)\n q = Slice(p, s2, e2, a, st2)\n y = Relu(q) }",
            inputs="float[2,16] x",
            outputs="float[2,3] y",
        ),
        {"Slice∘Slice": 1},
        ["Slice", "Relu"],
        1,
    ),
    (
        "slice-same-axis-dynamic",
        model(
            "<int64[1] s1 = {1}, int64[1] e1 = {9223372036854775807}, int64[1] a = {0},"
            " int64[1] s2 = {2}, int64[1] e2 = {5}>"
            " { p = Slice(x, s1, e1, a)\n q = Slice(p, s2, e2, a)\n y = Relu(q) }",
            inputs="float[N,4] x",
            outputs="float[M,4] y",
        ),
        {"Slice∘Slice": 1},
        ["Slice", "Relu"],
        2,
    ),
    (
        "slice-distinct-axes",
        model(
            "<int64[1] s = {1}, int64[1] e = {3}, int64[1] a0 = {0}, int64[1] a1 = {-1}>"
            " { p = Slice(x, s, e, a0)\n q = Slice(p, s, e, a1)\n y = Relu(q) }",
            outputs="float[1,3,2] y",
        ),
        {"Slice∘Slice": 1},
        ["Slice", "Relu"],
        1,
    ),
    (
        "slice-slice-attr",
        model(
            "{ p = Slice <starts = [1], ends = [4], axes = [2]> (x)\n"
            " q = Slice <starts = [-2], ends = [100], axes = [2]> (p)\n y = Relu(q) }",
            outputs="float[2,3,2] y",
            opset=9,
        ),
        {"Slice∘Slice": 1},
        ["Slice", "Relu"],
        1,
    ),
    (
        # An LSTM's [T, directions, batch, H] output at batch 1 turned to [T, batch, directions,
        # H] before a Reshape (RapidOCR's and ddddocr's CRNN heads): the Transpose moves a size-1
        # axis only, so the Reshape reads x itself; its 0 still copies T (perm keeps axis 0).
        "reshape-of-size-1-transpose",
        model(
            "<int64[3] s = {0, 0, -1}> { a = Transpose <perm = [0, 2, 1, 3]> (x)\n"
            " b = Reshape(a, s)\n y = Relu(b) }",
            inputs="float[T,2,1,4] x",
            outputs="float[T,1,8] y",
        ),
        {"Reshape∘Transpose": 1},
        ["Reshape", "Relu"],
        2,
    ),
    (
        "concat-concat",
        model(
            "{ a = Concat <axis = 1> (x, x)\n b = Concat <axis = -2> (x, a, x)\n y = Relu(b) }",
            outputs="float[2,12,4] y",
        ),
        {"Concat∘Concat": 1},
        ["Concat", "Relu"],
        1,
    ),
    (
        # TorchScript's dim read: x.size(-2) as a one-element vector, here of a Shape from 1 on
        "dim-read",
        model(
            "<int64 i = {-2}, int64[1] z = {0}> { s = Shape <start = 1> (x)\n"
            " g = Gather(s, i)\n u = Unsqueeze(g, z)\n y = Concat <axis = 0> (u, u) }",
            inputs="float[N,T,4] x",
            outputs="int64[2] y",
            opset=17,
        ),
        {"Unsqueeze∘Gather∘Shape->Shape": 1},
        ["Shape", "Concat"],
        2,
    ),
    (
        # TorchScript reads the sequence length once for the positions' Range and the mask's
        # shape: the Range (before the Unsqueeze) reads it as Squeeze(Shape(x, 1, 2)), the
        # dynamo exporter's form
        "dim-read-shared",
        model(
            "<int64 i = {1}, int64[1] z = {0}, int64 zero = {0}, int64 one = {1}> {"
            " s = Shape(x)\n g = Gather(s, i)\n r = Range(zero, g, one)\n"
            " u = Unsqueeze(g, z)\n y = Concat <axis = 0> (u, u) }",
            inputs="float[N,T,4] x",
            outputs="int64[2] y, int64[T] r",
            opset=17,
        ),
        {"Unsqueeze∘Gather∘Shape->Shape": 1},
        ["Shape", "Squeeze", "Range", "Concat"],
        2,
    ),
    (
        # consecutive dims gathered as a vector, x.shape[1:3] written as Gather(Shape(x), [1, 2])
        "dims-gather",
        model(
            "<int64[2] i = {1, 2}> { s = Shape(x)\n g = Gather(s, i)\n y = Concat <axis = 0> (g, g) }",
            inputs="float[N,T,4] x",
            outputs="int64[4] y",
            opset=17,
        ),
        {"Gather∘Shape->Shape": 1},
        ["Shape", "Concat"],
        2,
    ),
]


@pytest.mark.parametrize(
    ("text", "stats", "ops", "trials"), [c[1:] for c in POSITIVE], ids=[c[0] for c in POSITIVE]
)
def test_merges_chain(text: str, stats: dict[str, int], ops: list[str], trials: int) -> None:
    assert_rewrites(MergeConsecutiveOpsPass, text, stats, ops, trials)


NEGATIVE = [
    (
        "dims-gather-out-of-order",
        model(
            "<int64[2] i = {2, 1}> { s = Shape(x)\n g = Gather(s, i)\n y = Concat <axis = 0> (g, g) }",
            inputs="float[N,T,4] x",
            outputs="int64[4] y",
            opset=17,
        ),
        "not consecutive",
    ),
    (
        # the whole shape is read again: Shape + Squeeze would replace Gather + Unsqueeze only
        "dim-read-shared-shape",
        model(
            "<int64 i = {1}, int64[1] z = {0}, int64 zero = {0}, int64 one = {1}> {"
            " s = Shape(x)\n g = Gather(s, i)\n u = Unsqueeze(g, z)\n"
            " y = Concat <axis = 0> (u, s)\n r = Range(zero, g, one) }",
            inputs="float[N,T,4] x",
            outputs="int64[4] y, int64[T] r",
            opset=17,
        ),
        "merging would remove nothing",
    ),
    (
        "cast-lossy-f16",
        model("{ a = Cast <to = 10> (x)\n b = Cast <to = 1> (a)\n y = Relu(b) }"),
        "FLOAT -> FLOAT16 is not exact",
    ),
    (
        "cast-int-float-int",
        model(
            "{ a = Cast <to = 11> (x)\n b = Cast <to = 3> (a)\n y = Abs(b) }",
            inputs="int32[5] x",
            outputs="int8[5] y",
        ),
        "differs from one cast when out of range",
    ),
    (
        "cast-narrowing-first",
        model(
            "{ a = Cast <to = 6> (x)\n b = Cast <to = 7> (a)\n y = Abs(b) }",
            inputs="int64[5] x",
            outputs="int64[5] y",
        ),
        "INT64 -> INT32 is not exact",
    ),
    (
        "reshape-copy-symbolic",
        model(
            "<int64[2] s1 = {-1, 4}, int64[2] s2 = {0, -1}> { a = Reshape(x, s1)\n b = Reshape(a, s2)\n y = Relu(b) }",
            inputs="float[N,8] x",
            outputs="float[M,4] y",
        ),
        "copies dim 0",
    ),
    (
        "reshape-dynamic-target",
        model(
            "<int64[2] s1 = {-1, 4}> { a = Reshape(x, s1)\n b = Reshape(a, s)\n y = Relu(b) }",
            inputs="float[2,8] x, int64[2] s",
            outputs="float[M,K] y",
        ),
        "not a constant",
    ),
    (
        "reshape-of-reordering-transpose",
        model(
            "<int64[2] s = {-1, 4}> { a = Transpose <perm = [1, 0, 2]> (x)\n"
            " b = Reshape(a, s)\n y = Relu(b) }",
            inputs="float[2,3,4] x",
            outputs="float[6,4] y",
        ),
        "reorders axes that are not provably of size 1",
    ),
    (
        "slice-negative-on-symbolic",
        model(
            "<int64[1] s = {1}, int64[1] e = {-1}, int64[1] a = {0}>"
            " { p = Slice(x, s, e, a)\n q = Slice(p, s, e, a)\n y = Relu(q) }",
            inputs="float[N,4] x",
            outputs="float[M,4] y",
        ),
        "negative indices on a symbolic dim",
    ),
    (
        "slice-negative-step",
        model(
            "<int64[1] s = {-1}, int64[1] e = {-100}, int64[1] a = {0}, int64[1] st = {-1}>"
            " { p = Slice(x, s, e, a, st)\n q = Slice(p, s, e, a, st)\n y = Relu(q) }"
        ),
        "negative step",
    ),
    (
        "slice-dynamic-starts",
        model(
            "<int64[1] e = {3}, int64[1] a = {0}> { p = Slice(x, s, e, a)\n q = Slice(p, s, e, a)\n y = Relu(q) }",
            inputs="float[4,4] x, int64[1] s",
            outputs="float[M,4] y",
        ),
        "starts input 's' is not a constant",
    ),
    (
        "concat-other-axis",
        model(
            "{ a = Concat <axis = 1> (x, x)\n b = Concat <axis = 0> (a, a)\n y = Relu(b) }",
            outputs="float[4,6,4] y",
        ),
        "joins along another axis",
    ),
    (
        "concat-inner-shared",
        model(
            "{ a = Concat <axis = 1> (x, x)\n b = Concat <axis = 1> (a, x)\n r = Relu(a)\n y = Concat <axis = 0> (b, b) }",
            outputs="float[4,9,4] y",
        ),
        "other users",
    ),
    (
        "unsqueeze-dynamic-axes",
        model(
            "<int64[1] a1 = {0}> { a = Unsqueeze(x, a1)\n b = Unsqueeze(a, k)\n y = Relu(b) }",
            inputs="float[2,3,4] x, int64[1] k",
            outputs="float[1,1,2,3,4] y",
        ),
        "axes input 'k' is not a constant",
    ),
    (
        "dim-read-before-opset-15",
        model(
            "<int64 i = {1}, int64[1] z = {0}> { s = Shape(x)\n g = Gather(s, i)\n"
            " u = Unsqueeze(g, z)\n y = Concat <axis = 0> (u, u) }",
            inputs="float[N,T,4] x",
            outputs="int64[2] y",
        ),
        "need opset 15",
    ),
]


@pytest.mark.parametrize(
    ("text", "reason"), [c[1:] for c in NEGATIVE], ids=[c[0] for c in NEGATIVE]
)
def test_keeps_chain_that_cannot_merge(text: str, reason: str) -> None:
    assert_refuses(MergeConsecutiveOpsPass, text, reason)


def test_identity_transposes_ending_at_graph_output_from_input_are_kept() -> None:
    text = model("{ a = Transpose <perm = [0, 2, 1]> (x)\n y = Transpose <perm = [0, 2, 1]> (a) }")
    assert_refuses(MergeConsecutiveOpsPass, text, "replacement is a graph input")


def test_merged_transpose_at_graph_output_keeps_its_name() -> None:
    text = model(
        "{ r = Relu(x)\n a = Transpose <perm = [1, 0, 2]> (r)\n y = Transpose <perm = [0, 2, 1]> (a) }",
        outputs="float[3,4,2] y",
    )
    optimized = assert_rewrites(MergeConsecutiveOpsPass, text, {T: 1}, ["Relu", "Transpose"])
    assert [v.name for v in optimized.graph.outputs] == ["y"]


def test_exact_widening_table_is_exact() -> None:
    """Every listed A -> B keeps A's extreme integers (and for floats, widening is exact by IEEE)."""
    import onnx_ir as ir

    for source, targets in EXACT_WIDENING.items():
        src = source.numpy()
        if not np.issubdtype(src, np.integer):
            continue  # bool -> anything keeps 0/1; float widening is exact by IEEE 754
        info = np.iinfo(src)
        values = np.array([info.min, info.max, info.max - 1], dtype=src)
        for target in targets:
            assert (values.astype(target.numpy()).astype(src) == values).all(), (source, target)
            assert target != ir.DataType.STRING


def test_merge_inside_a_function_adds_a_constant_node() -> None:
    text = """<ir_version: 8, opset_import: ["" : 13, "local" : 1]>
g (float[2,3] x) => (float[1,2,1,3,1] y) { y = local.F(x) }
<domain: "local", opset_import: ["" : 13]>
F (a) => (b) {
  a1 = Constant <value = int64[1] {1}> ()
  a2 = Constant <value = int64[2] {0, 4}> ()
  u = Unsqueeze(a, a1)
  b = Unsqueeze(u, a2)
}"""
    original = load(text)
    result = MergeConsecutiveOpsPass()(original.clone())
    assert dict(result.stats) == {"Unsqueeze∘Unsqueeze": 1}
    function = next(iter(result.model.functions.values()))
    assert [n.op_type for n in function][-2:] == ["Constant", "Unsqueeze"]
    assert validate(original, result.model).passed
    assert not MergeConsecutiveOpsPass()(result.model).modified


def test_merge_inside_a_branch_adds_a_branch_initializer() -> None:
    text = model(
        "{ c = ReduceSum <keepdims = 0> (x)\n b = Greater(c, c)\n"
        " y = If(b) <then_branch = t () => (float[1,1,2,3,4] o1) {"
        " a1 = Constant <value = int64[1] {0}> ()\n u = Unsqueeze(x, a1)\n o1 = Unsqueeze(u, a1) },"
        " else_branch = e () => (float[1,1,2,3,4] o2) {"
        " a2 = Constant <value = int64[2] {0, 1}> ()\n o2 = Unsqueeze(x, a2) }> }",
        outputs="float[1,1,2,3,4] y",
    )
    original = load(text)
    result = MergeConsecutiveOpsPass()(original.clone())
    assert dict(result.stats) == {"Unsqueeze∘Unsqueeze": 1}
    branch = next(iter(result.model.graph.subgraphs()))
    assert [n.op_type for n in branch] == ["Constant", "Unsqueeze"]
    assert len(branch.initializers) == 1
    assert validate(original, result.model).passed
    assert not MergeConsecutiveOpsPass()(result.model).modified


@settings(max_examples=300, deadline=None)
@given(
    dim=st.integers(0, 12),
    inner=st.tuples(st.integers(-15, 15), st.integers(-15, 15), st.integers(1, 3)),
    outer=st.tuples(st.integers(-15, 15), st.integers(-15, 15), st.integers(1, 3)),
    symbolic=st.booleans(),
)
def test_compose_slices_matches_two_slices(
    dim: int, inner: tuple[int, int, int], outer: tuple[int, int, int], symbolic: bool
) -> None:
    composed = compose_slices(inner, outer, None if symbolic else dim, None)
    if isinstance(composed, str):
        assert symbolic and min(*inner[:2], *outer[:2]) < 0
        return
    data = np.arange(dim)
    expected = data[slice(*inner)][slice(*outer)]
    np.testing.assert_array_equal(data[slice(*composed)], expected)


@settings(max_examples=200, deadline=None)
@given(rank=st.integers(0, 3), data=st.data())
def test_merged_unsqueeze_and_squeeze_axes(rank: int, data: st.DataObject) -> None:
    source = np.zeros(tuple(range(2, 2 + rank)))
    first = data.draw(st.lists(st.integers(0, rank), min_size=1, max_size=2, unique=True))
    middle = np.expand_dims(source, tuple(first))
    second = data.draw(st.lists(st.integers(0, middle.ndim), min_size=1, max_size=2, unique=True))
    final = np.expand_dims(middle, tuple(second))
    merged = merge_unsqueeze_axes(first, second)
    assert np.expand_dims(source, merged).shape == final.shape
    # Squeezing the same dims back in two steps is one Squeeze of the merged axes.
    assert np.squeeze(final, merge_squeeze_axes(second, first)).shape == source.shape


def test_reshape_chain_with_a_shared_inner_reshape_is_left_alone() -> None:
    # The inner Reshape also feeds a Shape: merging would keep it and only hide the chain (attention's
    # head merge looks exactly like this in TorchScript GPT-2 exports).
    text = model(
        """{
            inner = Reshape(x, t1)
            outer = Reshape(inner, t2)
            s = Shape(inner)
            y = Relu(outer)
        }""".replace(
            "{",
            "{\n            t1 = Constant<value = int64[2] {2, 12}>()\n            t2 = Constant<value = int64[1] {24}>()",
            1,
        ),
        outputs="float[24] y, int64[2] s",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "has other users; merging would remove nothing")


# Transpose past Add/Sub/Mul/Div --------------------------------------------------------------

PAST = "{op}(Transpose, Transpose)->Transpose({op})"

# ConvNeXt's residual stream in miniature (perm [0, 2, 1] is its own inverse): each block's
# "conv" (Neg) reads the channels-first stream, its "MLP" (Relu) runs channels-last, and the
# residual Add adds two Transposes. The stream moves to channels-last; the stage's last
# Transpose then meets its inverse and both go.
CONVNEXT_LIKE = model(
    "{ s0 = Transpose <perm = [0, 2, 1]> (x)\n"
    " c1 = Neg(s0)\n t1 = Transpose <perm = [0, 2, 1]> (c1)\n h1 = Relu(t1)\n"
    " b1 = Transpose <perm = [0, 2, 1]> (h1)\n s1 = Add(s0, b1)\n"
    " c2 = Neg(s1)\n t2 = Transpose <perm = [0, 2, 1]> (c2)\n h2 = Relu(t2)\n"
    " b2 = Transpose <perm = [0, 2, 1]> (h2)\n s2 = Add(s1, b2)\n"
    " y = Transpose <perm = [0, 2, 1]> (s2) }",
)


def test_transposes_move_down_a_residual_stream_to_their_inverse() -> None:
    optimized = assert_rewrites(
        MergeConsecutiveOpsPass,
        CONVNEXT_LIKE,
        {PAST.format(op="Add"): 2, T: 1},
        [
            "Transpose",
            "Neg",
            "Transpose",
            "Relu",
            "Add",
            "Transpose",
            "Neg",
            "Transpose",
            "Relu",
            "Add",
        ],
    )
    assert [n.op_type for n in optimized.graph].count("Transpose") == 4  # 6 before


@pytest.mark.parametrize(
    ("text", "stats", "ops"),
    [
        (
            model(
                "{ r = Relu(x)\n a = Transpose <perm = [1, 2, 0]> (x)\n"
                " b = Transpose <perm = [1, 2, 0]> (r)\n d = Sub(a, b)\n y = Relu(d) }",
                outputs="float[3,4,2] y",
            ),
            {PAST.format(op="Sub"): 1},
            ["Relu", "Sub", "Transpose", "Relu"],
        ),
        (
            model(
                "{ r = Relu(x)\n a = Transpose(x)\n b = Transpose(r)\n d = Div(b, a)\n"
                " y = Transpose(d) }",
                inputs="float[2,3,4] x",
            ),
            {PAST.format(op="Div"): 1, T: 1},
            ["Relu", "Div"],
        ),
        (
            model(
                "{ a = Transpose <perm = [0, 2, 1]> (x)\n d = Mul(a, a)\n y = Relu(d) }",
                outputs="float[2,4,3] y",
            ),
            {PAST.format(op="Mul"): 1},
            ["Mul", "Transpose", "Relu"],
        ),
    ],
    ids=["sub-both-die", "div-default-perms-then-inverse", "mul-same-transpose-twice"],
)
def test_transpose_moves_past_an_elementwise_op(
    text: str, stats: dict[str, int], ops: list[str]
) -> None:
    assert_rewrites(MergeConsecutiveOpsPass, text, stats, ops)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            model(
                "{ r = Relu(x)\n a = Transpose <perm = [0, 2, 1]> (x)\n"
                " b = Transpose <perm = [1, 0, 2]> (r)\n y = Add(a, b) }",
                inputs="float[3,3,3] x",
                outputs="float[3,3,3] y",
            ),
            "input Transposes have different perms",
        ),
        (
            model(
                "{ r = Relu(x)\n a = Transpose <perm = [0, 2, 1]> (x)\n"
                " b = Transpose <perm = [0, 2, 1]> (r)\n c = Add(a, b)\n y = Sum(c, a, b) }",
                outputs="float[2,4,3] y",
            ),
            "both input Transposes have other users",
        ),
        (
            model(
                "<float[1,3,1] s = {1, 2, 3}> { a = Transpose <perm = [0, 2, 1]> (x)\n"
                " b = Transpose <perm = [0, 2, 1]> (s)\n c = Mul(a, b)\n y = Add(c, a) }",
                outputs="float[2,4,3] y",
            ),
            "may be larger than the Transposes it replaces",
        ),
        (
            model(
                "{ r = Relu(x)\n a = Transpose <perm = [0, 2, 1]> (x)\n"
                " b = Transpose <perm = [0, 2, 1]> (r)\n c = Add(a, b)\n y = Relu(c) }",
                outputs="float[2,4,3] y",
                opset=6,
            ),
            "before opset 7",
        ),
    ],
    ids=["different-perms", "shared-transposes", "broadcast-grows", "opset-6"],
)
def test_transpose_stays_before_an_elementwise_op(text: str, reason: str) -> None:
    assert_refuses(MergeConsecutiveOpsPass, text, reason)


ROUND_TRIP = "Transpose∘row-wise ops∘Transpose"
_PROJECTION = "<float[4,5] w = {WEIGHTS}, float[5] b = {1, 2, 3, 4, 5}>".replace(
    "WEIGHTS", ", ".join(str(v) for v in range(20))
)


def test_transposes_around_a_projection_and_its_bias_cancel() -> None:
    # torch's sequence-first attention output: [B, S, D] moved to [S, B, D], projected, moved back
    text = model(
        _PROJECTION + " { a = Transpose <perm = [1, 0, 2]> (x)\n m = MatMul(a, w)\n"
        " c = Add(b, m)\n y = Transpose <perm = [1, 0, 2]> (c) }",
        inputs="float[N,T,4] x",
        outputs="float[N,T,5] y",
    )
    assert_rewrites(MergeConsecutiveOpsPass, text, {ROUND_TRIP: 1}, ["MatMul", "Add"], 2)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n m = MatMul(a, w)\n"
            " y = Transpose <perm = [0, 2, 1]> (m) }",
            "moves the last axis",
        ),
        (
            "{ a = Transpose <perm = [1, 0, 2]> (x)\n m = MatMul(a, w)\n"
            " y = Transpose <perm = [1, 2, 0]> (m) }",
            "does not undo the first",
        ),
    ],
    ids=["last-axis-moved", "not-inverse"],
)
def test_transposes_around_a_projection_stay(body: str, reason: str) -> None:
    outputs = "float[4,T,5] y" if "[1, 0, 2]> (x)" in body else "float[4,5,T] y"
    text = model(
        "<float[4,4] w = {" + ", ".join(["0.5"] * 16) + "}> " + body,
        inputs="float[4,T,4] x",
        outputs=outputs if "1, 2, 0" not in body else "float[T,4,4] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, reason)


@pytest.mark.parametrize(
    "body",
    [
        # the bias differs per row: moving the rows would move it too
        "<float[4,4] w = {W}, float[2,1,4] r = {R}> { a = Transpose <perm = [1, 0, 2]> (x)\n"
        " m = MatMul(a, w)\n c = Add(m, r)\n y = Transpose <perm = [1, 0, 2]> (c) }",
        # the projection's result has a second reader, which wants the moved rows
        "<float[4,4] w = {W}, float[2,1,4] r = {R}> { a = Transpose <perm = [1, 0, 2]> (x)\n"
        " m = MatMul(a, w)\n t = Transpose <perm = [1, 0, 2]> (m)\n y = Add(t, m) }",
    ],
    ids=["per-row-bias", "shared-result"],
)
def test_transposes_around_other_ops_stay(body: str) -> None:
    weights = ", ".join(["0.5"] * 16)
    text = model(
        body.replace("{W}", "{" + weights + "}").replace("{R}", "{1, 2, 3, 4, 5, 6, 7, 8}"),
        inputs="float[2,2,4] x",
        outputs="float[2,2,4] y",
    )
    before = load(text)
    ops = [node.op_type for node in before.graph]
    result = MergeConsecutiveOpsPass()(before)
    assert ROUND_TRIP not in result.stats
    assert [node.op_type for node in result.model.graph] == ops


# Concat of same-perm Transposes ------------------------------------------------------------

CONCAT_PAST = "Concat(Transposes)->Transpose(Concat)"


@pytest.mark.parametrize(
    ("body", "outputs", "stats", "ops"),
    [
        (
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n b = Transpose <perm = [0, 2, 1]> (u)\n"
            " c = Concat <axis = 1> (a, b)\n y = Relu(c) }",
            "float[2,9,3] y",
            {CONCAT_PAST: 1},
            ["Concat", "Transpose", "Relu"],
        ),
        (  # a negative axis, and the moved Transpose meets its inverse
            "{ a = Transpose <perm = [2, 0, 1]> (x)\n b = Transpose <perm = [2, 0, 1]> (u)\n"
            " c = Concat <axis = -3> (a, b)\n y = Transpose <perm = [1, 2, 0]> (c) }",
            "float[2,3,9] y",
            {CONCAT_PAST: 1, T: 1},
            ["Concat"],
        ),
    ],
    ids=["moves", "meets-inverse"],
)
def test_transpose_moves_past_a_concat(
    body: str, outputs: str, stats: dict[str, int], ops: list[str]
) -> None:
    text = model(body, "float[2,3,4] x, float[2,3,5] u", outputs)
    assert_rewrites(MergeConsecutiveOpsPass, text, stats, ops)


@pytest.mark.parametrize(
    ("body", "outputs", "reason"),
    [
        (
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n b = Transpose <perm = [0, 1, 2]> (u)\n"
            " c = Concat <axis = 2> (a, b)\n y = Relu(c) }",
            "float[2,4,7] y",
            "input Transposes have different perms",
        ),
        (
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n b = Transpose <perm = [0, 2, 1]> (x)\n"
            " c = Concat <axis = 2> (a, b)\n y = Relu(c)\n z = Relu(b) }",
            "float[2,4,6] y, float[2,4,3] z",
            "has other users: moving would add a node",
        ),
        (
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n c = Concat <axis = 2> (a, a)\n y = Relu(c) }",
            "float[2,4,6] y",
            "fewer than two Transposes",
        ),
    ],
    ids=["perms-differ", "shared-transpose", "one-transpose-twice"],
)
def test_transposes_into_a_concat_stay(body: str, outputs: str, reason: str) -> None:
    text = model(body, "float[2,3,4] x, float[2,4,4] u", outputs)
    assert_refuses(MergeConsecutiveOpsPass, text, reason)


# A Dense written as TensorFlow's Tensordot (tf2onnx): x [B, S, 8] viewed as [-1, 8], one 2-D
# MatMul, the product viewed back; the target reads B and S off x as tf2onnx does.
VIEWS = "Reshape∘MatMul∘flatten"
TENSORDOT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, S, 6] y{outputs}) <float[8, 6] w = {{{weights}}}, int64[2] flat = {{-1, 8}}> {{
    f = Reshape(x, flat)
    p = MatMul(f, w)
    {target}
    v = Reshape(p, t)
    y = {tail}
}}
"""
WEIGHTS = ", ".join(str(round(0.1 * i - 2.0, 1)) for i in range(48))
READ_LEADING = """s = Shape <start = 0, end = 2> (x)
    tail_dims = Constant <value = int64[1] {6}> ()
    t = Concat <axis = 0> (s, tail_dims)"""


def _tensordot(target: str, tail: str = "Relu(v)", outputs: str = "") -> str:
    return TENSORDOT.format(weights=WEIGHTS, target=target, tail=tail, outputs=outputs)


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        (_tensordot(READ_LEADING), ["Shape", "Constant", "Concat", "MatMul", "Reshape", "Relu"]),
        (
            # the head split of a query projection: [B, -1, 2, 3] straight off the 2-D product
            _tensordot(
                "s = Shape <start = 0, end = 1> (x)\n"
                "    heads = Constant <value = int64[3] {-1, 2, 3}> ()\n"
                "    t = Concat <axis = 0> (s, heads)\n"
                "    back = Constant <value = int64[3] {0, -1, 6}> ()",
                tail="Reshape(v, back)",
            ),
            ["Shape", "Constant", "Concat", "Constant", "MatMul", "Reshape", "Reshape"],
        ),
    ],
    ids=["restores-rows", "splits-heads"],
)
def test_matmul_between_views_reads_the_unflattened_input(text: str, ops: list[str]) -> None:
    optimized = assert_rewrites(MergeConsecutiveOpsPass, text, {VIEWS: 1}, ops, trials=2)
    matmul = next(node for node in optimized.graph if node.op_type == "MatMul")
    assert matmul.inputs[0] is optimized.graph.inputs[0]  # x itself, not its [-1, 8] view


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            # 0 copies a dim of the input: [B*S, 6] and [B, S, 6] differ at dim 0
            _tensordot("t = Constant <value = int64[3] {0, -1, 6}> ()"),
            "the outer target does not keep the input's leading dims",
        ),
        (
            _tensordot(
                READ_LEADING, tail="Relu(v)\n    z = Identity(p)", outputs=", float[M, 6] z"
            ),
            "the 2-D product has other users",
        ),
    ],
    ids=["copies-a-dim", "product-read-elsewhere"],
)
def test_matmul_between_views_stays(text: str, reason: str) -> None:
    assert_refuses(MergeConsecutiveOpsPass, text, reason)


def test_reshape_back_to_a_shared_inner_reshapes_input_is_that_input() -> None:
    # tf2onnx's mean of a [B, D, T] stream: viewed as [B, T, 1] for one reader and back to
    # [B, 1, T] for another, which then reads the mean itself
    text = model(
        "<int64[3] t1 = {-1, 6, 1}, int64[3] t2 = {-1, 1, 6}> {"
        " m = ReduceMean <axes = [1]> (x)\n inner = Reshape(m, t1)\n outer = Reshape(inner, t2)\n"
        " r = Relu(inner)\n y = Sub(x, outer) }",
        inputs="float[B,3,6] x",
        outputs="float[B,3,6] y, float[B,6,1] r",
    )
    assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"Reshape∘Reshape": 1},
        ["ReduceMean", "Reshape", "Relu", "Sub"],
        2,
    )


def test_reshape_back_to_the_shape_read_at_run_time_is_the_input() -> None:
    # jax2tf around Flax's head mask: the probabilities viewed as [H, 1, -1] and reshaped back to
    # their own Shape, which may hold no 0 the merge could misread: the input itself
    text = model(
        "<int64[3] t = {4, 1, -1}> { v = Reshape(x, t)\n s = Shape(x)\n b = Reshape(v, s)\n"
        " y = Relu(b) }",
        inputs="float[4,B,S] x",
        outputs="float[4,B,S] y",
    )
    assert_rewrites(MergeConsecutiveOpsPass, text, {"Reshape∘Reshape": 1}, ["Shape", "Relu"], 2)


def test_reshape_copying_named_dims_of_an_unsqueeze_back_is_its_input() -> None:
    # jax2tf's einsum operand: P [B, 4, S, S] unsqueezed at 2 and viewed as [0, 4, -1, 0]; the 0s
    # copy the view's B and S, which shape inference names as P's
    text = model(
        "<int64[1] a = {2}, int64[4] t = {0, 4, -1, 0}> { u = Unsqueeze(x, a)\n"
        " r = Reshape(u, t)\n y = Relu(r) }",
        inputs="float[B,4,S,S] x",
        outputs="float[B,4,S,S] y",
    )
    assert_rewrites(MergeConsecutiveOpsPass, text, {"Reshape∘Unsqueeze": 1}, ["Relu"], 2)


# Transpose hoisted above Add/Sub/Mul/Div toward its inverse -------------------------------------

HOIST = "Transpose(op(x, Transpose⁻¹))->op(Transpose(x))"

# TF Whisper's encoder as tf2onnx leaves it, in miniature: the residual stream s stays [B, D, T]
# (perm [0, 2, 1] is its own inverse), each block reads it transposed (Neg stands for the norm and
# the block) and its output is transposed back into the stream; the last norm reads it transposed.
CHANNELS_FIRST_STREAM = model(
    "{ s0 = Relu(x)\n n0 = Transpose <perm = [0, 2, 1]> (s0)\n h0 = Neg(n0)\n"
    " b0 = Transpose <perm = [0, 2, 1]> (h0)\n s1 = Add(s0, b0)\n"
    " n1 = Transpose <perm = [0, 2, 1]> (s1)\n h1 = Neg(n1)\n"
    " b1 = Transpose <perm = [0, 2, 1]> (h1)\n s2 = Sub(b1, s1)\n"
    " y = Transpose <perm = [0, 2, 1]> (s2) }",
    inputs="float[B,4,5] x",
    outputs="float[B,5,4] y",
)


def test_transposes_hoist_up_a_channels_first_stream() -> None:
    optimized = assert_rewrites(
        MergeConsecutiveOpsPass,
        CHANNELS_FIRST_STREAM,
        {HOIST: 2},
        ["Relu", "Transpose", "Neg", "Transpose", "Add", "Neg", "Sub"],
        2,
    )
    # five Transposes became two of one value (common-subexpression elimination merges them)
    transposes = [n for n in optimized.graph if n.op_type == "Transpose"]
    assert [t.inputs[0].name for t in transposes] == ["s0", "s0"]


def test_transpose_hoists_onto_a_constant() -> None:
    # a per-channel constant of the [B, D, T] layout is transposed with the op
    text = model(
        "<float[4,1] bias = {1, 2, 3, 4}> { h = Relu(x)\n"
        " b = Transpose <perm = [0, 2, 1]> (h)\n c = Mul(b, bias)\n"
        " y = Transpose <perm = [0, 2, 1]> (c) }",
        inputs="float[B,5,4] x",
        outputs="float[B,5,4] y",
    )
    # transposed to [1, 1, 4], then read as the [4] vector it broadcasts as
    stats = {HOIST: 1, "Mul(x, [1, ..., N])->Mul(x, [N])": 1}
    optimized = assert_rewrites(MergeConsecutiveOpsPass, text, stats, ["Relu", "Mul"], 2)
    (mul,) = [n for n in optimized.graph if n.op_type == "Mul"]
    assert mul.inputs[1].const_value.numpy().tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "body",
    [
        (  # the op's result is read by more than the Transposes
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n s = Add(x, x)\n c = Add(s, a)\n"
            " y = Transpose <perm = [0, 2, 1]> (c)\n r = Relu(c) }"
        ),
        (  # the inverse Transpose is read elsewhere too: moving would add a node
            "{ a = Transpose <perm = [0, 2, 1]> (x)\n c = Add(x, a)\n"
            " y = Transpose <perm = [0, 2, 1]> (c)\n r = Relu(a) }"
        ),
        (  # no operand is the inverse Transpose
            "{ a = Transpose <perm = [1, 0, 2]> (x)\n c = Add(x, a)\n"
            " y = Transpose <perm = [0, 2, 1]> (c)\n r = Relu(x) }"
        ),
    ],
    ids=["other-reader", "shared-inverse", "no-inverse"],
)
def test_transpose_is_not_hoisted(body: str) -> None:
    text = model(body, inputs="float[4,4,4] x", outputs="float[4,4,4] y, float[4,4,4] r")
    result = MergeConsecutiveOpsPass()(load(text))
    assert HOIST not in result.stats
    assert [n.op_type for n in result.model.graph].count("Transpose") == 2


def test_transpose_in_a_branch_is_not_hoisted_out_of_it() -> None:
    # the op and its inverse Transpose are the outer graph's; the reading Transpose is a branch's
    text = model(
        "{ a = Transpose <perm = [0, 2, 1]> (x)\n c = Add(x, a)\n"
        " y = If (cond) <then_branch = g1 () => (float[4,4,4] t) {"
        " t = Transpose <perm = [0, 2, 1]> (c) },"
        " else_branch = g2 () => (float[4,4,4] e) { e = Transpose <perm = [0, 2, 1]> (c) }> }",
        inputs="float[4,4,4] x, bool cond",
        outputs="float[4,4,4] y",
    )
    original = load(text)
    result = MergeConsecutiveOpsPass()(original.clone())
    assert HOIST not in result.stats
    assert validate(original, result.model).passed


KEEP = "Reshape∘Reduce(keepdims=0)->Reduce(keepdims=1)"


@pytest.mark.parametrize(
    ("body", "rule", "outputs"),
    [
        # the dynamo exporter's x.var(-1, keepdim=True): keepdims=0, then a view to [b, s, 1]
        (
            "<int64[1] a = {2}, int64[3] t = {0, 0, 1}> { r = ReduceMean<keepdims=0>(x, a)\n"
            " v = Reshape(r, t)\n y = Relu(v) }",
            KEEP,
            "float[2,3,1] y",
        ),
        (
            "<int64[1] a = {-2}, int64[3] t = {2, -1, 4}> { r = ReduceMean<keepdims=0>(x, a)\n"
            " v = Reshape(r, t)\n y = Relu(v) }",
            KEEP,
            "float[2,1,4] y",
        ),
        (
            "<int64[1] a = {1}> { r = ReduceSum<keepdims=0>(x, a)\n v = Unsqueeze(r, a)\n y = Relu(v) }",
            KEEP.replace("Reshape", "Unsqueeze"),
            "float[2,1,4] y",
        ),
        # every axis (no axes given): a scalar viewed as [1, 1, 1]
        (
            "<int64[3] t = {1, 1, 1}> { r = ReduceMax<keepdims=0>(x)\n v = Reshape(r, t)\n y = Relu(v) }",
            KEEP,
            "float[1,1,1] y",
        ),
    ],
)
def test_a_view_that_puts_the_reduced_axes_back_keeps_the_dims(
    body: str, rule: str, outputs: str
) -> None:
    text = model(body, outputs=outputs, opset=18)
    reduce = next(w for w in ("ReduceMean", "ReduceSum", "ReduceMax") if w in body)
    optimized = assert_rewrites(MergeConsecutiveOpsPass, text, {rule: 1}, [reduce, "Relu"])
    node = next(iter(optimized.graph))
    assert node.attributes.get_int("keepdims", 1) == 1


@pytest.mark.parametrize(
    ("body", "outputs", "reason"),
    [
        # the 1 goes after the kept dims: the same elements in another shape
        (
            "<int64[1] a = {1}, int64[3] t = {2, 4, 1}> { r = ReduceMean<keepdims=0>(x, a)\n"
            " v = Reshape(r, t)\n y = Relu(v) }",
            "float[2,4,1] y",
            "target dim 1 is 4, not the reduced axis' 1",
        ),
        (
            "<int64[1] a = {1}, int64[1] b = {2}> { r = ReduceMean<keepdims=0>(x, a)\n"
            " v = Unsqueeze(r, b)\n y = Relu(v) }",
            "float[2,4,1] y",
            "the Unsqueeze adds other axes than the reduction dropped",
        ),
        (
            "<int64[1] a = {2}, int64[3] t = {0, 0, 1}> { r = ReduceMean<keepdims=0>(x, a)\n"
            " v = Reshape(r, t)\n w = Relu(r)\n y = Add(v, w) }",
            "float[2,3,3] y",
            "the reduction has other users",
        ),
    ],
)
def test_a_view_that_moves_the_reduced_data_stays(body: str, outputs: str, reason: str) -> None:
    assert_refuses(MergeConsecutiveOpsPass, model(body, outputs=outputs, opset=18), reason)


UNIT_AXES = "Reshape(dims and ones)->Unsqueeze"


def _reshape_to_read_dims(target: str, grid: str = "B, 1, 1, T") -> str:
    """A [B, T] mask flattened, then reshaped to a shape read at run time (TorchScript's
    ``mask[batch_idx, kv_idx]`` reshaped to its index grid's shape)."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool[B, T] keep, int64[{grid}] grid) => (bool[{grid}] y) <
            int64[1] flat_shape = {{-1}}, int64[2] ones = {{1, 1}}
        > {{
            flat = Reshape(keep, flat_shape)
            {target}
            y = Reshape(flat, s)
        }}
    """


@pytest.mark.parametrize(
    ("target", "ops"),
    [
        ("s = Shape(grid)", ["Reshape", "Shape", "Unsqueeze"]),
        (
            "b = Shape <start = 0, end = 1> (keep)\n            t = Shape <start = 1> (keep)\n"
            "            s = Concat <axis = 0> (b, ones, t)",
            ["Reshape", "Shape", "Shape", "Concat", "Unsqueeze"],
        ),
    ],
)
def test_a_reshape_to_read_dims_and_ones_becomes_an_unsqueeze(target: str, ops: list[str]) -> None:
    rewritten = assert_rewrites(
        MergeConsecutiveOpsPass, _reshape_to_read_dims(target), {UNIT_AXES: 1}, ops, trials=2
    )
    unsqueeze = next(node for node in rewritten.graph if node.op_type == "Unsqueeze")
    assert unsqueeze.inputs[0] is rewritten.graph.inputs[0]  # the mask itself, not its view
    assert unsqueeze.inputs[1].const_value.numpy().tolist() == [1, 2]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "grid",
    [
        "T, 1, 1, B",  # the dims swapped: a transpose's shape, not a view's
        "B, 2, 1, T",  # an entry that is not 1
        "B, 1, 1, C",  # a dim not provably the mask's
    ],
)
def test_a_reshape_to_other_read_dims_stays(grid: str) -> None:
    text = _reshape_to_read_dims("s = Shape(grid)", grid)
    assert_refuses(MergeConsecutiveOpsPass, text, "not the reshaped tensor's dims with ones")
