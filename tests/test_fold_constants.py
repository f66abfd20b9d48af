from __future__ import annotations

import logging
import time

import numpy as np
import onnx_ir as ir
import pytest
from graphs import assert_numerically_equal, op_types, parse_model

from onnxopt.passes._evaluate import evaluate_numpy, evaluate_on_runtime
from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
from onnxopt.passes.fold_constants import FoldConstantsPass
from onnxopt.passes.lift_constants import LiftConstantsPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate

EXPLAIN = PassOptions(explain=True)


def _values(count: int) -> str:
    """An initializer literal of ``count`` distinct floats."""
    return "{" + ", ".join(str(i % 97 - 40) for i in range(count)) + "}"


def _sessions(caplog: pytest.LogCaptureFixture) -> int:
    return sum("ONNX Runtime session" in r.getMessage() for r in caplog.records)


FLOAT_CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1, 4, 9, 16}, float[4] b = {2, 2, 2, 2}> {
    s = Sqrt(w)
    m = Mul(s, b)
    e = Exp(m)
    l = Log(e)
    y = Add(x, l)
}
"""


def test_fold_float_chain_in_one_runtime_session(caplog: pytest.LogCaptureFixture) -> None:
    model = parse_model(FLOAT_CHAIN)
    with caplog.at_level(logging.DEBUG, logger="onnxopt.passes.fold_constants"):
        result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 4}
    assert op_types(result.model) == ["Add"]
    assert _sessions(caplog) == 1
    # The folded value keeps its name and becomes an initializer.
    folded = result.model.graph.initializers["l"].const_value
    assert folded is not None
    np.testing.assert_allclose(folded.numpy(), [2, 4, 6, 8], rtol=1e-6)
    assert_numerically_equal(model, result.model)
    assert not FoldConstantsPass()(result.model).modified


SHAPE_CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 6] x) => (float[N, 2, 3] y) <float[2, 3] w = {1, 2, 3, 4, 5, 6}, int64[1] zero = {0}> {
    s = Shape(w)
    d0 = Gather<axis = 0>(s, zero)
    d1 = Slice(s, zero, zero)
    minus = Constant<value = int64[1] {-1}>()
    t = Concat<axis = 0>(minus, s)
    c = Cast<to = 7>(d0)
    y = Reshape(x, t)
}
"""


def test_trivial_shape_ops_fold_in_numpy_without_a_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = parse_model(SHAPE_CHAIN)
    with caplog.at_level(logging.DEBUG, logger="onnxopt.passes.fold_constants"):
        result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 5}
    assert op_types(result.model) == ["Constant", "Reshape"]
    assert _sessions(caplog) == 0
    assert_numerically_equal(model, result.model)


def test_folded_graph_output_keeps_its_name() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, float[4] z) <float[4] w = {1, 4, 9, 16}> {
            y = Sqrt(w)
            z = Add(x, y)
        }
        """
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 1}
    assert [o.name for o in result.model.graph.outputs] == ["y", "z"]
    assert result.model.graph.outputs[0].is_initializer()
    assert_numerically_equal(model, result.model)


def test_fold_limit_refuses_huge_constant_of_shape_instantly() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) {
            shape = Constant<value = int64[2] {100000, 100000}>()
            big = ConstantOfShape<value = float[1] {1.0}>(shape)
            two = Constant<value = float {2.0}>()
            doubled = Mul(big, two)
            total = ReduceSum<keepdims = 0>(doubled)
            y = Add(x, total)
        }
        """
    )
    start = time.perf_counter()
    result = FoldConstantsPass(EXPLAIN)(model.clone())
    assert time.perf_counter() - start < 5
    assert result.stats == {"refused: over fold limit": 1}
    assert not result.modified
    assert result.notes == [
        "fold-constants: ConstantOfShape 'big': result 'big' 37.3 GiB is over --fold-limit 32 MiB"
    ]


def test_fold_limit_option_is_respected() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) <float[64, 4] w = VALUES> {
            t = Transpose(w)
            r = ReduceSum<keepdims = 0>(t)
            y = Add(x, r)
        }
        """.replace("VALUES", _values(256))
    )
    result = FoldConstantsPass(PassOptions(fold_limit_bytes=512, explain=True))(model.clone())
    assert result.stats == {"refused: over fold limit": 1}
    assert "result 't' 1 KiB is over --fold-limit 512 B" in result.notes[0]


EXPAND_SMALL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1000, 3] x) => (float[1000, 3] y) {
    shape = Constant<value = int64[2] {1000, 3}>()
    small = Constant<value = float[1, 3] {1.0, 2.0, 3.0}>()
    big = Expand(small, shape)
    y = Mul(x, big)
}
"""


