from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from graphs import assert_numerically_equal, op_types, parse_model

from onnxopt.passes.deduplicate_initializers import DeduplicateInitializersPass
from onnxopt.passes.eliminate_common_subexpressions import EliminateCommonSubexpressionsPass
from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.passes.sort_topologically import SortTopologicallyPass

DEAD = """
<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
    unused = Relu(x)
    also_unused = Sigmoid(unused)
    y = Abs(x)
    z = Neg(x)
}
"""


def test_dead_code_removes_unused_nodes_and_opsets_but_keeps_outputs() -> None:
    model = parse_model(DEAD)
    result = EliminateDeadCodePass()(model.clone())
    assert result.stats == {"nodes removed": 2, "opsets removed": 1}
    assert op_types(result.model) == ["Abs", "Neg"]
    assert "custom" not in result.model.opset_imports
    assert_numerically_equal(model, result.model)
    assert not EliminateDeadCodePass()(result.model).modified


def test_dead_code_removes_unused_initializers() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) <float[4] w = {1, 2, 3, 4}, float[2] dead = {5, 6}> {
            y = Add(x, w)
        }
        """
    )
    result = EliminateDeadCodePass()(model.clone())
    assert result.stats == {"initializers removed": 1}
    assert list(result.model.graph.initializers) == ["w"]


def test_dead_code_keeps_a_graph_output_nothing_else_uses() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) { y = Relu(x) }
        """
    )
    assert not EliminateDeadCodePass()(model).modified


def test_dead_code_leaves_nothing_for_a_second_run() -> None:
    # A dead chain whose last reader sits in an If branch that is itself dead within the
    # branch, an initializer read only there, and a local function only dead nodes call: one run
    # removes all of it, as "settled" promises.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (float[4] x, bool c) => (float[4] y) <float[4] w = {1, 2, 3, 4}> {
            a = Relu(x)
            b = local.Twice(a)
            y = If(c) <
                then_branch = t () => (float[4] t_out) { dead = Add(b, w) t_out = Abs(x) },
                else_branch = e () => (float[4] e_out) { e_out = Neg(x) }
            >
        }
        <domain: "local", opset_import: ["" : 17]>
        Twice (v) => (out) { out = Add(v, v) }
        """
    )
    result = EliminateDeadCodePass()(model.clone())
    assert result.settled
    assert result.stats == {
        "nodes removed": 4,  # Relu, the call, the branch's Add, and the function's Add
        "initializers removed": 1,
        "functions removed": 1,
        "opsets removed": 1,
    }
    assert not EliminateDeadCodePass()(result.model).modified
    assert_numerically_equal(model, result.model)


CSE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) {
    a = Relu(x)
    b = Relu(x)
    c = Transpose<perm = [1, 0]>(a)
    d = Transpose<perm = [1, 0]>(b)
    e = Transpose<perm = [1, 0]>(x)
    f = Add(c, d)
    g2 = Add(f, e)
    y = Transpose<perm = [1, 0]>(g2)
}
"""


def test_cse_merges_identical_nodes_only() -> None:
    model = parse_model(CSE)
    result = EliminateCommonSubexpressionsPass()(model.clone())
    assert result.stats == {"nodes merged": 2}
    assert op_types(result.model).count("Relu") == 1
    assert op_types(result.model).count("Transpose") == 3  # transposes of different inputs stay
    assert_numerically_equal(model, result.model)
    assert not EliminateCommonSubexpressionsPass()(result.model).modified


@pytest.mark.parametrize("opset", [13, 18])
def test_cse_merges_reductions_over_the_same_dims_spelled_apart(opset: int) -> None:
    """torch's dynamo x.std(-1) beside x.mean(-1): ReduceMean over [2] and over [-1] of one rank-3
    tensor (axes an input from opset 18, an attribute before); keepdims apart, or another input's,
    they stay."""

    def reduce(axes: str, keepdims: int, data: str = "x") -> str:
        if opset >= 18:
            return f"ReduceMean<keepdims={keepdims}>({data}, {axes})"
        return f"ReduceMean<keepdims={keepdims}, axes={axes.replace('last', '[-1]').replace('two', '[2]')}>({data})"

    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, S, 8] x, float[N, S, 8] z) => (float[N, S, 1] y, float[N, S] w) <int64[1] last = {{-1}}, int64[1] two = {{2}}> {{
            a = {reduce("last", 1)}
            b = {reduce("two", 1)}
            c = {reduce("two", 0)}
            d = {reduce("last", 1, "z")}
            s = Sub(x, a)
            t = Sub(x, b)
            u = Add(s, t)
            v = {"ReduceMax<keepdims=1>(u, last)" if opset >= 18 else "ReduceMax<keepdims=1, axes=[-1]>(u)"}
            e = Add(v, d)
            y = Add(e, a)
            w = Relu(c)
        }}
        """
    )
    result = EliminateCommonSubexpressionsPass()(model.clone())
    assert result.stats == {"nodes merged": 2}  # b into a, then t into s
    assert op_types(result.model).count("ReduceMean") == 3
    assert_numerically_equal(model, result.model)
    assert not EliminateCommonSubexpressionsPass()(result.model).modified


def test_cse_never_merges_random_ops() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) {
            r1 = RandomUniformLike(x)
            r2 = RandomUniformLike(x)
            y = Add(r1, r2)
        }
        """
    )
    assert not EliminateCommonSubexpressionsPass()(model).modified


