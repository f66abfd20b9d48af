"""The rules that take tf2onnx's einsum lowering and select arithmetic back to plain views.

Each model below is the smallest graph of the form tf2onnx writes for Keras' MultiHeadAttention
and EinsumDense (``scripts/export_tf_models.py`` makes real ones: tests/data/tf2onnx/keras-*.onnx,
checked end to end in test_tf2onnx_forms.py). Every positive case is run on ONNX Runtime against
the original, and run again to show the rewrite is done.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir
import pytest

from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.merge_consecutive_ops import MergeConsecutiveOpsPass
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

BATCH_VIEWS = "Reshape∘MatMul∘batch views"

# x viewed as [prod(dims 0, 1), -1, dim 3], as tf2onnx flattens an einsum's batch letters
_FLATTEN = (
    " s{v} = Shape({v})\n g{v} = Gather(s{v}, lead)\n p{v} = ReduceProd(g{v})\n"
    " k{v} = Gather(s{v}, three)\n t{v} = Concat<axis=0>(p{v}, m1, k{v})\n v{v} = Reshape({v}, t{v})\n"
)
_CONSTANTS = (
    "<int64[1] m1 = {-1}, int64[2] lead = {0, 1}, int64[1] two = {2}, int64[1] three = {3},"
    " int64[1] four = {4}, int64[1] one = {1}>"
)


def _batched_scores(view_batch: str) -> str:
    """K @ Q^T on flattened batches, viewed back as 5-D with ``view_batch`` and squeezed."""
    return model(
        _CONSTANTS
        + "{"
        + _FLATTEN.format(v="a")
        + _FLATTEN.format(v="b")
        + " wb = Transpose<perm=[0,2,1]>(vb)\n p = MatMul(va, wb)\n g = Max(ga, gb)\n"
        + " ra = Gather(sa, two)\n rb = Gather(sb, two)\n"
        + f" tc = Concat<axis=0>({view_batch}, ra, rb, one)\n c5 = Reshape(p, tc)\n"
        + " c4 = Squeeze(c5, four)\n y = Relu(c4) }",
        inputs="float[2,3,5,4] a, float[2,3,6,4] b",
        outputs="float[2,3,5,6] y",
    )


def _checked(text: str, stats: Mapping[str, int]) -> ir.Model:
    """Run merge-consecutive-ops: exactly ``stats`` (among the rules these tests are about),
    equal outputs on ORT, and nothing left to do on a second run."""
    original = load(text)
    result = MergeConsecutiveOpsPass()(original.clone())
    assert dict(result.stats) == dict(stats)
    report = validate(original, result.model)
    assert report.passed, report
    assert not MergeConsecutiveOpsPass()(result.model).modified
    return result.model


def test_batched_matmul_keeps_the_batch_dims() -> None:
    optimized = _checked(_batched_scores("g"), {BATCH_VIEWS: 1, "Squeeze∘Reshape": 1})
    InferShapesPass()(optimized)
    matmul = next(node for node in optimized.graph if node.op_type == "MatMul")
    view, swapped = (value.producer() for value in matmul.inputs if value is not None)
    assert (
        view is not None and view.outputs[0].shape is not None and len(view.outputs[0].shape) == 4
    )
    assert swapped is not None and list(swapped.attributes.get_ints("perm", ())) == [0, 1, 3, 2]


def test_batched_matmul_refuses_two_batches_and_a_minus_one_view() -> None:
    # With a -1 the view takes any count: the two products could both fit it, differently
    # paired, were the batches not letter for letter the same.
    text = (
        _batched_scores("g")
        .replace("tc = Concat<axis=0>(g, ra, rb, one)", "tc = Concat<axis=0>(g, m1, rb, one)")
        .replace("c4 = Squeeze(c5, four)\n y = Relu(c4)", "y = Relu(c5)")
        .replace("float[2,3,5,6] y", "float[2,3,5,6,1] y")
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "the product's view may take a -1 or 0")


def test_squeeze_of_reshape_drops_the_squeezed_entries() -> None:
    text = model(
        "<int64[4] t = {2, 3, 1, 4}, int64[1] a = {2}> { r = Reshape(x, t)\n s = Squeeze(r, a)\n y = Relu(s) }",
        inputs="float[2,12] x",
        outputs="float[2,3,4] y",
    )
    assert_rewrites(MergeConsecutiveOpsPass, text, {"Squeeze∘Reshape": 1}, ["Reshape", "Relu"])


def test_squeeze_of_reshape_to_a_scalar_views_to_an_empty_target() -> None:
    # every entry squeezed: the view is Reshape(x, []), a scalar (fuzz seeds 2298, 2574 of
    # test_cleanup_fuzz's generator were an IndexError here)
    text = model(
        "<int64[2] t = {1, 1}, int64[2] a = {0, 1}> { r = Reshape(x, t)\n s = Squeeze(r, a)\n y = Relu(s) }",
        inputs="float[1] x",
        outputs="float y",
    )
    assert_rewrites(MergeConsecutiveOpsPass, text, {"Squeeze∘Reshape": 1}, ["Reshape", "Relu"])


def test_squeeze_of_reshape_refuses_a_copy_after_the_squeezed_axis() -> None:
    # [2, 1, 3, 0] copies x's dim 3; without the 1 the 0 would copy dim 2 instead
    text = model(
        "<int64[4] t = {2, 1, 3, 0}, int64[1] a = {1}> { r = Reshape(x, t)\n s = Squeeze(r, a)\n y = Relu(s) }",
        inputs="float[2,3,1,4] x",
        outputs="float[2,3,4] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "a 0 in the target after the squeezed axes")


_VIEWED = "\n v = Reshape(t, w)\n y = Relu(v) }"


def test_transpose_of_unsqueeze_moves_the_new_axis_after() -> None:
    text = model(
        "<int64[1] a = {1}, int64[3] w = {2, 4, 3}> { u = Unsqueeze(x, a)\n"
        " t = Transpose<perm=[0,3,1,2]>(u)" + _VIEWED,
        outputs="float[2,4,3] y",
    )
    optimized = _checked(
        text, {"Transpose∘Unsqueeze->Unsqueeze∘Transpose": 1, "Reshape∘Unsqueeze": 1}
    )
    transpose = next(iter(optimized.graph))
    assert list(transpose.attributes.get_ints("perm", ())) == [0, 2, 1]
    assert op_types(optimized) == ["Transpose", "Reshape", "Relu"]


def test_transpose_of_shared_unsqueeze_is_left() -> None:
    text = model(
        "<int64[1] a = {1}, int64[3] w = {2, 4, 3}> { u = Unsqueeze(x, a)\n"
        " t = Transpose<perm=[0,3,1,2]>(u)\n r = Relu(u)" + _VIEWED,
        outputs="float[2,4,3] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "the Unsqueeze has other users")


def test_transpose_of_unsqueeze_read_by_other_ops_is_left() -> None:
    """torch's packed in-projection, ``Squeeze(Transpose(Unsqueeze(...)))``, stays as it is for
    fuse-attention, which reads that spelling."""
    text = model(
        "<int64[1] a = {0}, int64[1] b = {-1}> { u = Unsqueeze(x, a)\n"
        " t = Transpose<perm=[3,1,2,0]>(u)\n s = Squeeze(t, b)\n y = Relu(s) }",
        outputs="float[4,2,3] y",
    )
    assert_refuses(
        MergeConsecutiveOpsPass,
        text,
        "the transposed tensor is read by something other than a Reshape",
    )


_TRANSPOSED_SCORES = (
    "{ qt = Transpose<perm=[0,1,3,2]>(q)\n s = MatMul(k, qt)\n a = Add(s, m)\n"
    " p = Softmax<axis=2>(a)\n t = Transpose<perm=[0,1,3,2]>(p)\n y = Relu(t) }"
)
_SCORE_INPUTS = "float[2,3,5,4] k, float[2,3,6,4] q, float[2,1,5,1] m"


def test_softmax_over_transposed_scores_turns_them_back() -> None:
    text = model(_TRANSPOSED_SCORES, inputs=_SCORE_INPUTS, outputs="float[2,3,6,5] y")
    optimized = _checked(
        text, {"Transpose∘Softmax(K@Q^T)->Softmax(Q@K^T)": 1, "Transpose∘Transpose": 1}
    )
    softmax = next(node for node in optimized.graph if node.op_type == "Softmax")
    assert softmax.attributes.get_int("axis", 0) == 3
    matmul = next(node for node in optimized.graph if node.op_type == "MatMul")
    assert matmul.inputs[0] is not None and matmul.inputs[0].name == "q"


def test_softmax_over_transposed_scores_needs_opset_13() -> None:
    # Softmax-11 normalizes over every axis from its axis on
    text = model(_TRANSPOSED_SCORES, inputs=_SCORE_INPUTS, outputs="float[2,3,6,5] y", opset=12)
    assert_refuses(MergeConsecutiveOpsPass, text, "Softmax before opset 13")


def test_bias_on_split_heads_moves_before_the_split() -> None:
    text = model(
        "<int64[4] t = {2, 5, 3, 4}, float[3,4] b = {1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.}>"
        " { r = Reshape(x, t)\n a = Add(r, b)\n y = Relu(a) }",
        inputs="float[2,5,12] x",
        outputs="float[2,5,3,4] y",
    )
    assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"Add(Reshape, bias)->Reshape(Add)": 1},
        ["Add", "Reshape", "Relu"],
    )


def test_bias_of_other_shape_stays_after_the_split() -> None:
    text = model(
        "<int64[4] t = {2, 5, 3, 4}, float[4,1] b = {1., 2., 3., 4.}>"
        " { r = Reshape(x, t)\n a = Add(r, b)\n y = Relu(a) }",
        inputs="float[2,5,12] x",
        outputs="float[2,5,3,4] y",
    )
    assert_refuses(
        MergeConsecutiveOpsPass, text, "the bias is not the shape of the view's last dims"
    )


_SELECT = (
    "{{ c = Cast<to=1>(f)\n n = Not(f)\n d = Cast<to=1>(n)\n on = Mul(c, x)\n off = Mul({k}, d)\n"
    " s = Add(on, off)\n y = Relu(s) }}"
)


def test_select_written_as_arithmetic_is_a_where() -> None:
    text = model(
        "<float k = {-1e9}>" + _SELECT.format(k="k"),
        inputs="bool[2,3,4] f, float[2,3,4] x",
    )
    assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"f*x+(1-f)*k->Where": 1},
        ["Cast", "Not", "Cast", "Where", "Relu"],
    )


_INT_SELECT = (
    "<int32 n = {{64}}, int32 zero = {{0}}> {{ a = Add(ids, n)\n l = Less(ids, zero)\n"
    " c = Cast<to={to}>(l)\n u = Not(l)\n d = Cast<to={to}>(u)\n on = Mul(c, a)\n"
    " off = Mul(d, ids)\n s = Add(on, off)\n y = {out} }}"
)


def test_select_of_two_integer_tensors_is_a_where() -> None:
    """Keras 3's ``take``: ``where(ids < 0, ids + n, ids)``, which tf2onnx writes as
    ``Cast(c) * (ids + n) + Cast(!c) * ids`` on int32: exact on integers."""
    text = model(
        _INT_SELECT.format(to=6, out="Cast<to=7>(s)"),
        inputs="int32[2,5] ids",
        outputs="int64[2,5] y",
    )
    optimized = _checked(text, {"f*x+(1-f)*k->Where": 1})
    assert op_types(optimized) == [
        "Add",
        "Less",
        "Cast",
        "Not",
        "Cast",
        "Where",
        "Cast",
    ]  # the flags die in DCE


def test_select_of_two_float_tensors_is_left() -> None:
    # 0 * inf is NaN: on floats only a finite constant fill is a select
    text = model(
        "{ c = Cast<to=1>(f)\n n = Not(f)\n d = Cast<to=1>(n)\n on = Mul(c, x)\n"
        " off = Mul(d, z)\n s = Add(on, off)\n y = Relu(s) }",
        inputs="bool[2,3,4] f, float[2,3,4] x, float[2,3,4] z",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "not one finite constant")


def test_select_of_an_infinite_constant_is_left() -> None:
    # 0 * -inf is NaN where the flag holds: no Where gives that
    text = model(
        "<float k = {-inf}>" + _SELECT.format(k="k"),
        inputs="bool[2,3,4] f, float[2,3,4] x",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "not one finite constant")


def test_select_whose_constant_would_raise_the_rank_is_left() -> None:
    text = model(
        "<float[1,1,1,1] k = {-1e9}>" + _SELECT.format(k="k"),
        inputs="bool[2,3,4] f, float[2,3,4] x",
        outputs="float[1,2,3,4] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "the constant would raise the result's rank")


def test_causal_mask_as_products_is_a_where() -> None:
    """transformers' TF GPT-2: ``w * b - 1e4 * (1 - b)`` with b a view of a cast causal band."""
    text = model(
        "<int64[3] t = {1, 5, 5}, float one = {1.0}, float k = {10000.0}> { c = Cast<to=1>(band)\n"
        " b = Reshape(c, t)\n kept = Mul(w, b)\n n = Sub(one, b)\n fill = Mul(k, n)\n"
        " s = Sub(kept, fill)\n y = Relu(s) }",
        inputs="bool[5,5] band, float[2,5,5] w",
        outputs="float[2,5,5] y",
    )
    optimized = assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"f*x-(1-f)*k->Where": 1},
        ["Cast", "Reshape", "Sub", "Reshape", "Where", "Relu"],
    )
    where = next(node for node in optimized.graph if node.op_type == "Where")
    fill = where.inputs[2].const_value if where.inputs[2] is not None else None
    assert fill is not None and fill.numpy().reshape(-1).tolist() == [-10000.0]


