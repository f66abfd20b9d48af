from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest
from graphs import assert_numerically_equal, op_types, parse_model

from onnxopt.passes.fold_shape_values import FoldShapeValuesPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.validate import validate

ROOT = Path(__file__).resolve().parent.parent


def _initializer(model, name: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    tensor = model.graph.initializers[name].const_value
    assert tensor is not None
    return tensor.numpy()


STATIC_DIM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 6] x) => (float[N, 2, 3] y, int64 n) <int64 zero = {0}, int64 one = {1}, int64[1] axes = {0}, int64[2] tail = {2, 3}> {
    s = Shape(x)
    d1 = Gather<axis = 0>(s, one)
    d0 = Gather<axis = 0>(s, zero)
    n = Identity(d0)
    d1u = Unsqueeze(d1, axes)
    half = Div(d1u, tail)
    t = Concat<axis = 0>(half, tail)
    r = Reshape(x, t)
    y = Identity(r)
}
"""


def test_static_dim_folds_while_symbolic_dim_stays() -> None:
    model = parse_model(STATIC_DIM)
    result = FoldShapeValuesPass()(model.clone())
    # Shape(x)[1] = 6 is static: 6 / [2, 3] = [3, 2] and the Reshape target [3, 2, 2, 3] fold.
    # Shape(x)[0] = N is symbolic: the Shape/Gather feeding `n` stay.
    assert result.stats == {"shape values folded": 1}
    assert op_types(result.model) == ["Shape", "Gather", "Identity", "Reshape", "Identity"]
    assert _initializer(result.model, "t").tolist() == [3, 2, 2, 3]
    assert not FoldShapeValuesPass()(result.model).modified


def test_shape_start_end_attributes() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4, 5] x) => (float[N, 20] y) <int64[1] m1 = {-1}> {
            s = Shape<start = 1>(x)
            p = ReduceProd<keepdims = 1>(s)
            t = Concat<axis = 0>(m1, p)
            y = Reshape(x, t)
        }
        """
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"shape values folded": 1}
    assert _initializer(result.model, "s").tolist() == [4, 5]
    assert_numerically_equal(model, result.model)


TORCHSCRIPT_RESHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 4, 8] x) => (float[B, 32] y) <int64 zero = {0}, int64 one = {1}, int64 two = {2}, int64[1] axes = {0}> {
    s = Shape(x)
    b = Gather<axis = 0>(s, zero)
    c = Gather<axis = 0>(s, one)
    w = Gather<axis = 0>(s, two)
    cw = Mul(c, w)
    bu = Unsqueeze(b, axes)
    cwu = Unsqueeze(cw, axes)
    t = Concat<axis = 0>(bu, cwu)
    y = Reshape(x, t)
}
"""


def test_reshape_target_with_symbolic_batch_becomes_copy_dim() -> None:
    model = parse_model(TORCHSCRIPT_RESHAPE)
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"Reshape targets made constant": 1, "shape values folded": 1}
    assert op_types(result.model) == ["Reshape"]
    reshape = result.model.graph.node(0)
    target = reshape.inputs[1]
    assert target is not None and target.const_value is not None
    assert target.const_value.numpy().tolist() == [0, 32]
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2  # the symbolic batch at two sizes
    assert not FoldShapeValuesPass()(result.model).modified


def test_single_unknown_dim_becomes_minus_one() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 8] x, float[M] other) => (float[B, 2, 4] y) <int64[2] tail = {2, 4}> {
            s = Shape(other)
            t = Concat<axis = 0>(s, tail)
            y = Reshape(x, t)
        }
        """
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"Reshape targets made constant": 1}
    target = result.model.graph.node(-1).inputs[1]
    assert target is not None and target.const_value is not None
    assert target.const_value.numpy().tolist() == [-1, 2, 4]
    assert_numerically_equal(model, result.model)