def test_duplicate_initializers_are_merged() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x) => (float[3] y) <float[3] a = {1, 2, 3}, float[3] b = {1, 2, 3}, float[3] c = {1, 2, 4}> {
            s = Add(x, a)
            t = Mul(s, b)
            y = Sub(t, c)
        }
        """
    )
    result = DeduplicateInitializersPass()(model.clone())
    assert result.stats == {"initializers merged": 1}
    assert sorted(result.model.graph.initializers) == ["a", "c"]
    assert_numerically_equal(model, result.model)
    assert not DeduplicateInitializersPass()(result.model).modified


def test_duplicate_initializers_with_different_dtype_stay() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[2] x, int32[2] x2) => (int64[2] y, int32[2] y2) <int64[2] a = {1, 2}, int32[2] b = {1, 2}> {
            y = Add(x, a)
            y2 = Add(x2, b)
        }
        """
    )
    assert not DeduplicateInitializersPass()(model).modified


def test_topological_sort_is_stable_and_fixes_order() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) {
            a = Relu(x)
            b = Abs(x)
            y = Add(a, b)
        }
        """
    )
    assert not SortTopologicallyPass()(model.clone()).modified  # already valid: untouched
    graph = model.graph
    add = graph.node(2)
    graph.remove(add)
    graph.insert_before(graph.node(0), add)  # now Add comes before its producers
    result = SortTopologicallyPass()(model)
    assert result.modified
    assert op_types(result.model) == ["Relu", "Abs", "Add"]


def test_topological_sort_sees_a_branch_reading_a_later_outer_value() -> None:
    # the If node has no input from Abs: only its branches read it (an outer-scope read)
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, bool flag) => (float[4] y) {
            y = If(flag) <then_branch = t () => (float[4] a) { a = Relu(late) },
                          else_branch = e () => (float[4] b) { b = Neg(late) }>
            late = Abs(x)
        }
        """
    )
    result = SortTopologicallyPass()(model)
    assert result.modified
    assert [node.op_type for node in result.model.graph] == ["Abs", "If"]


@pytest.mark.parametrize("interface_unk", [False, True])
def test_shape_inference_reads_an_exporters_unk_dims_as_unknown(interface_unk: bool) -> None:
    # onnxruntime-genai's builder writes "unk" for every intermediate dim it cannot tell: not one
    # dim (here two different ones), so inference's names replace it. A model input that names a
    # dim "unk" declares it: then the name is kept everywhere.
    dims = "unk, seq" if interface_unk else "batch, seq"
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{dims}] x) => (y) {{
            a = Relu(x)
            y = Neg(a)
        }}
        """
    )
    a = next(iter(model.graph)).outputs[0]
    a.shape = ir.Shape(["unk", "unk"])
    result = InferShapesPass()(model)
    if interface_unk:
        assert [str(d) for d in a.shape] == ["unk", "unk"]
        assert "dims named 'unk' unnamed" not in result.stats
    else:
        assert [str(d) for d in a.shape] == ["batch", "seq"]
        assert result.stats["dims named 'unk' unnamed"] == 2


def test_shape_inference_keeps_symbolic_dims() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 3, 8] x) => (y) {
            t = Transpose<perm = [0, 2, 1]>(x)
            y = Relu(t)
        }
        """
    )
    result = InferShapesPass()(model)
    assert result.modified
    y = result.model.graph.outputs[0]
    assert y.dtype == ir.DataType.FLOAT
    assert y.shape is not None
    assert [str(d) for d in y.shape] == ["batch", "8", "3"]
    assert not InferShapesPass()(result.model).modified


def test_placeholder_dims_are_renamed_once_a_rewrite_proves_them() -> None:
    # m = Reshape(mask, t), t a runtime value, hides the dims from inference: they get made-up
    # names, recorded on m, c and d. Once the Reshape is gone (as eliminate-noops removes one it
    # proves a no-op), inference without the recorded names proves the dims are [batch, seq];
    # ONNX alone would keep "unk__".
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[batch, seq] mask, int64[2] t) => (float[batch, seq] d) {
            m = Reshape(mask, t)
            c = Cast<to = 1>(m)
            d = Relu(c)
        }
        """
    )
    InferShapesPass()(model)
    c = next(n for n in model.graph if n.op_type == "Cast")
    assert c.outputs[0].shape is not None
    made_up = str(c.outputs[0].shape[1])
    assert made_up.startswith("unk__")
    reshape = model.graph.node(0)
    c.replace_input_with(0, model.graph.inputs[0])
    model.graph.remove(reshape, safe=True)
    result = InferShapesPass()(model)
    assert result.stats["placeholder dims resolved"] == 1  # c; d's dims come from the output
    assert [str(d) for d in c.outputs[0].shape] == ["batch", "seq"]
    assert not InferShapesPass()(model).modified


def test_shape_inference_does_not_run_onnx_on_a_fully_known_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnx.shape_inference

    calls: list[int] = []
    real = onnx.shape_inference.infer_shapes

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x) => (float[2, 3] y) { t = Relu(x) y = Neg(t) }
    """
    model = parse_model(text)
    first = InferShapesPass()(model)  # t has no recorded shape: ONNX runs
    assert first.stats == {"shapes inferred": 1, "types inferred": 1} and calls
    calls.clear()
    again = InferShapesPass()(model)  # every value typed and static: nothing to learn
    assert not again.modified and again.settled and not calls
    # One symbolic dim anywhere and inference runs: a name can still be learnt.
    symbolic = parse_model(text.replace("float[2, 3] x", "float[N, 3] x"))
    InferShapesPass()(symbolic)
    calls.clear()
    InferShapesPass()(symbolic)
    assert calls