def test_expand_of_small_constant_is_not_folded_into_a_big_one() -> None:
    model = parse_model(EXPAND_SMALL)
    result = FoldConstantsPass(EXPLAIN)(model.clone())
    assert result.stats == {"refused: would grow file": 1}
    assert not result.modified
    assert op_types(result.model) == ["Constant", "Constant", "Expand", "Mul"]
    assert (
        "11.7 KiB would grow the file (folding removes only 55 B of constants and nodes)"
        in result.notes[0]
    )


def test_fold_may_grow_folds_it_anyway() -> None:
    model = parse_model(EXPAND_SMALL)
    result = FoldConstantsPass(PassOptions(fold_may_grow=True))(model.clone())
    assert result.stats == {"nodes folded": 1}
    assert op_types(result.model) == ["Constant", "Constant", "Mul"]  # dead-code removes these
    assert_numerically_equal(model, result.model)


def test_transpose_of_a_weight_used_once_folds_because_it_frees_the_weight() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64] x) => (float[N, 32] y) <float[32, 64] w = VALUES> {
            t = Transpose(w)
            y = MatMul(x, t)
        }
        """.replace("VALUES", _values(2048))
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 1}
    assert op_types(result.model) == ["MatMul"]
    assert_numerically_equal(model, result.model)


def test_transpose_of_a_shared_weight_stays() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64] x, float[N, 32] z) => (float[N, 32] y, float[N, 64] v) <float[32, 64] w = VALUES> {
            t = Transpose(w)
            y = MatMul(x, t)
            v = MatMul(z, w)
        }
        """.replace("VALUES", _values(2048))
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"refused: would grow file": 1}


def test_quantize_dequantize_are_kept() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) <int8[4] q = {1, 2, 3, 4}, float s = {0.5}, int8 z = {0}, float[4] f = {1, 2, 3, 4}> {
            w = DequantizeLinear(q, s, z)
            qf = QuantizeLinear(f, s, z)
            wf = DequantizeLinear(qf, s, z)
            a = Add(x, w)
            y = Add(a, wf)
        }
        """
    )
    result = FoldConstantsPass()(model.clone())
    assert not result.modified
    assert op_types(result.model) == [
        "DequantizeLinear",
        "QuantizeLinear",
        "DequantizeLinear",
        "Add",
        "Add",
    ]


def test_random_ops_and_training_dropout_are_kept() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1, 2, 3, 4}, bool train = {1}, float ratio = {0.5}> {
            r = RandomNormalLike(w)
            d = Dropout(w, ratio, train)
            a = Add(x, r)
            y = Add(a, d)
        }
        """
    )
    result = FoldConstantsPass()(model.clone())
    assert not result.modified
    assert op_types(result.model) == ["RandomNormalLike", "Dropout", "Add", "Add"]


def test_custom_domain_ops_are_kept() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
        g (float[4] x) => (float[4] y) <float[4] w = {1, 2, 3, 4}> {
            c = custom.Magic(w)
            y = Add(x, c)
        }
        """
    )
    assert not FoldConstantsPass()(model).modified


IF_CONST = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1, 2, 3, 4}> {
    flag = Constant<value = bool {1}>()
    y = If(flag) <
        then_branch = then_g () => (float[N, 4] t_out) {
            t1 = Mul(x, w)
            t_out = Relu(t1)
        },
        else_branch = else_g () => (float[N, 4] e_out) {
            e_out = Neg(x)
        }
    >
}
"""


def test_if_with_constant_condition_is_inlined() -> None:
    model = parse_model(IF_CONST)
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"If inlined": 1}
    assert op_types(result.model) == ["Constant", "Mul", "Relu"]
    assert [o.name for o in result.model.graph.outputs] == ["y"]
    assert_numerically_equal(model, result.model)
    assert not FoldConstantsPass()(result.model).modified