def test_transpose_of_a_view_that_moves_only_ones_is_the_view() -> None:
    text = model(
        "<int64[4] t = {2, 1, 5, 1}> { r = Reshape(x, t)\n p = Transpose<perm=[0,1,3,2]>(r)\n y = Relu(p) }",
        inputs="float[2,5] x",
        outputs="float[2,1,1,5] y",
    )
    assert_rewrites(
        MergeConsecutiveOpsPass, text, {"Transpose∘Reshape->Reshape": 1}, ["Reshape", "Relu"]
    )


def test_dense_with_gemm_and_bias_multiplies_the_unflattened_input() -> None:
    text = model(
        "<int64[2] f = {-1, 4}, int64[3] t = {2, 5, 6}, float[6,4] w = {"
        + ", ".join(f"{0.1 * i:.1f}" for i in range(24))
        + "}, float[6] b = {1., 2., 3., 4., 5., 6.}>"
        " { r = Reshape(x, f)\n g = Gemm<transB=1>(r, w)\n a = Add(g, b)\n v = Reshape(a, t)\n y = Relu(v) }",
        inputs="float[2,5,4] x",
        outputs="float[2,5,6] y",
    )
    optimized = assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"Reshape∘MatMul∘flatten": 1},
        ["Transpose", "MatMul", "Add", "Reshape", "Relu"],
    )
    matmul = next(node for node in optimized.graph if node.op_type == "MatMul")
    assert matmul.inputs[0] is not None and matmul.inputs[0].name == "x"