def test_shape_inference_names_a_recorded_unknown_dim() -> None:
    # Exporters record unknown dims (r: [batch, 4, ?]); inference proves it is "length". Before,
    # only more sizes counted, and a second optimize run (shapes dropped, inferred from scratch)
    # found the Reshape(r, Shape(x)) no-op the first run missed (wav2vec2's GroupNorm).
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 4, length] x) => (float[batch, 4, length] y) <float[batch, 4, ?] r> {
            r = Relu(x)
            y = Abs(r)
        }
        """
    )
    result = InferShapesPass()(model)
    assert result.stats == {"shapes inferred": 1}
    assert [str(d) for d in model.graph.node(0).outputs[0].shape] == ["batch", "4", "length"]
    assert not InferShapesPass()(model).modified


def test_placeholders_inferred_alike_become_one_name() -> None:
    # As recorded after a rewrite: n = Relu(r) kept the made-up name of an input it no longer has
    # (wav2vec2's TorchScript GroupNorm). Inferred afresh, r and n share one made-up dim.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 8, length] x) => (float[batch, 4, unk__0] y)
            <int64[3] t = {0, 4, -1}, float[batch, 4, unk__0] r, float[batch, 4, unk__1] n> {
            r = Reshape(x, t)
            n = Relu(r)
            y = Abs(n)
        }
        """
    )
    result = InferShapesPass()(model)
    assert result.stats["placeholder dims resolved"] == 1
    assert [str(d) for d in model.graph.node(1).outputs[0].shape] == ["batch", "4", "unk__0"]
    assert not InferShapesPass()(model).modified


def test_shape_inference_keeps_batch_through_dynamo_reshape_and_repeat() -> None:
    # SigLIP's dynamo export: the patches flattened by Reshape(allowzero=1, [-1, 64, 16]) and the
    # pooling head's probe.repeat(B, 1, 1). ONNX names both batch dims afresh; the exporter's
    # value_info had "batch". Without it (a second optimize run, the ort target having dropped
    # the annotations), tensor sizes differed and reorder-for-memory chose another order: the
    # output was not a fixed point.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 64, 4, 4] x, float[1, 1, 64] probe) => (y, z)
            <int64[3] t = {-1, 64, 16}, int64[2] ones = {1, 1}> {
            y = Reshape<allowzero = 1>(x, t)
            b = Shape<start = 0, end = 1>(x)
            reps = Concat<axis = 0>(b, ones)
            z = Tile(probe, reps)
        }
        """
    )
    InferShapesPass()(model)
    assert [str(d) for d in model.graph.node(0).outputs[0].shape] == ["batch", "64", "16"]
    assert [str(d) for d in model.graph.node(3).outputs[0].shape] == ["batch", "1", "64"]
    assert not InferShapesPass()(model).modified


def test_shape_inference_expands_a_prefix_slice_to_the_dim_it_was_cut_to() -> None:
    # BERT's TorchScript token_type_ids: buffer[:, :S] is min(S, 512) long, and expanded to
    # Shape(input_ids) it is S (or the Expand fails): [batch, sequence], as the word embeddings.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[batch, sequence] ids) => (y)
            <int64[1] zero1 = {0}, int64[1] one1 = {1}, int64[2] full = {1, 512}> {
            buffer = ConstantOfShape(full)
            shp = Shape(ids)
            s = Shape <start = 1, end = 2> (ids)
            sl = Slice(buffer, zero1, s, one1)
            y = Expand(sl, shp)
        }
        """
    )
    InferShapesPass()(model)
    assert [str(d) for d in model.graph.node(4).outputs[0].shape] == ["batch", "sequence"]


# LFM2's short convolution as TorchScript writes it: the mask's last S positions gate the input,
# a depthwise conv padded by kernel - 1 on both sides, then its first S outputs.
SHORT_CONV = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, sequence, 4] x, int64[batch, sequence] mask, float[batch, other] z) => (y)
        <int64[1] one1 = {{1}}, int64[1] two1 = {{2}}, int64[1] zero1 = {{0}},
         int64[1] big = {{9223372036854775807}}, float[4, 1, 3] w = {{{weights}}}> {{
        s = Shape <start = 1, end = 2> (x)
        n = Squeeze(s)
        minus = Neg(n)
        start = Unsqueeze(minus, zero1)
        recent = Slice(mask, start, big, one1)
        keep = Unsqueeze(recent, two1)
        kf = Cast <to = 1> (keep)
        gated = Mul(x, kf)
        channels = Transpose <perm = [0, 2, 1]> (gated)
        conv = Conv <group = 4, pads = [{pad}, {pad}]> (channels, w)
        length = Shape <start = {axis}, end = {axis_end}> ({source})
        y = Slice(conv, zero1, length, two1)
    }}