def test_two_unknown_dims_are_left_alone() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, T, 8] x, float[M, S] other) => (float[B, T, 8] y) <int64[1] tail = {8}> {
            s = Shape(other)
            t = Concat<axis = 0>(s, tail)
            y = Reshape(x, t)
        }
        """
    )
    assert not FoldShapeValuesPass()(model).modified


def test_allowzero_reshape_gets_copy_dims_and_allowzero_0() -> None:
    model = parse_model(
        TORCHSCRIPT_RESHAPE.replace("y = Reshape(x, t)", "y = Reshape<allowzero = 1>(x, t)")
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"Reshape targets made constant": 1, "shape values folded": 1}
    reshape = result.model.graph.node(0)
    assert reshape.attributes.get_int("allowzero", 0) == 0
    assert_numerically_equal(model, result.model)


def test_allowzero_reshape_with_a_literal_zero_is_left_alone() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 0, 8] x) => (float[B, 0, 8] y) <int64[2] tail = {0, 8}> {
            s = Shape<end = 1>(x)
            t = Concat<axis = 0>(s, tail)
            y = Reshape<allowzero = 1>(x, t)
        }
        """
    )
    assert not FoldShapeValuesPass()(model).modified


def test_default_model_optimizes_to_far_fewer_nodes() -> None:
    from onnxopt.api import optimize

    result = optimize(ROOT / "models" / "default.onnx")
    assert result.validated
    assert result.report.before.nodes == 198
    assert result.report.after.nodes <= 55
    # The result is a fixed point: optimizing it again changes nothing.
    again = optimize(result.model, check=False)
    annotations = ("infer-shapes", "drop-shape-annotations")  # shapes re-inferred, then dropped
    assert [r.name for r in again.report.records if r.modified and r.name not in annotations] == []


def test_infer_then_fold_on_default_model_is_idempotent() -> None:
    from onnxopt import io

    model = io.load_model(ROOT / "models" / "default.onnx").model
    InferShapesPass()(model)
    assert FoldShapeValuesPass()(model).modified
    assert not FoldShapeValuesPass()(model).modified


def test_dims_with_the_same_symbol_become_copy_dims() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, T, 8] x, float[B, T] mask) => (float[B, T, 2, 4] y) <int64[2] heads = {2, 4}> {
            s = Shape(mask)
            t = Concat<axis = 0>(s, heads)
            y = Reshape(x, t)
        }
        """
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"Reshape targets made constant": 1}
    target = result.model.graph.node(-1).inputs[1]
    assert target is not None and target.const_value is not None
    assert target.const_value.numpy().tolist() == [0, 0, 2, 4]
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2


# Each layer reads the batch and sequence length off its own input before its Reshape, as
# TorchScript exports of GPT-2's Conv1D do (48 times in GPT-2 small).
PER_LAYER_SHAPE_READS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, T, 4] x, float[B, T, 4] z, float[4, 4] w) => (float[B, T, 4] y) <int64 zero = {0}, int64 one = {1}, int64[1] axes = {0}, int64[1] four = {4}, int64[2] flat = {-1, 4}> {
    a = Add(x, z)
    s1 = Shape(a)
    b1 = Gather<axis = 0>(s1, zero)
    t1 = Gather<axis = 0>(s1, one)
    b1u = Unsqueeze(b1, axes)
    t1u = Unsqueeze(t1, axes)
    target1 = Concat<axis = 0>(b1u, t1u, four)
    f1 = Reshape(a, flat)
    m1 = MatMul(f1, w)
    r1 = Reshape(m1, target1)
    c = Relu(z)
    s2 = Shape(c)
    b2 = Gather<axis = 0>(s2, zero)
    t2 = Gather<axis = 0>(s2, one)
    b2u = Unsqueeze(b2, axes)
    t2u = Unsqueeze(t2, axes)
    target2 = Concat<axis = 0>(b2u, t2u, four)
    f2 = Reshape(c, flat)
    m2 = MatMul(f2, w)
    r2 = Reshape(m2, target2)
    y = Add(r1, r2)
}
"""