def test_an_outer_constant_only_the_branch_not_taken_reads_dies_in_the_same_run() -> None:
    """DINOv3's TorchScript export: the branch not taken reads an outer initializer nothing else
    reads. Its nodes go with the If, so dead-code elimination removes the initializer now, not
    in a second optimize run (which was then not a fixed point)."""
    text = IF_CONST.replace(
        "float[4] w = {1, 2, 3, 4}>", "float[4] w = {1, 2, 3, 4}, float[4] v = {5, 6, 7, 8}>"
    )
    text = text.replace("e_out = Neg(x)", "e1 = Mul(x, v)\n            e_out = Neg(e1)")
    model = parse_model(text)
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"If inlined": 1}
    assert not result.model.graph.initializers["v"].uses()
    EliminateDeadCodePass()(result.model)
    assert sorted(result.model.graph.initializers) == ["w"]
    assert_numerically_equal(model, result.model)


IF_READS_FOLDED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, bool c) => (float[N, 4] y) <float[4] w = {1, 4, 9, 16}> {
    s = Sqrt(w)
    y = If(c) <
        then_branch = then_g () => (float[N, 4] t_out) {
            t1 = Mul(s, s)
            t_out = Add(x, t1)
        },
        else_branch = else_g () => (float[N, 4] e_out) {
            e_out = Neg(x)
        }
    >
}
"""


def test_a_folded_value_read_only_by_folded_branch_nodes_goes_with_them() -> None:
    """VitDet's TorchScript export: an If branch folds a node that reads a value the outer graph
    folds too, and nothing else reads that value. The branch's node goes first."""
    model = parse_model(IF_READS_FOLDED)
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 2}
    assert op_types(result.model) == ["If", "Add", "Neg"]  # the Sqrt and the branch's Mul went
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    feeds = [{"x": x, "c": np.array(flag)} for flag in (True, False)]
    assert validate(model, result.model, inputs=feeds).passed
    assert not FoldConstantsPass()(result.model).modified


def test_if_inlining_keeps_names_unique() -> None:
    # Duplicate names across scopes are refused by the loader, so build the clash in the IR directly.
    model = parse_model(IF_CONST)
    branch = model.graph.node(1).attributes["then_branch"].as_graph()
    outer = ir.node("Abs", [model.graph.inputs[0]])
    outer.outputs[0].name = "t1"
    model.graph.insert_before(model.graph.node(1), outer)
    model.graph.outputs.append(outer.outputs[0])
    assert branch.node(0).outputs[0].name == "t1"
    result = FoldConstantsPass()(model)
    names = [out.name for node in result.model.graph for out in node.outputs]
    assert len(names) == len(set(names))
    assert "t1_1" in names


IF_RANGE = """
<ir_version: 8, opset_import: ["" : 18]>
g (int64[2] size) => (int64[M] y) {
    c = Constant<value = bool {1}>()
    zero = Constant<value = int64 {0}>()
    one = Constant<value = int64 {1}>()
    n = If(c) <
        then_branch = then_g () => (int64[1] t_out) {
            t_out, rest = Split<num_outputs = 2>(size)
        },
        else_branch = else_g () => (int64[1] e_out) {
            e_out = Identity(one)
        }
    >
    y = Range(zero, n, one)
}
"""


def test_if_inlining_hands_range_a_scalar() -> None:
    # The branch yields a [1] tensor; ORT runs Range on it while the If hides its shape, but refuses
    # the model once inlining exposes it (ONNX's expanded AffineGrid function does this).
    model = parse_model(IF_RANGE)
    result = FoldConstantsPass()(model.clone())
    assert result.stats["If inlined"] == 1
    assert [t for t in op_types(result.model) if t != "Constant"] == ["Split", "Reshape", "Range"]
    report = validate(model, result.model, inputs=[{"size": np.array([5, 3], dtype=np.int64)}])
    assert report.passed, report.errors
    assert not FoldConstantsPass()(result.model).modified