"""


@pytest.mark.parametrize(
    ("pad", "source", "proved"),
    [(2, "channels", True), (1, "channels", True), (0, "channels", False), (2, "z", False)],
)
def test_shape_inference_follows_a_causal_short_convolution(
    pad: int, source: str, proved: bool
) -> None:
    """mask[:, -S:] of an S-long mask is S long; the first S outputs of a conv padded by
    kernel - 1 are S. A conv padded less may be shorter than S, and a slice to another length
    is that length or shorter."""
    axis = 2 if source == "channels" else 1
    text = SHORT_CONV.format(
        weights=", ".join(["0.5"] * 12), pad=pad, axis=axis, axis_end=axis + 1, source=source
    )
    model = parse_model(text)
    for _ in range(3):  # as the pipeline's fixed point: re-inferred once the slices are named
        InferShapesPass()(model)
    nodes = {node.outputs[0].name: node for node in model.graph}
    assert [str(d) for d in nodes["gated"].outputs[0].shape] == ["batch", "sequence", "4"]
    shape = nodes["y"].outputs[0].shape
    assert shape is not None and str(shape[0]) == "batch" and shape[1] == 4
    assert (str(shape[2]) == "sequence") == proved, shape


@pytest.mark.parametrize(
    ("op", "attributes", "kept"),
    [
        ("Conv", "pads = [1, 1, 1, 1]", True),
        ("Conv", "pads = [0, 2, 2, 0]", True),  # uneven, the same sum
        ("Conv", 'auto_pad = "SAME_UPPER"', True),
        ("Conv", "dilations = [2, 2], pads = [2, 2, 2, 2]", True),
        ("Conv", "dilations = [2, 2], pads = [1, 1, 1, 1]", False),
        ("Conv", "pads = [1, 1, 1, 1], strides = [2, 2]", False),
        ("Conv", "pads = [0, 0, 0, 0]", False),
        ("MaxPool", "kernel_shape = [3, 3], pads = [1, 1, 1, 1]", True),
        ("AveragePool", 'kernel_shape = [3, 3], auto_pad = "VALID"', False),
        ("MaxPool", "kernel_shape = [2, 2], strides = [2, 2]", False),
    ],
)
def test_shape_inference_keeps_the_dims_a_window_neither_shrinks_nor_strides(
    op: str, attributes: str, kept: bool
) -> None:
    """ONNX computes a Conv's or pool's spatial dims only when they are numbers; stride 1 with
    pads that sum to dilation * (kernel - 1) keeps a dynamic H and W (a padded 3x3 conv)."""
    inputs = "x, w" if op == "Conv" else "x"
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4, H, W] x) => (float[?, ?, ?, ?] y) <float[8, 4, 3, 3] w = {{{", ".join(["0.1"] * 288)}}}> {{
            y = {op} <{attributes}> ({inputs})
        }}
        """
    )
    InferShapesPass()(model)
    shape = model.graph.node(0).outputs[0].shape
    assert shape is not None and str(shape[0]) == "N", shape
    assert ([str(shape[2]), str(shape[3])] == ["H", "W"]) == kept, shape


def test_shape_inference_does_not_take_a_shorter_static_suffix_for_the_whole_axis() -> None:
    """d[:, -n:] with n = 5 read off x and d 7 long is 5 long, not 7."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 5] x, float[2, 7] d) => (y)
            <int64[1] one1 = {1}, int64[1] zero1 = {0}, int64[1] big = {9223372036854775807}> {
            s = Shape <start = 1, end = 2> (x)
            n = Squeeze(s)
            minus = Neg(n)
            start = Unsqueeze(minus, zero1)
            y = Slice(d, start, big, one1)
        }
        """
    )
    InferShapesPass()(model)
    shape = model.graph.node(4).outputs[0].shape
    assert shape is not None and shape[1] != 7, shape


def test_input_shape_pinning() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 3] x) => (y) { y = Relu(x) }
        """
    )
    result = InferShapesPass(PassOptions(input_shapes={"x": (4, 3)}))(model)
    assert result.stats["inputs pinned"] == 1
    assert result.model.graph.outputs[0].shape == ir.Shape([4, 3])


@pytest.mark.parametrize("bad", [{"nope": (1, 3)}, {"x": (1, 3, 4)}])
def test_input_shape_pinning_rejects_bad_requests(bad: dict[str, tuple[int, ...]]) -> None:
    from onnxopt.errors import UsageError

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 3] x) => (y) { y = Relu(x) }
        """
    )
    with pytest.raises(UsageError):
        InferShapesPass(PassOptions(input_shapes=bad))(model)


def test_validation_catches_a_wrong_rewrite() -> None:
    from onnxopt.validate import validate

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }
        """
    )
    broken = model.clone()
    broken.graph.node(0).op_type = "Abs"
    report = validate(model, broken)
    assert not report.passed
    assert report.failing_outputs() == ["y"]
    assert len(report.trials) == 2  # the dynamic dim was tried at two sizes
    assert {t["x"][0] for t in report.trials} == {1, 3}


@pytest.mark.parametrize(
    ("classes", "high"),
    [("{0, 1, 2, 3, 4, 5}", 6), ("{5, 4, 3, 2, 1, 0}", 6), ("{0, 2, 3, 4, 5, 6}", None)],
    ids=["arange", "reversed", "not-a-range"],
)
def test_validation_keeps_one_hot_ids_below_the_depth(classes: str, high: int | None) -> None:
    from onnxopt.validate import input_specs, make_inputs

    # jax's one_hot through tf2onnx (magika): Equal(Expand(Reshape(ids, [B, S, 1])), 0..n-1);
    # ids of 0 and 1 alone would leave most classes cold. ONNX OneHot gives its depth.
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (int32[B, S] ids, int64[B] labels) => (bool[B, S, 6] hot, float[B, 9] y)
          <int32[1, 1, 6] classes = {classes}, int64[3] split = {{0, 0, 1}},
           float[2] values = {{0, 1}}, int64 depth = {{9}}> {{
            r = Reshape(ids, split)
            shape = Shape(r)
            full = Concat<axis = 0>(shape)
            e = Expand(r, full)
            hot = Equal(e, classes)
            y = OneHot<axis = -1>(labels, depth, values)
        }}
        """
    )
    specs = {spec.name: spec for spec in input_specs(model)}
    assert specs["ids"].int_high == high
    assert specs["labels"].int_high == 9
    feeds = make_inputs(list(specs.values()), lambda d: 64, np.random.default_rng(0))
    assert feeds is not None
    assert feeds["labels"].max() > 1  # not just the 0s and 1s of an unknown integer
    if high is not None:
        assert feeds["ids"].max() < high