def test_equal_shape_reads_are_computed_once() -> None:
    model = parse_model(PER_LAYER_SHAPE_READS)
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    # [B, T, 4] is computed three times: Shape(a), both Concats (and B, T twice each on the way).
    # Everything after the first Shape(a) reads that one: the second Shape, both Concats, the
    # second layer's two Gathers and two Unsqueezes; the first layer's chain is then dead.
    assert result.stats == {"shape values shared": 7}
    assert op_types(result.model) == [
        "Add",
        "Shape",
        "Reshape",
        "MatMul",
        "Reshape",
        "Relu",
        "Reshape",
        "MatMul",
        "Reshape",
        "Add",
    ]
    for node in result.model.graph:
        if node.outputs[0].name in ("r1", "r2"):
            assert node.inputs[1] is not None and node.inputs[1].name == "s1"
    assert_numerically_equal(model, result.model)
    assert not FoldShapeValuesPass()(result.model).modified


def test_different_symbols_and_unnamed_dims_are_not_shared() -> None:
    # T and U may differ at run time; the two unnamed dims belong to different tensors.
    model = parse_model(
        PER_LAYER_SHAPE_READS.replace("float[B, T, 4] z", "float[B, U, 4] z")
        .replace("a = Add(x, z)", "a = Identity(x)")
        .replace("y = Add(r1, r2)", "y = Concat<axis = 1>(r1, r2)")
        .replace("float[B, T, 4] y", "float[B, ?, 4] y")
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    # Shared: each target with its own layer's Shape ([B, T, 4] and [B, U, 4]), and the second
    # layer's batch Gather and Unsqueeze (B in both). The two Shapes stay apart (T is not U).
    assert result.stats == {"shape values shared": 4}
    assert op_types(result.model).count("Shape") == 2
    assert op_types(result.model).count("Concat") == 1  # the output's
    assert_numerically_equal(model, result.model)

    unnamed = parse_model(
        PER_LAYER_SHAPE_READS.replace("float[B, T, 4] x", "float[?, ?, 4] x")
        .replace("float[B, T, 4] z", "float[?, ?, 4] z")
        .replace("a = Add(x, z)", "a = Identity(x)")
        .replace("y = Add(r1, r2)", "y = Concat<axis = 1>(r1, r2)")
        .replace("float[B, T, 4] y", "float[?, ?, 4] y")
    )
    assert not FoldShapeValuesPass()(unnamed.clone()).modified


# A CRNN head (RapidOCR's and ddddocr's text recognisers, TorchScript): the sequence length T is
# the width a strided Conv computes (ONNX names it "unk__N"); the head flattens [T, 1, C] to
# [-1, C] for its Gemm and rebuilds [T, 1, -1] from Shape(...)[0].
CRNN_HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 1, W] x, float[2, 1, 3] k, float[2, 5] w) => (float[?, 1, 5] y) <int64[2] flat = {-1, 2}, int64 zero = {0}, int64[1] axes = {0}, int64[1] one = {1}, int64[1] rest = {-1}> {
    c = Conv<strides = [2]>(x, k)
    seq = Transpose<perm = [2, 0, 1]>(c)
    f = Reshape(seq, flat)
    m = MatMul(f, w)
    s = Shape(seq)
    t = Gather<axis = 0>(s, zero)
    tu = Unsqueeze(t, axes)
    target = Concat<axis = 0>(tu, one, rest)
    y = Reshape(m, target)
}
"""


def test_reshape_minus_one_is_the_dim_the_others_leave() -> None:
    """ONNX names a Reshape's -1 afresh; [T, 1, 2] -> [-1, 2] is T itself, so the Gemm output is
    [T, 5], and the head's rebuilt target [T, 1, -1] is the constant [0, 1, -1]."""
    model = parse_model(CRNN_HEAD)
    InferShapesPass()(model)
    values = {str(o.name): o for node in model.graph for o in node.outputs}
    seq_dim = values["seq"].shape[0]
    assert not isinstance(seq_dim, int)
    assert list(values["f"].shape) == [seq_dim, 2]
    assert list(values["m"].shape) == [seq_dim, 5]
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats.get("Reshape targets made constant") == 1, result.stats
    target = result.model.graph.node(-1).inputs[1]
    assert target is not None and target.const_value is not None
    assert target.const_value.numpy().tolist() == [0, 1, -1]
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2