def test_reshape_of_unsqueeze_with_a_target_read_off_shapes() -> None:
    text = model(
        "<int64[1] a = {3}, int64[1] w = {12}> { u = Unsqueeze(x, a)\n s = Shape<end=1>(x)\n"
        " t = Concat<axis=0>(s, w)\n r = Reshape(u, t)\n y = Relu(r) }",
        inputs="float[N,3,4] x",
        outputs="float[N,12] y",
        opset=15,
    )
    assert_rewrites(
        MergeConsecutiveOpsPass,
        text,
        {"Reshape∘Unsqueeze": 1},
        ["Shape", "Concat", "Reshape", "Relu"],
        trials=2,
    )


def test_reshape_of_unsqueeze_refuses_a_copy_of_a_moved_dim() -> None:
    # the target's 0 copies dim 2 of the unsqueezed tensor (1), which is not x's dim 2 (4)
    text = model(
        "<int64[1] a = {1}, int64[1] w = {3}, int64[1] z = {0}> { u = Unsqueeze(x, a)\n"
        " s = Shape<end=1>(x)\n t = Concat<axis=0>(s, w, z, w)\n r = Reshape(u, t)\n y = Relu(r) }",
        inputs="float[N,3,3] x",
        outputs="float[N,3,1,3] y",
        opset=15,
    )
    assert_refuses(
        MergeConsecutiveOpsPass, text, "the outer target copies a dim the inner op moved"
    )