def test_an_output_the_original_gives_as_nan_everywhere_is_called_out(tmp_path: Path) -> None:
    """NaN equals NaN in the comparison, so an output the original computes as NaN at every
    element passes whatever the optimized model does (a jax2tf model whose tf2onnx select turns
    jnp.take's NaN fill into 0 * NaN): the report says so instead of a silent pass."""
    import onnx

    from onnxopt import api
    from onnxopt.validate import validate

    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 4] x) => (float[B, 4] y, float[B, 4] z) {
            d = Sub(x, x)
            y = Div(d, d)
            z = Relu(x)
        }
        """
    model = parse_model(text)
    report = validate(model, model.clone())
    assert report.passed
    assert report.all_nan == ("y",)  # z is finite; NaN only where the whole output is
    source = tmp_path / "nan.onnx"
    onnx.save(onnx.parser.parse_model(text), str(source))
    warnings = api.optimize(source).report.warnings
    assert any("output 'y' is NaN at every element" in w for w in warnings), warnings
    assert not any("'z'" in w for w in warnings)


def test_validation_keeps_token_ids_inside_the_embedding() -> None:
    from onnxopt.validate import input_specs, make_inputs

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[B, S] ids) => (float[B, S, 2] y, float[M, 2] z)
          <float[7, 2] table = {1,2,3,4,5,6,7,8,9,10,11,12,13,14}, float[5, 2] small = {1,2,3,4,5,6,7,8,9,10}> {
            shape = Constant<value = int64[1] {-1}>()
            flat = Reshape(ids, shape)
            z = Gather(table, flat)
            y = Gather(small, ids)
        }
        """
    )
    (spec,) = input_specs(model)
    assert spec.int_high == 5  # the smaller of the two tables, one reached through a Reshape
    feeds = make_inputs([spec], lambda d: d if isinstance(d, int) else 50, np.random.default_rng(0))
    assert feeds is not None
    assert feeds["ids"].max() < 5 and feeds["ids"].min() >= 0


def test_large_duplicate_initializers_are_merged_by_streamed_hash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onnxopt import io

    rng = np.random.default_rng(0)
    same = rng.standard_normal(2048).astype(np.float32)
    other = same.copy()
    other[-1] += 1.0  # same dtype, shape and hash-prefix: must still stay apart
    from onnx import TensorProto, helper, numpy_helper

    from onnxopt.io import model_from_proto

    nodes = [
        helper.make_node("Add", ["x", "w1"], ["a"]),
        helper.make_node("Add", ["a", "w2"], ["b"]),
        helper.make_node("Add", ["b", "w3"], ["y"]),
    ]
    weights = [
        numpy_helper.from_array(a, n) for n, a in (("w1", same), ("w2", same.copy()), ("w3", other))
    ]
    io_info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2048]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", [io_info[0]], [io_info[1]], weights)
    model = model_from_proto(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    path = tmp_path / "m.onnx"
    ir.save(model, path, external_data="m.onnx.data", size_threshold_bytes=16)
    loaded = io.load_model(path).model
    assert isinstance(loaded.graph.initializers["w2"].const_value, ir.ExternalTensor)
    result = DeduplicateInitializersPass()(loaded)
    assert result.stats == {"initializers merged": 1}
    assert sorted(result.model.graph.initializers) == ["w1", "w3"]
    assert_numerically_equal(io.load_model(path).model, result.model)


@pytest.mark.parametrize(
    ("node", "known"),
    [
        ("a = com.microsoft.FastGelu (x)", True),
        ("a = SimplifiedLayerNormalization <axis = -1> (x, g)", True),
        ("a = com.microsoft.MultiHeadAttention <num_heads = 2> (x, x, x)", True),
        ("a = com.microsoft.GroupQueryAttention <num_heads = 2> (x, x, x)", True),
        ("a = com.microsoft.Attention <num_heads = 2> (x, w)", True),
        # V narrower than the input: [B, S, 4], not x's shape; nothing is claimed
        (
            "a = com.microsoft.Attention <num_heads = 2, qkv_hidden_sizes = [8, 8, 4]> (x, w2)",
            False,
        ),
        ("a = com.microsoft.MultiHeadAttention <num_heads = 2> (x, x, v4)", False),
    ],
)
def test_shape_inference_sees_through_shape_preserving_ort_ops(node: str, known: bool) -> None:
    # ONNX inference does not know these ops: b (after a) used to have no shape at all.
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[batch, seq, 8] x, float[batch, seq, 4] v4, float[8, 24] w, float[8, 20] w2) => (b)
        <float[8] g = {{1, 1, 1, 1, 1, 1, 1, 1}}> {{
            {node}
            b = Relu(a)
        }}
        """
    )
    InferShapesPass()(model)
    b = model.graph.outputs[0]
    if known:
        assert b.shape is not None and [str(d) for d in b.shape] == ["batch", "seq", "8"]
    else:
        assert b.shape is None or "8" not in [str(d) for d in b.shape]
    assert not [n for n in model.graph if n.op_type == "Identity"]  # stand-ins never stay


@pytest.mark.parametrize(
    ("node", "dims"),
    [
        # An optimized file read again records no intermediate shapes: the widths these ops'
        # outputs take are not known before inference (h below), and every value after the first
        # one lost its shape (reorder-for-memory then kept the order)
        ("a = com.microsoft.MultiHeadAttention <num_heads = 2> (h, h, h)", "batch,seq,8"),
        ("a = com.microsoft.MultiHeadAttention <num_heads = 2> (h, h, v4)", "batch,seq,4"),
        ("a = com.microsoft.GroupQueryAttention <num_heads = 2> (h, h, h)", "batch,seq,8"),
        ("a = com.microsoft.Attention <num_heads = 2> (h, w)", "batch,seq,8"),
        (
            "a = com.microsoft.Attention <num_heads = 2, qkv_hidden_sizes = [8, 8, 4]> (h, w2)",
            "batch,seq,4",
        ),
        ("a = com.microsoft.FusedMatMul <transA = 1> (h, h)", "batch,8,8"),
        ("a = com.microsoft.FusedMatMul <transB = 1, alpha = 0.5> (h, h)", "batch,seq,seq"),
        ("a = com.microsoft.FusedMatMul (h, w)", "batch,seq,24"),
        (
            'a = com.microsoft.FusedConv <activation = "Relu", pads = [1, 1, 1, 1]> (i, k, kb)',
            "n,4,6,6",
        ),
        # Packed Q/K/V: [B, S, N*d] of [B, S, (N + 2*Nk)*d], known from the projection's width
        (
            "a = com.microsoft.GroupQueryAttention <num_heads = 2, kv_num_heads = 1> (p)",
            "batch,seq,12",
        ),
        (
            "a = com.microsoft.GroupQueryAttention <num_heads = 2, kv_num_heads = 1> (pb)",
            "batch,seq,12",
        ),
        ("a = com.microsoft.GroupQueryAttention <num_heads = 2, kv_num_heads = 1> (h)", None),
        ("a = com.microsoft.FusedMatMul <transBatchA = 1> (h, h)", None),
        (
            "a = com.microsoft.MatMulNBits <K = 8, N = 20, bits = 4, block_size = 16> (h, q4, sc)",
            "batch,seq,20",
        ),
    ],
)
def test_shape_inference_sees_through_ort_ops_on_values_without_recorded_shapes(
    node: str, dims: str | None
) -> None:
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[batch, seq, 8] x, float[batch, seq, 4] v4, float[8, 24] w, float[8, 20] w2,
           float[n, 3, 6, 6] image, float[4, 3, 3, 3] k, float[4] kb, float[24] bias,
           uint8[20, 1, 8] q4, float[20, 1] sc) => (b) {{
            h = Neg(x)
            i = Neg(image)
            p = MatMul(h, w)
            pb = Add(p, bias)
            {node}
            b = Relu(a)
        }}
        """
    )
    for value in model.graph.outputs:
        value.shape = None
    InferShapesPass()(model)
    b = model.graph.outputs[0]
    if dims is None:
        assert b.shape is None
    else:
        assert b.shape is not None and ",".join(map(str, b.shape)) == dims
    assert [n.op_type for n in model.graph][4] == node.split(" = com.microsoft.")[1].split(" ")[0]