def test_torchscript_expand_minus_one_test_is_tracked() -> None:
    # TorchScript writes expand(..., -1, ...) as Where(Equal(target, -1), 1, target): a dim read
    # off a shape is never -1, so only the literal -1 becomes 1 and the Reshape target folds.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S, 8] x) => (float[B, S, 1, 8] y) <int64[1] m1 = {-1}, int64[1] eight = {8}, int64[4] m1s = {-1, -1, -1, -1}, int64[4] ones = {1, 1, 1, 1}> {
            bs = Shape<start = 0, end = 2>(x)
            t = Concat<axis = 0>(bs, m1, eight)
            eq = Equal(t, m1s)
            w = Where(eq, ones, t)
            y = Reshape(x, w)
        }
        """
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats["Reshape targets made constant"] == 1
    assert op_types(result.model) == ["Reshape"]
    target = result.model.graph.node(0).inputs[1]
    assert target is not None and target.const_value is not None
    assert target.const_value.numpy().tolist() == [0, 0, 1, 8]
    report = validate(model, result.model)
    assert report.passed, report
    assert not FoldShapeValuesPass()(result.model).modified


def test_a_dim_less_itself_is_zero() -> None:
    # GPT-Neo's TorchScript export slices its causal buffer from key_length - query_length, both
    # read off one shape: 0 whatever the length
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S, 8] x) => (int64[1] start) {
            s = Shape<start = 1, end = 2>(x)
            start = Sub(s, s)
        }
        """
    )
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats == {"shape values folded": 1}
    assert op_types(result.model) == []
    report = validate(model, result.model)
    assert report.passed, report


def test_torchscript_expand_keeps_the_dims_it_provably_has() -> None:
    # TorchScript's causal mask: expand(B, -1, S, T) of a [B, 1, S, ?] mask, the target written
    # as Where(Equal(t, -1), 1, t). ONNX infers only the rank; the mask's head dim is the input's
    # static 1 (what lets GroupQueryAttention's fix-up skip the head split), B and S are the
    # dims read, and the last stays unknown (the input's may be 1 or T).
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool[B, 1, S, K] m, float[B, S, 8] x, float[B, T, 8] kv) => (bool[?, ?, ?, ?] y) <int64[1] m1 = {-1}, int64[4] m1s = {-1, -1, -1, -1}, int64[4] ones = {1, 1, 1, 1}> {
            b = Shape<start = 0, end = 1>(x)
            s = Shape<start = 1, end = 2>(x)
            t = Shape<start = 1, end = 2>(kv)
            target = Concat<axis = 0>(b, m1, s, t)
            eq = Equal(target, m1s)
            w = Where(eq, ones, target)
            e = Expand(m, w)
            y = Identity(e)
        }
        """
    )
    InferShapesPass()(model)
    e = model.graph.node(-2).outputs[0]
    assert e.shape is not None
    dims = [d if isinstance(d, int) else d.value for d in e.shape]
    assert dims[:3] == ["B", 1, "S"], dims
    assert dims[3] is None or str(dims[3]).startswith("unk__"), dims


EMBEDDINGS = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[B, S] ids{extra}) => (float[?, ?, 4] y) <float[10, 4] words = {WORDS}, float[16, 4] table = {TABLE}, int64[1, 16] positions = {POSITIONS}, int64[1] zero = {{0}}, int64[1] one = {{1}}> {{
        w = Gather<axis = 0>(words, ids)
        s = Shape<start = 1, end = 2>(w)
        p = Slice(positions, zero, s, one{step})
        e = Gather<axis = 0>(table, p)
        sum = Add(w, e)
        y = Identity(sum)
    }}
"""


