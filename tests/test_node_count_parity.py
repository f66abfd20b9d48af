"""The fixes that bring onnxopt's node counts to onnxsim's and onnxslim's (benchmarks/node_counts.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from graphs import assert_numerically_equal, op_types, parse_model
from test_fold_constants import EXPAND_SMALL

from onnxopt import api, io
from onnxopt.passes.fold_constants import FoldConstantsPass
from onnxopt.passes.options import PassOptions
from onnxopt.passes.remove_initializer_inputs import RemoveInitializerInputsPass

GROW = PassOptions(fold_may_grow=True)


def _legacy_model(ir_version: int = 3) -> onnx.ModelProto:
    """Two identical Conv branches whose weights are equal ConstantOfShape fills, IR 3 style: every
    initializer (the fills' shapes, a real bias) is also a graph input."""
    shape = onnx.numpy_helper.from_array(np.array([8, 3, 1, 1], np.int64), "w_shape")
    shape2 = onnx.numpy_helper.from_array(np.array([8, 3, 1, 1], np.int64), "w2_shape")
    bias = onnx.numpy_helper.from_array(np.arange(8, dtype=np.float32), "bias")
    fill = onnx.numpy_helper.from_array(np.array([0.5], np.float32))
    nodes = [
        oh.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill),
        oh.make_node("ConstantOfShape", ["w2_shape"], ["w2"], value=fill),
        oh.make_node("Conv", ["x", "w", "bias"], ["a"]),
        oh.make_node("Conv", ["x", "w2", "bias"], ["b"]),
        oh.make_node("Add", ["a", "b"], ["y"]),
    ]
    inputs = [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 5, 5])]
    inputs += [
        oh.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in (shape, shape2, bias)
    ]
    graph = oh.make_graph(
        nodes,
        "legacy",
        inputs,
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 8, 5, 5])],
        [shape, shape2, bias],
    )
    return oh.make_model(graph, ir_version=ir_version, opset_imports=[oh.make_opsetid("", 9)])


def test_ir3_initializer_inputs_become_weights() -> None:
    model = io.model_from_proto(_legacy_model())
    result = RemoveInitializerInputsPass()(model.clone())
    assert result.stats == {"initializer inputs removed": 3}
    assert [v.name for v in result.model.graph.inputs] == ["x"]
    assert result.model.ir_version == 4
    assert_numerically_equal(model, result.model)
    assert not RemoveInitializerInputsPass()(result.model).modified


def test_initializer_inputs_of_ir4_and_later_stay_overridable() -> None:
    model = io.model_from_proto(_legacy_model(ir_version=4))
    assert not RemoveInitializerInputsPass()(model).modified
    assert len(model.graph.inputs) == 4


def test_ir3_duplicate_branches_merge_at_the_default_level() -> None:
    # As graph inputs the two equal shapes could not be merged, so neither could the two Convs.
    result = api.optimize(io.model_from_proto(_legacy_model()))
    assert result.validated
    assert op_types(result.model) == ["ConstantOfShape", "Conv", "Add"]


WEIGHT_AS_FILL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 64, 4, 4] x) => (float[N, 64, 4, 4] y) <int64[1] shape = {64}, int64[2] axes = {1, 2}> {
    c = ConstantOfShape<value = float[1] {0.5}>(shape)
    u = Unsqueeze(c, axes)
    y = Mul(x, u)
}
"""


@pytest.mark.parametrize(
    ("options", "expected_ops", "stats"),
    [
        (
            PassOptions(),
            ["ConstantOfShape", "Mul"],
            {"nodes folded": 2, "uniform results as ConstantOfShape": 1},
        ),
        (GROW, ["Mul"], {"nodes folded": 2}),
    ],
)
def test_uniform_weights_are_materialized_only_with_fold_may_grow(
    options: PassOptions, expected_ops: list[str], stats: dict[str, int]
) -> None:
    model = parse_model(WEIGHT_AS_FILL)
    result = FoldConstantsPass(options)(model.clone())
    assert result.stats == stats
    assert op_types(result.model) == expected_ops
    assert_numerically_equal(model, result.model)
    assert not FoldConstantsPass(options)(result.model).modified


def test_fold_limit_still_applies_with_fold_may_grow() -> None:
    model = parse_model(EXPAND_SMALL)
    options = PassOptions(fold_may_grow=True, fold_limit_bytes=1024, explain=True)
    result = FoldConstantsPass(options)(model.clone())
    assert result.stats == {"refused: over fold limit": 1}
    assert "over --fold-limit 1 KiB" in result.notes[0]


EQUAL_SHAPES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 2, 4] y) <int64[1] zero = {0}, int64[1] two = {2}, int64[1] four = {4}> {
    s1 = Shape(x)
    n1 = Gather<axis = 0>(s1, zero)
    c1 = Concat<axis = 0>(n1, two, four)
    r1 = Reshape(x, c1)
    s2 = Shape(x)
    n2 = Gather<axis = 0>(s2, zero)
    c2 = Concat<axis = 0>(n2, two, four)
    r2 = Reshape(x, c2)
    y = Add(r1, r2)
}
"""