def test_shape_inference_sees_through_a_skip_norm_whose_sum_is_read_too() -> None:
    # onnxruntime-genai chains its layers through the skip norms' sums (output 3)
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[batch, seq, 8] x, float[8] gamma) => (b, c) {
            h = Neg(x)
            o, m, v, total = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 1e-5> (h, h, gamma)
            b = Relu(o)
            c = Relu(total)
        }
        """
    )
    node = next(n for n in model.graph if n.domain == "com.microsoft")
    for index in (1, 2):  # unused, unnamed: as the builder writes them
        node.outputs[index].name = ""
    for value in model.graph.outputs:
        value.shape = None
    InferShapesPass()(model)
    assert [",".join(map(str, v.shape or ())) for v in model.graph.outputs] == ["batch,seq,8"] * 2
    assert [n.op_type for n in model.graph] == [
        "Neg",
        "SkipSimplifiedLayerNormalization",
        "Relu",
        "Relu",
    ]


@pytest.mark.parametrize(
    ("data", "bits", "width"),
    [
        ("uint8[10, 4]", 4, 8),  # two 4-bit values a byte
        ("uint8[10, 3]", 4, 6),  # an odd byte count: ORT still gives two columns a byte
        ("uint8[10, 4]", 8, 4),
        ("uint8[10, 4]", 2, 16),
        ("uint8[10, 1, 4]", 4, 8),  # the tied embedding: a constant view of a projection's weight
    ],
)
def test_shape_inference_sees_through_a_block_quantized_gather(
    data: str, bits: int, width: int
) -> None:
    # onnxruntime-genai's int4 embedding tied to the output projection (Gemma 2's): every value
    # after it had no shape on a file read again. The claim is checked against ORT's kernel.
    rank = data.count(",") + 1
    count = 10 * 4 if rank == 3 else 10 * int(data.split(", ")[1].rstrip("]"))
    values = ", ".join(str(v % 251) for v in range(count))
    view, source = ("d = Reshape(q, target)", "d") if rank == 3 else ("", "q")
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (int64[batch, seq] ids) => (b)
        <{data} q = {{{values}}}, int64[2] target = {{10, 4}}, float[10, 1] sc = {{{", ".join(["0.5"] * 10)}}}> {{
            {view}
            a = com.microsoft.GatherBlockQuantized <bits = {bits}, block_size = 16> ({source}, ids, sc)
            b = Relu(a)
        }}
        """
    )
    model.graph.outputs[0].shape = None
    InferShapesPass()(model)
    shape = model.graph.outputs[0].shape
    assert shape is not None and ",".join(map(str, shape)) == f"batch,seq,{width}"
    assert model.graph.outputs[0].dtype == ir.DataType.FLOAT
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    ids = np.array([[0, 3, 9], [1, 2, 4]], dtype=np.int64)
    assert session.run(None, {"ids": ids})[0].shape == (2, 3, width)


@pytest.mark.parametrize("presents_read", [False, True])
def test_shape_inference_sees_through_attention_whose_presents_are_graph_outputs(
    presents_read: bool,
) -> None:
    # onnxruntime-genai's layers: packed Q/K/V from an int4 projection (itself a stand-in), the
    # KV cache's presents graph outputs that no node reads
    reader = "r = Relu(pk)" if presents_read else ""
    model = parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[batch, seq, 8] x, uint8[16, 1, 8] q4, float[16, 1] sc, int32[batch] lens,
           int32 total) => (b, float[batch, 1, seq, 4] pk, float[batch, 1, seq, 4] pv) {{
            h = Neg(x)
            p = com.microsoft.MatMulNBits <K = 8, N = 16, bits = 4, block_size = 16> (h, q4, sc)
            a, pk, pv = com.microsoft.GroupQueryAttention <num_heads = 2, kv_num_heads = 1> (p, , , , , lens, total)
            b = Relu(a)
            {reader}
        }}
        """
    )
    model.graph.outputs[0].shape = None
    InferShapesPass()(model)
    shape = model.graph.outputs[0].shape
    if presents_read:  # (the presents' producer must stay: no claim)
        assert shape is None
    else:
        assert shape is not None and ",".join(map(str, shape)) == "batch,seq,8"


EXPRESSIONS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 4] x, int64[3] t) => (float[batch, seq, 4] y, float[batch, seq, 4] z) {
    r = Relu(x)
    s = Shape(x)
    y = Reshape(r, s)
    w = Reshape(x, t)
    z = Abs(w)
}
"""