def _embeddings(extra: str = "", step: str = "") -> dict[str, ir.Value]:
    text = EMBEDDINGS.format(
        extra=extra,
        step=step,
        WORDS="{" + ", ".join(["0.5"] * 40) + "}",
        TABLE="{" + ", ".join(["0.25"] * 64) + "}",
        POSITIONS="{" + ", ".join(str(i) for i in range(16)) + "}",
    )
    model = parse_model(text)
    InferShapesPass()(model)
    return {str(o.name): o for node in model.graph for o in node.outputs}


def test_embeddings_plus_sliced_positions_keep_the_sequence_name() -> None:
    # TorchScript's BERT-family embeddings: position_ids[:, :S] of a [1, 16] buffer, S read off
    # the word embeddings. The slice is min(S, 16) long, which ONNX names afresh; added to the
    # [B, S, D] embeddings it is S (or the Add fails), so the sum keeps S's name (and the slice's
    # untouched dim 0 is 1).
    values = _embeddings()
    summed, positions = values["sum"].shape, values["e"].shape
    assert summed is not None and positions is not None
    assert [d if isinstance(d, int) else d.value for d in summed] == ["B", "S", 4], summed
    assert positions[0] == 1
    # A step that is not a constant may skip positions: the slice is no prefix, nothing is claimed.
    values = _embeddings(extra=", int64[1] step", step=", step")
    summed = values["sum"].shape
    assert summed is not None and getattr(summed[1], "value", None) != "S", summed


# tf2onnx computes shapes in int32, as TensorFlow does, and casts the target back to int64.
INT32_TARGET = """
<ir_version: 8, opset_import: ["" : {opset}]>
g (float[B, S, 8] x) => (float[B, S, 2, 4] y) <int64[1] zero = {{0}}, int64[1] one = {{1}}, int32[3] heads = {{-1, 2, 4}}, int64[2] rows = {{-1, 8}}> {{
    f = Reshape(x, rows)
    s = Shape(x)
    s32 = Cast <to = 6> (s)
    b = Slice(s32, zero, one, zero)
    t32 = Concat <axis = 0> (b, heads)
    t = Cast <to = 7> (t32)
    y = Reshape(f, t)
}}
"""


def test_int32_target_is_read_in_int64_again() -> None:
    model = parse_model(INT32_TARGET.format(opset=17))
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats["shape values computed in int64 again"] == 1
    assert "Cast" not in op_types(result.model)
    shape = next(n for n in result.model.graph if n.op_type == "Shape")
    assert (shape.attributes.get_int("start"), shape.attributes.get_int("end")) == (0, 1)
    assert_numerically_equal(model, result.model)
    assert not FoldShapeValuesPass()(result.model).modified


def test_int32_target_before_opset_15_reads_a_slice_of_the_shape() -> None:
    model = parse_model(INT32_TARGET.format(opset=13))
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats["shape values computed in int64 again"] == 1
    assert op_types(result.model) == ["Reshape", "Shape", "Slice", "Concat", "Reshape"]
    assert_numerically_equal(model, result.model)