def test_equal_folded_constants_are_merged_and_their_users_too() -> None:
    model = parse_model(EQUAL_SHAPES)
    result = api.optimize(model)
    assert result.validated
    assert op_types(result.model).count("Reshape") == 1
    again = api.optimize(result.model, check=False)
    annotations = ("infer-shapes", "drop-shape-annotations")
    assert not any(r.modified for r in again.report.records if r.name not in annotations)


SLICED_BUFFER = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64[B, S] ids) => (float[B, S] y)
  <float[1, 64] buffer = VALUES, int64[1] zero = {0}, int64[1] one = {1}, int64[1] two = {2}> {
    shape = Shape(ids)
    seq = Slice(shape, one, two)
    part = Slice(buffer, zero, seq, one)
    part_shape = Shape(part)
    rows = Gather<axis = 0>(part_shape, zero)
    target = Concat<axis = 0>(rows, seq)
    moved = Reshape(part, target)
    f = Cast<to = 1>(ids)
    y = Add(f, moved)
}
""".replace("VALUES", "{" + ", ".join(str(i) for i in range(64)) + "}")


def test_slice_keeps_the_dims_of_axes_it_does_not_touch() -> None:
    # ONNX infers only the rank of a Slice by a dynamic end; dim 0 of `part` is provably 1, so
    # Shape(part)[0] folds and the Reshape target loses its shape computation.
    from onnxopt.passes.infer_shapes import InferShapesPass

    model = parse_model(SLICED_BUFFER)
    result = InferShapesPass()(model.clone())
    # the Slice's dim 0, and the Reshape's dim 1, which its target reads off ids
    assert result.stats["shapes refined"] == 2
    part = next(n for n in result.model.graph if n.outputs[0].name == "part").outputs[0]
    assert part.shape is not None and part.shape[0] == 1
    optimized = api.optimize(model, disable=["drop-shape-annotations"])  # inspect its shapes
    assert optimized.validated
    assert "Gather" not in op_types(optimized.model)
    assert not InferShapesPass()(optimized.model).stats.get("shapes refined")


AND_TRUE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, float[N, 4] z) => (bool[N, 4] y, bool[N, 4] w)
  <bool[1, 4] yes = {1, 1, 1, 1}, bool no = {0}, bool[4, 4] wide = VALUES> {
    c = Greater(x, z)
    y = And(yes, c)
    o = Or(c, no)
    w = And(o, wide)
}
""".replace("VALUES", "{" + ", ".join(["1"] * 16) + "}")


def test_and_true_and_or_false_are_removed_when_shapes_allow() -> None:
    from onnxopt.passes.eliminate_noops import EliminateNoopsPass
    from onnxopt.passes.infer_shapes import InferShapesPass

    model = parse_model(AND_TRUE)
    InferShapesPass()(model)
    result = EliminateNoopsPass(PassOptions(explain=True))(model.clone())
    assert result.stats == {"And true removed": 1, "Or false removed": 1}
    # And with a [4, 4] constant may broadcast N up to 4: it stays.
    assert op_types(result.model) == ["Greater", "And"]
    assert any("symbolic dim" in note for note in result.notes)
    assert_numerically_equal(model, result.model)
    assert not EliminateNoopsPass()(result.model).modified


def test_shared_conv_weight_is_folded_into_a_copy_with_fold_may_grow() -> None:
    # light_* weights are equal ConstantOfShape fills, which deduplication then shares between
    # Convs; the fused weight is a new tensor, so the shared one stays for its other user.
    from onnxopt.passes.fuse_conv_bn import FuseConvBnPass
    from tests.fusion_util import parse, rng_array, run_checked

    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y, float[N, 4, 6, 6] z) {
        c = Conv <kernel_shape = [3, 3]> (x, w)
        y = BatchNormalization (c, s, b, m, v)
        z = Conv <kernel_shape = [3, 3]> (x, w)
    }
    """
    stats = {f"{k}": rng_array(4, seed=i, positive=k == "v") for i, k in enumerate("sbmv", 1)}
    model = parse(text, w=rng_array(4, 3, 3, 3), **stats)
    assert not FuseConvBnPass()(model.clone()).modified
    result = run_checked(FuseConvBnPass(GROW), model)
    assert result.stats == {"conv+bn->conv": 1}
    assert op_types(result.model) == ["Conv", "Conv"]
    kept = result.model.graph.initializers["w"]  # still read by the other Conv
    assert [use.node.outputs[0].name for use in kept.uses()] == ["z"]