def _annotated(r_dim: str, w_dim: str) -> ir.Model:
    """As a dynamo export records them: r's sequence under torch's expression for it (GPT-Neo
    under transformers 4.46 names a layer's sequence ``Min(128, seq)``, the slice of its
    causal-mask buffer), w's middle dim under another."""
    model = parse_model(EXPRESSIONS)
    r = next(n for n in model.graph if n.op_type == "Relu").outputs[0]
    r.shape = ir.Shape(["batch", r_dim, 4])
    w = next(n for n in model.graph if n.outputs[0].name == "w").outputs[0]
    w.shape = ir.Shape(["batch", w_dim, 4])
    return model


def test_an_exporters_expression_for_a_dim_inference_proves_is_renamed() -> None:
    model = _annotated("Min(128, seq)", "Min(128, seq)")
    result = InferShapesPass()(model)
    assert result.stats["placeholder dims resolved"] == 2  # w too: the exporter named it alike
    shapes = {n.outputs[0].name: [str(d) for d in n.outputs[0].shape] for n in model.graph}
    assert shapes["r"] == shapes["w"] == ["batch", "seq", "4"]
    assert not InferShapesPass()(model).modified
    # In the pipeline, the Reshape of r to x's shape is then a no-op in the first run (before,
    # only a second run, inferring without the annotation, saw it: no fixed point).
    from onnxopt import api

    optimized = api.optimize(_annotated("Min(128, seq)", "unused"))
    assert op_types(optimized.model).count("Reshape") == 1  # w's
    assert_numerically_equal(_annotated("Min(128, seq)", "unused"), optimized.model)
    again = api.optimize(optimized.model, check=False)
    assert op_types(again.model) == op_types(optimized.model)