def test_int32_arithmetic_is_redone_in_int64() -> None:
    """tf2onnx's fairseq-style [B*H, -1, d] target: B times the head count, in int32."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 2, S, 4] x) => (float[M, S, 4] y) <int64[1] zero = {0}, int64[1] one = {1}, int32 two = {2}, int32[2] rest = {-1, 4}> {
            s = Shape(x)
            s32 = Cast <to = 6> (s)
            b = Slice(s32, zero, one, zero)
            b0 = Squeeze(b, zero)
            bh = Mul(b0, two)
            bh1 = Unsqueeze(bh, zero)
            t32 = Concat <axis = 0> (bh1, rest)
            t = Cast <to = 7> (t32)
            y = Reshape(x, t)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats["shape values computed in int64 again"] == 1
    reshape = next(n for n in result.model.graph if n.op_type == "Reshape")
    target = reshape.inputs[1]
    assert target is not None and target.producer() is not None
    assert target.producer().op_type == "Concat" and target.dtype == ir.DataType.INT64
    assert "Cast" not in op_types(result.model)
    assert_numerically_equal(model, result.model)
    assert not FoldShapeValuesPass()(result.model).modified


def test_int32_arithmetic_of_an_outer_scope_is_left_to_it() -> None:
    """A branch casting the outer graph's int32 shape arithmetic to int64 (tf2onnx's LED): the
    int64 twins would belong to the outer graph, so the branch keeps its Cast (this crashed)."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 2, S, 4] x, bool c) => (float[M, S, 4] y) <int64[1] zero = {0}, int64[1] one = {1}, int32 two = {2}, int32[2] rest = {-1, 4}> {
            s = Shape(x)
            s32 = Cast <to = 6> (s)
            b = Slice(s32, zero, one, zero)
            b0 = Squeeze(b, zero)
            bh = Mul(b0, two)
            bh1 = Unsqueeze(bh, zero)
            t32 = Concat <axis = 0> (bh1, rest)
            y = If (c) <
                then_branch = g1 () => (float[M, S, 4] a) {
                    t = Cast <to = 7> (t32)
                    a = Reshape(x, t)
                },
                else_branch = g2 () => (float[M, S, 4] b) {
                    t = Cast <to = 7> (t32)
                    r = Reshape(x, t)
                    b = Neg(r)
                }
            >
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert not result.stats["shape values computed in int64 again"]
    report = validate(model, result.model)
    assert report.passed, report