def test_transposed_product_of_transposes_swaps_its_operands() -> None:
    """KerasHub's attention: ``Transpose(MatMul(Transpose(k), Transpose(q)))`` is Q @ K^T."""
    text = model(
        "{ kt = Transpose<perm=[0,2,1,3]>(k)\n qt = Transpose<perm=[0,2,3,1]>(q)\n"
        " s = MatMul(kt, qt)\n t = Transpose<perm=[0,1,3,2]>(s)\n y = Relu(t) }",
        inputs="float[2,5,3,4] k, float[2,6,3,4] q",
        outputs="float[2,3,6,5] y",
    )
    optimized = _checked(
        text, {"Transpose∘MatMul(Transposes)->MatMul": 1, "Transpose∘Transpose": 2}
    )
    assert op_types(optimized) == ["Transpose", "Transpose", "MatMul", "Relu"]  # one per input


def test_transposed_product_moved_elsewhere_keeps_one_transpose() -> None:
    """jax's ``einsum('...hqk,...khd->...qhd', p, v)`` through tf2onnx: ``(Vᵀ · Pᵀ)`` moved to
    [B, S, H, d] is ``P · V`` with the heads moved back, one Transpose fewer."""
    text = model(
        "{ vt = Transpose<perm=[0,2,3,1]>(v)\n pt = Transpose<perm=[0,1,3,2]>(p)\n"
        " o = MatMul(vt, pt)\n t = Transpose<perm=[0,3,1,2]>(o)\n y = Relu(t) }",
        inputs="float[2,5,3,4] v, float[2,3,6,5] p",
        outputs="float[2,6,3,4] y",
    )
    optimized = _checked(
        text, {"Transpose∘MatMul(Transposes)->MatMul": 1, "Transpose∘Transpose": 2}
    )
    assert op_types(optimized) == ["Transpose", "MatMul", "Transpose", "Relu"]