IF_CAPTURE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x, bool c) => (float[4] y) <float[4] w = {1, 4, 9, 16}> {
    s = Sqrt(w)
    y = If(c) <
        then_branch = then_g () => (float[4] t_out) {
            k = Constant<value = float[4] {1, 1, 1, 1}>()
            sk = Add(s, k)
            t_out = Mul(x, sk)
        },
        else_branch = else_g () => (float[4] e_out) {
            xs = Add(x, s)
            e_out = Neg(xs)
        }
    >
}
"""


def test_folding_inside_subgraphs_respects_outer_scope() -> None:
    model = parse_model(IF_CAPTURE)
    result = FoldConstantsPass()(model.clone())
    # Sqrt(w) in the main graph, Add(s, k) in the then-branch; Add(x, s) reads an input and stays.
    assert result.stats == {"nodes folded": 2}
    assert op_types(result.model) == ["If", "Constant", "Mul", "Add", "Neg"]
    then_graph = result.model.graph.node(0).attributes["then_branch"].as_graph()
    assert "sk" in then_graph.initializers
    assert "s" in result.model.graph.initializers
    assert_numerically_equal(model, result.model)
    assert not FoldConstantsPass()(result.model).modified


def test_overridable_initializer_is_not_constant() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, float[4] w) => (float[4] y) <float[4] w = {1, 4, 9, 16}> {
            s = Sqrt(w)
            y = Add(x, s)
        }
        """
    )
    assert not FoldConstantsPass()(model).modified


def test_dynamic_model_validates_at_two_sizes() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 8] x) => (float[N, 2, 4] y) <int64[1] two = {2}, int64[1] four = {4}, int64[1] m1 = {-1}> {
            t = Concat<axis = 0>(m1, two, four)
            y = Reshape(x, t)
        }
        """
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 1}
    from onnxopt.validate import validate

    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2


def test_lift_constants_turns_constant_nodes_into_initializers() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, float[2] k) {
            c = Constant<value = float[4] {1, 2, 3, 4}>()
            k = Constant<value_floats = [5.0, 6.0]>()
            y = Add(x, c)
        }
        """
    )
    result = LiftConstantsPass()(model.clone())
    assert result.stats == {"constants lifted": 1}
    assert op_types(result.model) == ["Constant", "Add"]  # the graph-output constant stays
    assert_numerically_equal(model, result.model)
    assert not LiftConstantsPass()(result.model).modified


def test_lift_constants_writes_what_onnx_irs_own_lifting_writes() -> None:
    # The pass is a faster rewrite of onnx-ir's LiftConstantsToInitializersPass: every Constant
    # form, a graph-output Constant and a Constant inside an If branch give the same file.
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, bool b) => (float[4] y, float[2] k, string[2] s, float[4] z) {
            c = Constant<value = float[4] {1, 2, 3, 4}>()
            k = Constant<value_floats = [5.0, 6.0]>()
            f = Constant<value_float = 2.0>()
            i = Constant<value_int = 3>()
            n = Constant<value_ints = [4]>()
            s = Constant<value_strings = ["a", "b"]>()
            t = Constant<value_string = "c">()
            r = Reshape(x, n)
            y = Add(r, c)
            z = If(b) <
                then_branch = g1 () => (float[4] o) {
                    w = Constant<value = float[4] {7, 8, 9, 10}>()
                    o = Mul(y, w)
                },
                else_branch = g2 () => (float[4] o) { o = Mul(y, f) }
            >
        }
        """
    )
    ours = LiftConstantsPass()(model.clone()).model
    theirs = model.clone()
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(theirs)
    assert op_types(ours) == ["Constant", "Constant", "Reshape", "Add", "If", "Mul", "Mul"]
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(theirs).SerializeToString()


# The numpy kernels must agree exactly with ONNX Runtime on the cases they accept.
KERNEL_CASES = [
    ("Gather", [np.array([5, 6, 7, 8]), np.array([-1, 0])], {"axis": 0}),
    ("Slice", [np.arange(10), np.array([8]), np.array([-100]), np.array([0]), np.array([-3])], {}),
    (
        "Slice",
        [np.arange(12).reshape(3, 4), np.array([1, -3]), np.array([100, 3]), np.array([0, 1])],
        {},
    ),
    ("Div", [np.array([7, -7, 7, -7]), np.array([2, 2, -2, -2])], {}),
    ("Mod", [np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3])], {}),
    ("Mod", [np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3])], {"fmod": 1}),
    ("Reshape", [np.arange(6).astype(np.float32).reshape(2, 3), np.array([0, -1])], {}),
    ("Range", [np.array(10), np.array(-3), np.array(-4)], {}),
    ("Expand", [np.array([[1], [2]], dtype=np.float32), np.array([1, 3])], {}),
    ("Tile", [np.array([[1, 2]]), np.array([2, 2])], {}),
    ("Unsqueeze", [np.array([1, 2]), np.array([-1, 0])], {}),
    ("Squeeze", [np.zeros((1, 3, 1)), np.array([-1])], {}),
    ("Cast", [np.array([1, -2, 300])], {"to": int(ir.DataType.UINT8)}),
    ("Where", [np.array([True, False]), np.array([1.5, 2.5]), np.array([3.5, 4.5])], {}),
    ("Flatten", [np.zeros((2, 3, 4))], {"axis": -1}),
]


@pytest.mark.parametrize(("op", "arrays", "attrs"), KERNEL_CASES)
def test_numpy_kernels_match_onnx_runtime(op: str, arrays: list[np.ndarray], attrs: dict) -> None:
    inputs = [ir.Value(name=f"in{i}") for i in range(len(arrays))]
    node = ir.node(op, inputs, attributes=attrs)
    node.outputs[0].name = "out"
    expected = evaluate_numpy(node, list(arrays))
    assert expected is not None
    actual = evaluate_on_runtime(
        [node], {f"in{i}": a for i, a in enumerate(arrays)}, ["out"], {"": 18}, 8
    )["out"]
    assert expected[0].dtype == actual.dtype
    np.testing.assert_array_equal(expected[0], actual)


def test_uniform_chain_collapses_into_one_constant_of_shape() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64, 4, 4] x) => (float[N, 64, 4, 4] y) <int64[1] shape = {64}, int64[2] axes = {1, 2}> {
            c = ConstantOfShape<value = float[1] {0.5}>(shape)
            u = Unsqueeze(c, axes)
            y = Mul(x, u)
        }
        """
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 2, "uniform results as ConstantOfShape": 1}
    assert op_types(result.model) == ["ConstantOfShape", "Mul"]
    assert result.model.graph.initializers["u_shape"].const_value.numpy().tolist() == [64, 1, 1]
    assert_numerically_equal(model, result.model)
    # A single ConstantOfShape fed by constants is already the compact form: nothing to do.
    assert not FoldConstantsPass()(result.model).modified