def test_int32_values_not_read_off_a_shape_keep_their_casts() -> None:
    """An int32 input cast to int64 may hold anything: it is no dim."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 8] x, int32[2] n) => (float[C, D] y) {
            t = Cast <to = 7> (n)
            y = Reshape(x, t)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert not result.modified


def _model(body: str, inputs: str, outputs: str, opset: int = 17) -> ir.Model:
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({inputs}) => ({outputs}) {body}'
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    InferShapesPass()(model)
    return model


@pytest.mark.parametrize("opset", [13, 15])
def test_einsum_batch_dims_are_read_off_the_tensor_they_come_from(opset: int) -> None:
    """``Gather(Shape(Transpose(Unsqueeze(x))), [0, 1])`` reads x's dims 0 and 2: the views then
    have no other user (tf2onnx reads every einsum operand's batch off its transposed view)."""
    original = _model(
        "<int64[1] a = {2}, int64[2] lead = {0, 1}> { u = Unsqueeze(x, a)\n"
        " t = Transpose<perm=[0,3,2,1]>(u)\n s = Shape(t)\n g = Gather(s, lead)\n"
        " y = ConstantOfShape(g) }",
        inputs="float[N,S,D] x",
        outputs="float[N,D] y",
        opset=opset,
    )
    result = FoldShapeValuesPass()(original.clone())
    assert result.stats["dims read off the tensor they come from"] == 1
    shapes = [node for node in result.model.graph if node.op_type == "Shape"]
    assert shapes and all(
        node.inputs[0] is not None and node.inputs[0].name == "x" for node in shapes
    )
    assert validate(original, result.model).passed


def test_max_of_a_broadcast_dim_and_its_operand_dim_is_the_broadcast_dim() -> None:
    """tf2onnx's einsum batch ``Max(g_a, g_b)``: masked scores' batch (a broadcast of the scores'
    batch and the mask's) against V's batch, which the scores' batch is. A broadcast that ran is
    at least its operands' dims, so the Max is the masked scores' dim, read as such."""
    original = _model(
        "<int64[1] zero = {0}> { a = Add(s, m)\n sa = Shape(a)\n ga = Gather(sa, zero)\n"
        " sv = Shape(v)\n gv = Gather(sv, zero)\n g = Max(ga, gv)\n r = Reshape(v, g)\n y = Relu(r) }",
        inputs="float[B,4] s, float[C,4] m, float[B] v",
        outputs="float[B] y",
    )
    result = FoldShapeValuesPass()(original.clone())
    assert "Max" not in op_types(result.model)
    rng = np.random.default_rng(0)
    feeds = [
        {"s": rng.normal(size=(b, 4)), "m": rng.normal(size=(c, 4)), "v": rng.normal(size=(b,))}
        for b, c in ((3, 1), (3, 3), (1, 1))
    ]
    feeds = [{k: v.astype(np.float32) for k, v in feed.items()} for feed in feeds]
    assert validate(original, result.model, inputs=feeds).passed


# TorchScript's DeBERTa attention: the query heads are [B*H, S, d] (a -1 merged B and H), and the
# relative-position keys are tiled ``heads.size(0) // H`` times, then scaled by the square root
# of the tiled keys' last dim.
MERGED_HEADS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x, float[1, 6, 8] pos) => (float[?, ?, ?] y) <int64[4] split = {0, 0, 2, 4}, int64[4] pos_split = {1, 6, 2, 4}, int64[3] pos_heads = {-1, 6, 4}, int64[1] minus_one = {-1}, int64[1] four = {4}, int64[1] one = {1}, int64 zero = {0}, int64 heads = DIVISOR, int64[1] axes = {0}> {
    q = Reshape(x, split)
    qt = Transpose<perm = [0, 2, 1, 3]>(q)
    s = Shape<start = 1, end = 2>(x)
    target = Concat<axis = 0>(minus_one, s, four)
    merged = Reshape(qt, target)
    p = Reshape(pos, pos_split)
    pt = Transpose<perm = [0, 2, 1, 3]>(p)
    keys = Reshape(pt, pos_heads)
    ms = Shape(merged)
    n = Gather<axis = 0>(ms, zero)
    b = Div(n, heads)
    bu = Unsqueeze(b, axes)
    repeats = Concat<axis = 0>(bu, one, one)
    tiled = Tile(keys, repeats)
    d = Shape<start = -1>(tiled)
    scale = Cast<to = 1>(d)
    kt = Transpose<perm = [0, 2, 1]>(tiled)
    scores = MatMul(merged, kt)
    y = Div(scores, scale)
}
"""


def test_a_merged_dim_divided_by_its_static_part_is_the_other_part() -> None:
    model = parse_model(MERGED_HEADS.replace("DIVISOR", "{2}"))
    InferShapesPass()(model)
    tiled = next(node for node in model.graph if node.op_type == "Tile").outputs[0]
    assert tiled.shape is not None and list(tiled.shape)[1:] == [6, 4]  # the repeats of 1
    result = FoldShapeValuesPass()(model.clone())
    # the Tile repeats B, read off x: the merged heads' shape and the Div are gone, and the
    # keys' last dim is a constant
    ops = op_types(result.model)
    assert ops.count("Div") == 1 and ops.count("Gather") == 0, ops
    shapes = [node for node in result.model.graph if node.op_type == "Shape"]
    assert {str(node.inputs[0].name) for node in shapes} == {"x"}, shapes
    assert result.stats["dims read off the tensor they come from"] == 1, result.stats
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2, report
    assert not FoldShapeValuesPass()(result.model).modified


@pytest.mark.parametrize("divisor", [3, 4, 1])
def test_a_merged_dim_divided_by_anything_else_is_left_alone(divisor: int) -> None:
    """B*2 // 3 and B*2 // 4 are no dim (only the /1 of the plain rule goes)."""
    text = MERGED_HEADS.replace("DIVISOR", f"{{{divisor}}}")
    text = text.replace("scores = MatMul(merged, kt)", "nb = Identity(b)")  # B*2 // 3 is no B
    text = text.replace("y = Div(scores, scale)", "y = Div(kt, scale)")
    model = parse_model(text.replace("(float[?, ?, ?] y)", "(float[?, ?, ?] y, int64 nb)"))
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    ops = op_types(result.model)
    assert ops.count("Div") == (1 if divisor == 1 else 2), ops
    if divisor != 1:
        assert ops.count("Gather") == 1, ops
    report = validate(model, result.model)
    assert report.passed, report