PADDED_MASK = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 1, S, S] c, float[B, S] keep, float[B, 1, S, S] other, bool[B, 1, S, S] flag)
    => (float[B, 1, S, S] y) {
    n = Shape<start=1, end=2>(keep)
    zero = Constant<value = int64[1] {0}>()
    three = Constant<value = int64[1] {3}>()
    head = Slice(c, zero, n, three)
    both = Mul(head, other)
    picked = Where(flag, both, head)
    y = Relu(picked)
}
"""


def test_shape_inference_keeps_dims_a_slice_to_their_own_length_and_a_broadcast_keep() -> None:
    """TorchScript's ``mask[..., :keep.size(-1)]`` of a mask that long (transformers 4.x's
    padding step) is all of it; S against S (Mul), and against S and S (Where), is S."""
    model = parse_model(PADDED_MASK)
    InferShapesPass()(model)
    shapes = {n.outputs[0].name: [str(d) for d in n.outputs[0].shape] for n in model.graph}
    assert shapes["head"] == shapes["both"] == shapes["picked"] == ["B", "1", "S", "S"]


def test_an_expression_is_renamed_where_a_broadcast_proves_it() -> None:
    """A dynamo export's ``Min(256, S)`` (a buffer's [:S] slice) broadcast against S is S there
    (else the op fails), and so is every dim under that expression."""
    model = parse_model(PADDED_MASK)
    head = next(n for n in model.graph if n.outputs[0].name == "head").outputs[0]
    head.shape = ir.Shape(["B", 1, "S", "Min(256, S)"])
    InferShapesPass()(model)
    shapes = {n.outputs[0].name: [str(d) for d in n.outputs[0].shape] for n in model.graph}
    assert shapes["head"] == shapes["both"] == ["B", "1", "S", "S"]


def test_an_expression_without_a_proof_or_on_the_interface_stays() -> None:
    model = _annotated("Min(128, seq)", "batch*seq")  # w: nothing proves its dim
    InferShapesPass()(model)
    w = next(n for n in model.graph if n.outputs[0].name == "w").outputs[0]
    assert [str(d) for d in w.shape] == ["batch", "batch*seq", "4"]
    # A name the inputs or outputs declare is the user's, whatever inference finds inside.
    outside = _annotated("Min(128, seq)", "unused")
    outside.graph.outputs[1].shape = ir.Shape(["batch", "Min(128, seq)", 4])
    InferShapesPass()(outside)
    r = next(n for n in outside.graph if n.op_type == "Relu").outputs[0]
    assert [str(d) for d in r.shape] == ["batch", "Min(128, seq)", "4"]
    assert [str(d) for d in outside.graph.outputs[1].shape] == ["batch", "Min(128, seq)", "4"]


OPSET_11_CAUSAL_MASK = """
<ir_version: 7, opset_import: ["" : 11]>
g (int64[B, S] ids) => (float[B, 1, S, S] mask) {
    s = Shape(ids)
    one = Constant<value = int64 {1}>()
    n = Gather<axis = 0>(s, one)
    n1 = Unsqueeze<axes = [0]>(n)
    full_shape = Concat<axis = 0>(n1, n1)
    full = ConstantOfShape<value = float[1] {-3.0e38}>(full_shape)
    fs = Shape(full)
    last = Constant<value = int64[1] {-1}>()
    big = Constant<value = int64[1] {9223372036854775807}>()
    t1 = Slice(fs, last, big)
    t = Squeeze<axes = [0]>(t1)
    zero = Constant<value = int64 {0}>()
    step = Constant<value = int64 {1}>()
    cols = Range(zero, t, step)
    rows = Unsqueeze<axes = [1]>(cols)
    after = Less(rows, cols)
    zf = Constant<value = float {0.0}>()
    causal = Where(after, full, zf)
    b = Gather<axis = 0>(s, zero)
    b1 = Unsqueeze<axes = [0]>(b)
    o1 = Constant<value = int64[1] {1}>()
    target = Concat<axis = 0>(b1, o1, n1, n1)
    c4 = Unsqueeze<axes = [0, 1]>(causal)
    mask = Expand(c4, target)
}
"""


def test_a_causal_mask_built_at_opset_11_keeps_its_dims_named() -> None:
    """CLIP's text model exported at opset 11 (transformers 4.x): ``full((S, S), min)`` and the
    Range over its last dim. ONNX's data propagation knows Gather and Unsqueeze only from opset
    13, so every dim was unknown and the attention after it did not fuse."""
    model = parse_model(OPSET_11_CAUSAL_MASK)
    InferShapesPass()(model)
    shapes = {n.outputs[0].name: [str(d) for d in n.outputs[0].shape] for n in model.graph}
    assert shapes["full"] == ["S", "S"]
    assert shapes["cols"] == ["S"]
    assert shapes["causal"] == ["S", "S"]
    assert shapes["mask"] == ["B", "1", "S", "S"]


COMPUTED_TARGET_PIECE = """
<ir_version: 7, opset_import: ["" : 11]>
g (float[B, S, 64] x) => (float[N, 4, S, 16] y) {
    s = Shape(x)
    zero = Constant<value = int64 {0}>()
    one = Constant<value = int64 {1}>()
    b = Gather<axis = 0>(s, zero)
    four = Constant<value = int64 {4}>()
    bh = Mul(b, four)
    back = Div(bh, four)
    b1 = Unsqueeze<axes = [0]>(back)
    n = Gather<axis = 0>(s, one)
    n1 = Unsqueeze<axes = [0]>(n)
    h = Constant<value = int64[1] {4}>()
    d = Constant<value = int64[1] {16}>()
    target = Concat<axis = 0>(b1, h, n1, d)
    r = Reshape(x, target)
    y = Abs(r)
}
"""


def test_a_reshape_target_with_a_computed_piece_keeps_its_rank_and_read_dims() -> None:
    """BLOOM's TorchScript export at opset 11 views P@V with B computed as B*H / H: the target
    is not all reads, but its length is static, so the view is rank 4 with S, 4 and 16 known
    (it had no shape at all, and the attention did not fuse)."""
    model = parse_model(COMPUTED_TARGET_PIECE)
    InferShapesPass()(model)
    r = next(n for n in model.graph if n.op_type == "Reshape").outputs[0]
    assert r.shape is not None
    assert [str(d) for d in r.shape][1:] == ["4", "S", "16"]
    assert not isinstance(r.shape[0], int) and str(r.shape[0]) != "B"


def test_outputs_keep_the_dims_they_declare_anonymous_where_inference_only_names_them() -> None:
    """ONNX's shape inference calls an unnamed input dim "unk__0" and carries the name to the
    outputs; written there, it would change the model's interface for a placeholder. A dim
    inference proves (a size, a name an input declares) is a fact and is written."""
    from onnxopt import api

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[?, 4] x, float[batch, 3] z) => (float[?, 4] y, int64[?] arg, float[?, ?] w)
        {
            y = Relu(x)
            arg = ArgMax<axis = 1, keepdims = 0>(y)
            w = Sigmoid(z)
        }
        """
    )
    optimized = api.optimize(model, check=False).model

    shapes = {str(v.name): [str(d) for d in v.shape or []] for v in optimized.graph.outputs}
    assert shapes == {"y": ["None", "4"], "arg": ["None"], "w": ["batch", "3"]}


def test_an_output_keeps_the_names_of_its_own_it_declares_and_the_model_proves_with_its_inputs() -> (
    None
):
    """TorchScript names an output's dynamic axes itself ("Reluenc_dim_0"). Such a name says
    nothing about other tensors, so it is set aside while the passes run: a Range over the
    output's batch is then proved to count the ids' batch (here the mask gathered at
    ``b * S + t``, an encoder-decoder's cross-attention mask, becomes an Unsqueeze), and the
    file's names are written back."""
    from onnxopt import api

    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[B, S] ids, bool[B, S] keep) => (float[Reluenc_dim_0, Reluenc_dim_1, 4] enc,
                                                 bool[B, 1, 1, S, 1] y) <
            float[10, 4] table = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
            int64 zero = {0}, int64 one = {1}, int64[3] lead = {1, 2, 3},
            int64[3] trail = {0, 1, 2}, int64[1] first = {0}
        > {
            e = Gather(table, ids)
            enc = Relu(e)
            se = Shape(enc)
            nb = Gather(se, zero)
            s = Shape(ids)
            nt = Gather(s, one)
            stride = Unsqueeze(nt, first)
            rb = Range(zero, nb, one)
            rt = Range(zero, nt, one)
            b4 = Unsqueeze(rb, lead)
            t4 = Unsqueeze(rt, trail)
            scaled = Mul(b4, stride)
            idx = Add(t4, scaled)
            flat = Flatten <axis = 2> (keep)
            y = Gather(flat, idx)
        }
        """
    )
    result = api.optimize(model)

    assert result.report.validation is not None and result.report.validation.passed
    assert "Range" not in [node.op_type for node in result.model.graph]
    shapes = {str(v.name): [str(d) for d in v.shape or []] for v in result.model.graph.outputs}
    assert shapes["enc"] == ["Reluenc_dim_0", "Reluenc_dim_1", "4"]