def test_runtime_failure_refuses_only_its_group() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, float[2] z) <float[4] w = {1, 4, 9, 16}, float[4] v = {1, 2, 3, 4}, int64[2] bad = {0, 9}> {
            s = Sqrt(w)
            y = Add(x, s)
            g = Gather(v, bad)
            z = Neg(g)
        }
        """
    )
    result = FoldConstantsPass(EXPLAIN)(model.clone())
    assert result.stats == {"nodes folded": 1, "refused: runtime error": 2}
    assert op_types(result.model) == ["Add", "Gather", "Neg"]
    assert any("ONNX Runtime cannot evaluate it" in note for note in result.notes)


LOOP_BODY = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64 n, float[4] x) => (float[4] y) <float[4] w = {1, 4, 9, 16}, bool cond = {1}> {
    y = Loop(n, cond, x) <
        body = body_g (int64 i, bool c_in, float[4] acc) => (bool c_out, float[4] acc_out) {
            s = Sqrt(w)
            step = Add(acc, s)
            acc_out = Identity(step)
            c_out = Identity(c_in)
        }
    >
}
"""


def test_folding_inside_loop_body_uses_outer_constants_only() -> None:
    model = parse_model(LOOP_BODY)
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 1}
    body = result.model.graph.node(0).attributes["body"].as_graph()
    assert "s" in body.initializers
    assert [n.op_type for n in body] == ["Add", "Identity", "Identity"]
    from onnxopt.validate import validate

    feeds = [{"n": np.array(3, dtype=np.int64), "x": np.ones(4, np.float32)}]
    assert validate(model, result.model, inputs=feeds).passed


def test_identity_of_a_shared_weight_is_bypassed_not_copied() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64] x) => (float[N, 64] y) <float[64] w = VALUES> {
            w2 = Identity(w)
            a = Add(x, w)
            y = Mul(a, w2)
        }
        """.replace("VALUES", _values(64))
    )
    result = FoldConstantsPass()(model.clone())
    assert result.stats == {"nodes folded": 1}
    assert op_types(result.model) == ["Add", "Mul"]
    assert list(result.model.graph.initializers) == ["w"]
    assert_numerically_equal(model, result.model)