def test_transposed_product_that_would_keep_every_transpose_is_left() -> None:
    text = model(
        "{ vt = Transpose<perm=[0,2,3,1]>(v)\n pt = Transpose<perm=[1,0,3,2]>(p)\n"
        " o = MatMul(vt, pt)\n t = Transpose<perm=[0,3,1,2]>(o)\n y = Relu(t) }",
        inputs="float[2,5,3,4] v, float[3,2,6,5] p",
        outputs="float[2,6,3,4] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "no Transpose would cancel")


PADDED = "Add(x, [1, ..., N])->Add(x, [N])"


def test_bias_padded_to_the_tensors_rank_is_a_vector() -> None:
    """jax2tf writes a Dense bias as [1, 1, N]: the [N] vector is the same broadcast, and what
    the bias fusions (BiasGelu, packed Attention) read."""
    text = model(
        "<float[1,1,4] b = {0.5, -1.0, 2.0, 0.25}> { a = Add(x, b)\n y = Relu(a) }",
        inputs="float[B,3,4] x",
        outputs="float[B,3,4] y",
    )
    optimized = _checked(text, {PADDED: 1})
    add = next(node for node in optimized.graph if node.op_type == "Add")
    bias = add.inputs[1]
    assert bias is not None and bias.shape is not None and list(bias.shape) == [4]


@pytest.mark.parametrize(
    ("constant", "inputs", "reason"),
    [
        (
            "float[1,1,4] b = {0.5, -1.0, 2.0, 0.25}",
            "float[3,4] x",
            "raise the other operand's rank",
        ),
        ("float[1,3,4] b = {" + ", ".join(["0.5"] * 12) + "}", "float[B,3,4] x", "no operand"),
    ],
    ids=["raises-rank", "not-a-vector"],
)
def test_other_constants_keep_their_shape(constant: str, inputs: str, reason: str) -> None:
    outputs = "float[3,4] y" if inputs.startswith("float[3,4]") else "float[B,3,4] y"
    text = model(f"<{constant}> {{ a = Add(x, b)\n y = Relu(a) }}", inputs=inputs, outputs=outputs)
    if reason == "no operand":
        assert not MergeConsecutiveOpsPass()(load(text)).modified
    else:
        assert_refuses(MergeConsecutiveOpsPass, text, reason)


def test_transposed_product_of_other_operands_is_left() -> None:
    text = model(
        "{ qt = Transpose<perm=[0,1,3,2]>(q)\n s = MatMul(k, qt)\n"
        " t = Transpose<perm=[0,1,3,2]>(s)\n y = Relu(t) }",
        inputs="float[2,3,5,4] k, float[2,3,6,4] q",
        outputs="float[2,3,6,5] y",
    )
    assert_refuses(MergeConsecutiveOpsPass, text, "the MatMul's operands are not both Transposes")


def test_select_whose_fill_product_is_shared_by_layers() -> None:
    """KerasHub computes the mask's ``Cast(!c) * k`` once for every layer's scores."""
    text = model(
        "<float k = {-1e9}> { c = Cast<to=1>(f)\n n = Not(f)\n d = Cast<to=1>(n)\n"
        " fill = Mul(k, d)\n on = Mul(c, x)\n s = Add(on, fill)\n on2 = Mul(c, z)\n"
        " s2 = Add(on2, fill)\n a = Relu(s)\n b = Relu(s2)\n y = Add(a, b) }",
        inputs="bool[2,3,4] f, float[2,3,4] x, float[2,3,4] z",
    )
    optimized = _checked(text, {"f*x+(1-f)*k->Where": 2})
    assert op_types(optimized).count("Where") == 2