def test_a_minus_one_of_two_named_dims_is_no_single_dim() -> None:
    """[B, S, 8] -> [-1, 4] is B*S*2: halved it is B*S, two dims, so the Div stays."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S, 8] x) => (int64 n) <int64[2] target = {-1, 4}, int64 zero = {0}, int64 two = {2}> {
            r = Reshape(x, target)
            rs = Shape(r)
            d = Gather<axis = 0>(rs, zero)
            n = Div(d, two)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert op_types(result.model).count("Div") == 1
    assert validate(model, result.model).passed


def test_an_expand_target_entry_the_input_has_already_becomes_one() -> None:
    """TorchScript's padding mask: ``mask[:, None, None, :].expand(B, 1, S, S)`` with B read off
    the hidden states. B is the mask's own dim (1 broadcasts to it), so the read of B dies; the
    S at axis 2 is not (the mask has 1 there) and stays."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S] mask, float[B, S, 8] x) => (float[B, 1, S, S] y) <int64[2] axes = {1, 2}, int64[1] one = {1}> {
            m = Unsqueeze(mask, axes)
            b = Shape<start = 0, end = 1>(x)
            s = Shape<start = 1, end = 2>(x)
            target = Concat<axis = 0>(b, one, s, s)
            y = Expand(m, target)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert result.stats["Expand target dims the input has made 1"] == 1, result.stats
    reads = [node for node in result.model.graph if node.op_type == "Shape"]
    assert [(n.attributes.get_int("start", 0), n.attributes.get_int("end", 0)) for n in reads] == [
        (1, 2)
    ], reads
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2, report
    assert not FoldShapeValuesPass()(result.model).modified


def test_an_expand_target_entry_of_another_dim_stays() -> None:
    """The entries read T and U where the input has B and S: Expand fails unless they are equal
    or the input's are 1, and rewriting them to 1 would hide that."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S] mask, float[T, U, 8] x) => (float[?, ?] y) <int64[1] zero = {0}> {
            t = Shape<start = 0, end = 2>(x)
            y = Expand(mask, t)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert "Expand target dims the input has made 1" not in result.stats, result.stats


def test_torchscript_expand_target_is_read_without_its_minus_one_test() -> None:
    """``expand(B, -1, S, S)`` written as ``Where(Equal(t, -1), 1, t)``: the Where picks dims
    read and constants, so it is rebuilt as those reads (and B, the mask's own, as 1)."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool[B, 1, 1, S] m, float[B, S, 8] x) => (bool[?, ?, ?, ?] y) <int64[1] m1 = {-1}, int64[4] m1s = {-1, -1, -1, -1}, int64[4] ones = {1, 1, 1, 1}> {
            b = Shape<start = 0, end = 1>(x)
            s = Shape<start = 1, end = 2>(x)
            target = Concat<axis = 0>(b, m1, s, s)
            eq = Equal(target, m1s)
            w = Where(eq, ones, target)
            y = Expand(m, w)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    ops = op_types(result.model)
    assert "Where" not in ops and "Equal" not in ops, ops
    assert ops.count("Shape") == 1, ops
    report = validate(model, result.model)
    assert report.passed and len(report.trials) == 2, report
    assert not FoldShapeValuesPass()(result.model).modified


def test_an_expand_target_entry_read_for_something_else_too_stays() -> None:
    """B is the mask's own dim, but its read also feeds a Range (dynamo's index grids): no read
    would die, and the matchers after read the expanded shape off the target, so it stays."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, S] mask, float[B, S, 8] x) => (float[B, 1, S, S] y, int64[B] r) <int64[2] axes = {1, 2}, int64[1] one = {1}, int64 zero = {0}, int64 step = {1}> {
            m = Unsqueeze(mask, axes)
            b = Shape<start = 0, end = 1>(x)
            s = Shape<start = 1, end = 2>(x)
            target = Concat<axis = 0>(b, one, s, s)
            y = Expand(m, target)
            n = Squeeze(b)
            r = Range(zero, n, step)
        }
        """
    )
    InferShapesPass()(model)
    result = FoldShapeValuesPass()(model.clone())
    assert "Expand target dims the input has made 1" not in result.stats, result.stats
