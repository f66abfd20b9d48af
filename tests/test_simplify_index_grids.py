"""SimplifyIndexGridsPass: GatherND over an in-order Range grid (transformers' exported masks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnx_ir as ir
import pytest

import onnxopt
import onnxopt.io
from onnxopt.io import model_from_proto
from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.merge_consecutive_ops import MergeConsecutiveOpsPass
from onnxopt.passes.options import PassOptions
from onnxopt.passes.simplify_index_grids import SimplifyIndexGridsPass, _linear_axes
from onnxopt.rewrite import Mismatch
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types

RULE = "GatherND(index grid)->Unsqueeze"


def _mask_model(
    *,
    batch_read: str = "b1 = Shape <start = 0, end = 1> (ids)",
    start: str = "zero",
    order: str = "bi, ti",
    shape: str = "mx = Max(b4, t4)\n            grid_shape = Shape(mx)",
    b_axes: str = "lead",
    t_axes: str = "trail",
    out: str = "float[B, 1, 1, T] y",
) -> str:
    """The grid torch.export writes for ``mask[batch_idx, kv_idx]`` ([B, T] -> [B, 1, 1, T]), as in
    BERT's dynamo export: lengths read off ``input_ids``, which shares the mask's symbols."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[B, T] ids, int64[B, T] mask) => ({out}) <
            int64 zero = {{0}}, int64 one = {{1}}, int64[3] lead = {{1, 2, 3}},
            int64[3] trail = {{0, 1, 2}}, int64[1] last = {{-1}}
        > {{
            {batch_read}
            nb = Squeeze(b1)
            t1 = Shape <start = 1, end = 2> (ids)
            nt = Squeeze(t1)
            keep = Cast <to = 9> (mask)
            rb = Range({start}, nb, one)
            rt = Range(zero, nt, one)
            b4 = Unsqueeze(rb, {b_axes})
            t4 = Unsqueeze(rt, {t_axes})
            {shape}
            be = Expand(b4, grid_shape)
            te = Expand(t4, grid_shape)
            bi = Unsqueeze(be, last)
            ti = Unsqueeze(te, last)
            grid = Concat <axis = -1> ({order})
            picked = GatherND(keep, grid)
            y = Cast <to = 1> (picked)
        }}
    """


def test_an_in_order_grid_gather_becomes_an_unsqueeze_and_the_grid_dies() -> None:
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass,
        _mask_model(),
        {RULE: 1},
        # the grid is left for dead-code elimination; the new Unsqueeze reads the mask itself
        [
            *["Shape", "Squeeze", "Shape", "Squeeze", "Cast", "Range", "Range", "Unsqueeze"],
            *["Unsqueeze", "Max", "Shape", "Expand", "Expand", "Unsqueeze", "Unsqueeze"],
            *["Concat", "Unsqueeze", "Cast"],
        ],
        trials=2,
    )
    EliminateDeadCodePass()(rewritten)
    assert op_types(rewritten) == ["Cast", "Unsqueeze", "Cast"]


def test_a_static_grid_with_a_constant_shape() -> None:
    text = _mask_model(shape="grid_shape = Constant <value = int64[4] {2, 1, 1, 5}> ()")
    text = text.replace("[B, T]", "[2, 5]").replace("[B, 1, 1, T]", "[2, 1, 1, 5]")
    ops = [t for t in op_types(load(text)) if t != "GatherND"]
    assert_rewrites(SimplifyIndexGridsPass, text, {RULE: 1}, [*ops[:-1], "Unsqueeze", "Cast"])


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ({"start": "one"}, "Range does not count 0, 1, 2"),
        (
            {"b_axes": "trail", "t_axes": "lead", "out": "float[T, 1, 1, B] y"},
            "not in the data's order",
        ),
        ({"batch_read": "b1 = Shape <start = 1, end = 2> (mask)"}, "not provably dim 0"),
        (
            {"shape": "mask4 = Unsqueeze(mask, lead)\n            grid_shape = Shape(mask4)"},
            "read off tensors other than its indices",
        ),
        (
            {"shape": "grid_shape = Constant <value = int64[4] {1, 2, 1, 1}> ()"},
            "not 1 off the index axes",
        ),
    ],
)
def test_refuses_grids_it_cannot_prove(variant: dict[str, str], reason: str) -> None:
    assert_refuses(SimplifyIndexGridsPass, _mask_model(**variant), reason)


def _token_types(add: str = "y = Add(w, t)", fill: str = "1, 1, 1, 1, 1, 1, 1, 1") -> str:
    """BERT's TorchScript embeddings: token_type_ids defaults to a buffer of one value, sliced to
    the sequence and expanded to [B, S], then gathered from the token-type table."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[B, S] ids) => (float[B, S, 4] y) <
            int64[1, 8] buffer = {{{fill}}}, int64[1] zero1 = {{0}}, int64[1] one1 = {{1}},
            float[10, 4] words = {{{", ".join(str(i / 8) for i in range(40))}}},
            float[3, 4] types = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}, float[4] bias = {{1, 1, 1, 1}},
            float[B, S] ex_f, float[B, S, 4] w, float[B, S, 4] t> {{
            shp = Shape(ids)
            s = Shape <start = 1, end = 2> (ids)
            sl = Slice(buffer, zero1, s, one1)
            ex = Expand(sl, shp)
            w = Gather(words, ids)
            t = Gather(types, ex)
            {add}
        }}
    """


def test_a_gather_at_one_index_becomes_the_row_its_partner_broadcasts() -> None:
    # Every index is 1: the gathered [B, S, 4] is row 1 of the table wherever it is read, and w
    # already has its shape, so w + row 1 is the same sum.
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass,
        _token_types(),
        {"Gather(table, one index)->row": 1},
        ["Shape", "Shape", "Slice", "Expand", "Gather", "Add"],
        trials=2,
    )
    add = next(n for n in rewritten.graph if n.op_type == "Add")
    assert add.inputs[1].const_value.numpy().tolist() == [5, 6, 7, 8]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("add", "fill", "reason"),
    [
        # the [4] bias does not have the gathered [B, S, 4] shape: the sum would shrink
        ("y = Add(t, bias)", "1, 1, 1, 1, 1, 1, 1, 1", "other operand has the gathered rows"),
        ("y = Relu(t)", "1, 1, 1, 1, 1, 1, 1, 1", "read by Relu"),
        ("y = Add(w, t)", "9, 9, 9, 9, 9, 9, 9, 9", "out of the table's 3 rows"),
    ],
)
def test_a_gather_at_one_index_needs_a_partner_of_its_shape(
    add: str, fill: str, reason: str
) -> None:
    assert_refuses(SimplifyIndexGridsPass, _token_types(add, fill), reason)


# A chain of ScatterNDs that overwrites every element -> Concat ----------------------------------

SCATTERS = "ScatterND blocks->Concat"
ROW_INPUTS = "float[4,2,3] x, float[1,2,3] u, float[3,2,3] v"


def _scatter_model(body: str, inputs: str = ROW_INPUTS, outputs: str = "float[4,2,3] y") -> str:
    return f'<ir_version: 8, opset_import: ["" : 16]>\ng ({inputs}) => ({outputs}) {body}'


@pytest.mark.parametrize(
    "body",
    [
        "<int64[3,1] i = {1, 2, 3}, int64[1,1] j = {0}>"
        " { s = ScatterND(x, i, v)\n t = ScatterND(s, j, u)\n y = Relu(t) }",
        # negative rows, and the order of writing is not the order of the rows
        "<int64[3,1] i = {-3, -2, -1}, int64[1,1] j = {-4}>"
        " { s = ScatterND(x, j, u)\n t = ScatterND(s, i, v)\n y = Relu(t) }",
    ],
    ids=["rows", "negative-rows"],
)
def test_scatters_over_every_row_become_a_concat(body: str) -> None:
    # x, the tensor written to, is never read: its values (random on ORT) do not reach y.
    optimized = assert_rewrites(
        SimplifyIndexGridsPass, _scatter_model(body), {SCATTERS: 1}, ["Concat", "Relu"]
    )
    concat = next(node for node in optimized.graph if node.op_type == "Concat")
    assert [value.name for value in concat.inputs] == ["u", "v"]
    assert concat.attributes.get_int("axis") == 0


def _column_grid(update: str, name: str, shape: str = "") -> str:
    """TorchScript's index grid for ``x[..., columns] = update`` on [B, 2, 3, 6]: the batch a
    Range reshaped to [-1, 1, 1, 1], the heads a folded constant, the rows a Range to 3; expanded
    to the update's shape, or to ``shape`` (the broadcast of the indices themselves)."""
    target = shape or f"{name}_shape"
    return f"""
            {"" if shape else f"{target} = Shape({update})"}
            {name}_b = Expand(batch4, {target})
            {name}_h = Expand(heads, {target})
            {name}_r = Expand(rows2, {target})
            {name}_c = Expand({name}_cols, {target})
            {name}_0 = Unsqueeze({name}_b, last)
            {name}_1 = Unsqueeze({name}_h, last)
            {name}_2 = Unsqueeze({name}_r, last)
            {name}_3 = Unsqueeze({name}_c, last)
            {name} = Concat <axis = -1> ({name}_0, {name}_1, {name}_2, {name}_3)"""


def _column_model(
    first: str = "0, 1, 2, 3",
    second: str = "4, 5",
    batch: str = "u",
    rows: str = "three",
    heads: str = "int64[2, 1, 1] heads = {0, 1}",
) -> str:
    return f"""
        <ir_version: 8, opset_import: ["" : 16]>
        g (float[B, 2, 3, 6] x, float[B, 2, 3, 4] u, float[B, 2, 3, 2] v, float[C] w)
            => (float[B, 2, 3, 6] y) <
            int64 zero = {{0}}, int64 one = {{1}}, int64 three = {{3}}, int64 two = {{2}},
            int64[1] last = {{-1}}, int64[4] to_batch = {{-1, 1, 1, 1}}, int64[2] to_rows = {{-1, 1}},
            {heads}, int64[4] a_cols = {{{first}}}, int64[2] b_cols = {{{second}}}
        > {{
            b1 = Shape <start = 0, end = 1> ({batch})
            nb = Squeeze(b1)
            batch1 = Range(zero, nb, one)
            batch4 = Reshape(batch1, to_batch)
            rows1 = Range(zero, {rows}, one)
            rows2 = Reshape(rows1, to_rows)
            {_column_grid("u", "a")}
            {_column_grid("v", "b")}
            s = ScatterND(x, a, u)
            t = ScatterND(s, b, v)
            y = Relu(t)
        }}
    """


def test_torchscript_column_scatters_become_a_concat_on_the_last_axis() -> None:
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass,
        _column_model(),
        {SCATTERS: 1},
        [
            *[op for op in op_types(load(_column_model())) if op != "ScatterND"][:-1],
            "Concat",
            "Relu",
        ],
        trials=2,
    )
    EliminateDeadCodePass()(rewritten)
    assert op_types(rewritten) == ["Concat", "Relu"]
    (concat, _) = list(rewritten.graph)
    assert [value.name for value in concat.inputs] == ["u", "v"]
    assert concat.attributes.get_int("axis") == 3


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ({"second": "3, 4"}, "write the same elements"),
        ({"first": "0, 1, 3, 2"}, "not a run of consecutive columns"),
        ({"rows": "two"}, "does not count the data's dim 2"),
        ({"batch": "w"}, "not provably dim 0 of the data"),
        # the heads counted along the rows' axis: a transposed write, not a block
        ({"heads": "int64[2, 1] heads = {0, 1}"}, "does not count the update's dim 1 in order"),
    ],
    ids=["overlap", "unordered", "short-rows", "batch-of-another-input", "heads-on-rows"],
)
def test_column_scatters_it_cannot_prove_stay(variant: dict[str, str], reason: str) -> None:
    assert_refuses(SimplifyIndexGridsPass, _column_model(**variant), reason)


_TWO_SCATTERS = """
    <ir_version: 8, opset_import: ["" : 16]>
    g (float[{rows}, 3] x, float[2, 2] u, float[2, 1] v) => (float[{rows}, 3] y) <
        int64 zero = {{0}}, int64 one = {{1}}, int64[2] to_rows = {{-1, 1}},
        int64[{u_count}] u_cols = {{{u_cols}}}, int64[1] v_cols = {{2}}, int64[1] last = {{-1}}
    > {{
        n = Shape <start = 0, end = 1> (x)
        n0 = Squeeze(n)
        counted = Range(zero, n0, one)
        rows = Reshape(counted, to_rows)
        us = Shape(u)
        ur = Expand(rows, us)
        uc = Expand(u_cols, us)
        ur1 = Unsqueeze(ur, last)
        uc1 = Unsqueeze(uc, last)
        ui = Concat <axis = -1> (ur1, uc1)
        vs = Shape(v)
        vr = Expand(rows, vs)
        vc = Expand(v_cols, vs)
        vr1 = Unsqueeze(vr, last)
        vc1 = Unsqueeze(vc, last)
        vi = Concat <axis = -1> (vr1, vc1)
        s = ScatterND(x, ui, u)
        y = ScatterND(s, vi, v)
    }}
"""


@pytest.mark.parametrize(
    ("rows", "u_count", "u_cols", "reason"),
    [
        # u's one column index, expanded to its two columns, writes column 0 twice: the
        # scatters write x's three columns, but u and v hold three columns between them
        (2, 1, "0", "not a run of consecutive columns"),
        # x's one row index, expanded to u's two rows, writes row 0 twice
        (1, 2, "0, 1", "does not count the update's dim 0 in order"),
    ],
    ids=["column-written-twice", "row-written-twice"],
)
def test_an_index_broadcast_over_several_elements_stays(
    rows: int, u_count: int, u_cols: str, reason: str
) -> None:
    text = _TWO_SCATTERS.format(rows=rows, u_count=u_count, u_cols=u_cols)
    assert_refuses(SimplifyIndexGridsPass, text, reason)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "<int64[3,1] i = {1, 2, 3}> { t = ScatterND(x, i, v)\n y = Relu(t) }",
            "do not cover the whole tensor",
        ),
        (
            "<int64[3,1] i = {1, 2, 3}, int64[3,1] j = {0, 1, 2}>"
            " { s = ScatterND(x, j, v)\n t = ScatterND(s, i, v)\n y = Relu(t) }",
            "write the same elements",
        ),
        (
            "<int64[3,1] i = {1, 3, 2}, int64[1,1] j = {0}>"
            " { s = ScatterND(x, i, v)\n t = ScatterND(s, j, u)\n y = Relu(t) }",
            "not a constant run of consecutive whole rows",
        ),
        (
            "<int64[3,1] i = {1, 2, 3}, int64[1,1] j = {0}>"
            ' { s = ScatterND <reduction = "add"> (x, i, v)\n t = ScatterND(s, j, u)\n y = Relu(t) }',
            "combines (reduction)",
        ),
        (
            "<int64[3,1] i = {1, 2, 3}, int64[1,1] j = {0}>"
            " { s = ScatterND(x, i, v)\n t = ScatterND(s, j, u)\n y = Add(t, s) }",
            "partly written tensor of the chain is read other than for its shape",
        ),
    ],
    ids=["partial", "overlap", "unordered", "reduction", "shared-partial"],
)
def test_row_scatters_that_keep_some_of_their_data_stay(body: str, reason: str) -> None:
    assert_refuses(SimplifyIndexGridsPass, _scatter_model(body), reason)


def test_row_scatters_of_an_unknown_row_count_stay() -> None:
    body = (
        "<int64[3,1] i = {1, 2, 3}, int64[1,1] j = {0}>"
        " { s = ScatterND(x, i, v)\n t = ScatterND(s, j, u)\n y = Relu(t) }"
    )
    text = _scatter_model(body, "float[N,2,3] x, float[1,2,3] u, float[3,2,3] v", "float[N,2,3] y")
    assert_refuses(SimplifyIndexGridsPass, text, "rows")


def test_deepseek_key_scattered_into_a_fresh_tensor_becomes_a_concat() -> None:
    """DeepSeek-V3's key as torch.export writes ``k = new_empty(...); k[..., :4] = k_nope;
    k[..., 4:] = k_rot``: the last axis moved first, rows scattered, moved back. The scatters
    become a Concat (this pass), whose Transposes then cancel (merge-consecutive-ops)."""
    body = (
        "<int64[4] shape = {2, 3, 5, 6}, int64[4,1] i = {0, 1, 2, 3}, int64[2,1] j = {4, 5}>"
        " { e = ConstantOfShape(shape)\n te = Transpose <perm = [3, 1, 2, 0]> (e)\n"
        " ta = Transpose <perm = [3, 1, 2, 0]> (a)\n s = ScatterND(te, i, ta)\n"
        " tb = Transpose <perm = [3, 1, 2, 0]> (b)\n t = ScatterND(s, j, tb)\n"
        " y = Transpose <perm = [3, 1, 2, 0]> (t) }"
    )
    text = _scatter_model(body, "float[2,3,5,4] a, float[2,3,5,2] b", "float[2,3,5,6] y")
    original = load(text)
    optimized = SimplifyIndexGridsPass()(original.clone()).model
    merged = MergeConsecutiveOpsPass()(optimized)
    assert dict(merged.stats) == {
        "Concat(Transposes)->Transpose(Concat)": 1,
        "Transpose∘Transpose": 1,
    }
    EliminateDeadCodePass()(optimized)
    assert op_types(optimized) == ["Concat"]
    assert validate(original, optimized).passed


def test_shape_reads_of_a_partly_written_tensor_move_to_the_first_data() -> None:
    """TorchScript reads the shape of the slice a ``copy_`` writes to: such reads see the shape
    only, which the tensor written to has too."""
    body = (
        "<int64[3,1] i = {1, 2, 3}, int64[1,1] j = {0}, int64[1] a = {0}, int64[1] b = {2}>"
        " { s = ScatterND(x, i, v)\n part = Slice(s, a, b)\n n = Shape(part)\n"
        " whole = Shape(s)\n t = ScatterND(s, j, u)\n y = Relu(t) }"
    )
    text = _scatter_model(body, outputs="float[4,2,3] y, int64[3] n, int64[3] whole")
    optimized = assert_rewrites(
        SimplifyIndexGridsPass, text, {SCATTERS: 1}, ["Slice", "Shape", "Shape", "Concat", "Relu"]
    )
    assert [node.inputs[0].name for node in optimized.graph][:3] == ["x", "part", "x"]


def test_a_column_index_counted_from_a_huge_range_is_not_computed() -> None:
    """The unfolded column index is computed only when it is small: Range(0, 2**40, 1) sliced
    to two columns is refused before numpy would make its 8 TiB."""
    text = _TWO_SCATTERS.format(rows=2, u_count=2, u_cols="0, 1").replace(
        "int64[2] u_cols = {0, 1},",
        "int64 huge = {1099511627776}, int64[1] zero1 = {0}, int64[1] two1 = {2},",
    )
    text = text.replace(
        "uc = Expand(u_cols, us)",
        "all = Range(zero, huge, one)\n        u_cols = Slice(all, zero1, two1)\n        uc = Expand(u_cols, us)",
    )
    assert_refuses(SimplifyIndexGridsPass, text, "not a constant row of columns")


def _padding_write_model(heads: int = 1, length_of: str = "keep") -> str:
    """TorchScript's ``c[:, :, :, :L] = c[..., :L].masked_fill(...)`` on a [B, h, S, T] mask
    (transformers 4.38-4.47, LLaMA-style decoders): every column, L read off the padding mask
    (``length_of``), the head index folded to a constant 0 and the columns ``Range(0, T)[:L]``."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, {heads}, S, S] c, float[B, S] keep, float[B, R] other)
            => (float[B, {heads}, S, S] y) <
            int64 zero = {{0}}, int64 one = {{1}}, int64 two = {{2}}, int64 three = {{3}},
            int64[1] zero1 = {{0}}, int64[1] axis3 = {{3}}, int64[1] last = {{-1}},
            int64[4] to_batch = {{-1, 1, 1, 1}}, int64[2] to_rows = {{-1, 1}},
            int64[1, 1, 1] heads = {{0}}, int64[2] ax12 = {{1, 2}}, float nothing = {{0.0}},
            float lowest = {{-3.4028234663852886e38}}
        > {{
            cs = Shape(c)
            nb = Gather(cs, zero)
            ns = Gather(cs, two)
            nt = Gather(cs, three)
            nl = Shape <start = 1, end = 2> ({length_of})
            head = Slice(c, zero1, nl, axis3)
            keep4 = Unsqueeze(keep, ax12)
            summed = Add(head, keep4)
            padded = Equal(summed, nothing)
            filled = Where(padded, lowest, head)
            rb = Range(zero, nb, one)
            batch4 = Reshape(rb, to_batch)
            rs = Range(zero, ns, one)
            rows2 = Reshape(rs, to_rows)
            rt = Range(zero, nt, one)
            grid_cols = Slice(rt, zero1, nl)
            bs = Add(batch4, rows2)
            bst = Add(bs, grid_cols)
            grid_shape = Shape(bst){_column_grid("filled", "grid", shape="grid_shape")}
            update = Reshape(filled, grid_shape)
            written = ScatterND(c, grid, update)
            y = Relu(written)
        }}
    """


def test_a_torchscript_write_of_every_column_is_its_update() -> None:
    text = _padding_write_model()
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass,
        text,
        {SCATTERS: 1},
        [op for op in op_types(load(text)) if op != "ScatterND"],
        trials=2,
    )
    EliminateDeadCodePass()(rewritten)
    assert "Concat" not in op_types(rewritten)  # no grid, no one-input Concat
    relu = next(node for node in rewritten.graph if node.op_type == "Relu")
    assert relu.inputs[0] is not None and relu.inputs[0].name == "update"


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        # L read off another input: the columns may stop short of T
        ({"length_of": "other"}, "the grid's last index is not a constant row of columns"),
        # a constant head index 0 writes only head 0 of two
        ({"heads": 2}, "index 1 is a constant that does not count the data's dim 1"),
    ],
    ids=["columns-of-another-length", "one-head-of-two"],
)
def test_a_write_it_cannot_prove_covers_everything_stays(
    variant: dict[str, object], reason: str
) -> None:
    assert_refuses(SimplifyIndexGridsPass, _padding_write_model(**variant), reason)  # type: ignore[arg-type]


# A Gather of a flattened tensor at its own row-major positions -> Reshape ---------------------

LINEAR = "Gather(flat, row-major index)->Reshape"


def _strided_view(
    *,
    cols: str = "0, 1, 2, 3, 4, 5, 6, 7",
    stride: str = "8",
    count: str = "s = Shape <start = 0, end = 1> (x)",
    scale: str = "m = Mul(r, stride)\n            u = Unsqueeze(m, lead)",
    inputs: str = "float[B, 8, 1, 1] x",
) -> str:
    """torch.export's as_strided over a [B, 8, 1, 1] tensor in its own layout (a pooled
    channels-last feature map flattened: DINOv3-ConvNeXt): the flat tensor gathered at
    ``Range(0, B) * 8`` (batch, unsqueezed to [B, 1, 1, 1]) plus the folded column offsets."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => (float[B, 8, 1, 1] y) <
            int64[1] flat = {{-1}}, int64 zero = {{0}}, int64 one = {{1}}, int64 stride = {{{stride}}},
            int64[3] lead = {{1, 2, 3}}, int64[1, 8, 1, 1] cols = {{{cols}}}
        > {{
            f = Reshape(x, flat)
            {count}
            n = Squeeze(s)
            r = Range(zero, n, one)
            {scale}
            idx = Add(u, cols)
            y = Gather(f, idx)
        }}
    """


def test_a_strided_view_in_the_tensors_own_order_becomes_a_reshape() -> None:
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass,
        _strided_view(),
        {LINEAR: 1},
        ["Reshape", "Shape", "Squeeze", "Range", "Mul", "Unsqueeze", "Add", "Reshape"],
        trials=2,
    )
    EliminateDeadCodePass()(rewritten)
    assert op_types(rewritten) == ["Reshape", "Reshape"]  # the pipeline merges the two
    target = rewritten.graph.node(1).inputs[1].const_value.numpy()  # type: ignore[union-attr]
    assert target.tolist() == [-1, 8, 1, 1]  # the batch stays dynamic


@pytest.mark.parametrize(
    "variant",
    [
        # the stride applied after the Unsqueeze; TorchScript's Reshape to ones instead of it
        {"scale": "u1 = Unsqueeze(r, lead)\n            u = Mul(stride, u1)"},
        {
            "scale": "m = Mul(r, stride)\n            u = Reshape(m, ones)",
            "cols": "0, 1, 2, 3, 4, 5, 6, 7>, int64[4] ones = <-1, 1, 1, 1",
        },
    ],
)
def test_other_spellings_of_the_strided_count(variant: dict[str, str]) -> None:
    text = _strided_view(**variant).replace(">, int64[4] ones = <", "}, int64[4] ones = {")
    result = SimplifyIndexGridsPass()(load(text))
    assert dict(result.stats) == {LINEAR: 1}
    assert validate(load(text), result.model).passed


def test_a_constant_strided_view_becomes_a_reshape() -> None:
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3, 4] x) => (float[6, 1, 4] y) <
            int64[1] flat = {-1},
            int64[6, 1, 4] idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                  18, 19, 20, 21, 22, 23}
        > {
            f = Reshape(x, flat)
            y = Gather(f, idx)
        }
    """
    assert_rewrites(SimplifyIndexGridsPass, text, {LINEAR: 1}, ["Reshape", "Reshape"])


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        # a storage offset: the view starts one element in (and would run past the end)
        ({"cols": "1, 2, 3, 4, 5, 6, 7, 8"}, "start at 1, not 0"),
        # rows overlapping (an unfold's windows), or columns in another order (a transpose)
        ({"stride": "4"}, "not visit the data in row-major order"),
        ({"cols": "0, 2, 4, 6, 1, 3, 5, 7"}, "not a strided grid"),
        # the count read off a tensor that does not share the batch
        (
            {
                "count": "s = Shape <start = 0, end = 1> (z)",
                "inputs": "float[B, 8, 1, 1] x, float[C] z",
            },
            "cannot prove the indices count every element",
        ),
    ],
)
def test_strided_views_it_cannot_prove_stay(variant: dict[str, str], reason: str) -> None:
    model = load(_strided_view(**variant))
    result = SimplifyIndexGridsPass(PassOptions(explain=True))(model)
    assert LINEAR not in result.stats
    if reason == "not a strided grid":  # not a candidate: no view, no note
        assert not any("row-major" in note for note in result.notes), result.notes
    else:
        assert any(reason in note for note in result.notes), result.notes


def test_a_transposing_view_stays() -> None:
    """x.as_strided((3, 2), (1, 3)) over a [2, 3] tensor is its transpose, not a reshape."""
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3] x) => (float[3, 2] y) <
            int64[1] flat = {-1}, int64[3, 2] idx = {0, 3, 1, 4, 2, 5}
        > {
            f = Reshape(x, flat)
            y = Gather(f, idx)
        }
    """
    assert_refuses(SimplifyIndexGridsPass, text, "not visit the data in row-major order")


def test_a_prefix_of_the_data_stays() -> None:
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3] x) => (float[2, 2] y) <int64[1] flat = {-1}, int64[2, 2] idx = {0, 1, 2, 3}> {
            f = Reshape(x, flat)
            y = Gather(f, idx)
        }
    """
    assert_refuses(SimplifyIndexGridsPass, text, "cannot prove the indices count every element")


@pytest.mark.torch
def test_a_pooled_channels_last_map_exported_by_dynamo_loses_its_gather(tmp_path: Path) -> None:
    """AdaptiveAvgPool2d(1) over a permuted (channels-last) map, flattened and transposed (DINOv3-
    ConvNeXt's pooled token): torch.export writes the view as an as_strided gather."""
    torch = pytest.importorskip("torch")

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.pool = torch.nn.AdaptiveAvgPool2d(1)

        def forward(self, y):  # type: ignore[no-untyped-def]
            x = self.proj(y).permute(0, 3, 1, 2)
            pooled = self.pool(x).flatten(2).transpose(1, 2)
            return torch.cat([pooled, x.flatten(2).transpose(1, 2)], 1)

    torch.manual_seed(0)
    path = tmp_path / "pooled.onnx"
    program = torch.onnx.export(
        Pooled().eval(),
        (torch.randn(2, 4, 4, 8),),
        dynamo=True,
        input_names=["y"],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    assert program is not None
    program.save(str(path))
    assert "Gather" in op_types(onnxopt.io.load_model(path).model)

    result = onnxopt.optimize(path)

    assert result.report.validation is not None and result.report.validation.passed
    ops = op_types(result.model)
    assert not {"Gather", "Range"} & set(ops), ops
    assert result.model.graph.inputs[0].shape[0] == ir.SymbolicDim("batch")


def test_constant_index_parts_that_broadcast_huge_are_not_summed() -> None:
    """Two small constants whose sum would have 2**24 elements (past the 2**22 read limit): the
    sum is refused before it is made, not computed."""
    rows = (np.arange(4096, dtype=np.int64) * 4096).reshape(4096, 1)
    cols = np.arange(4096, dtype=np.int64).reshape(1, 4096)
    graph = oh.make_graph(
        [
            oh.make_node("Reshape", ["x", "flat"], ["f"]),
            oh.make_node("Add", ["rows", "cols"], ["idx"]),
            oh.make_node("Gather", ["f", "idx"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4096, 4096])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4096, 4096])],
        [
            onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat"),
            onnx.numpy_helper.from_array(rows, "rows"),
            onnx.numpy_helper.from_array(cols, "cols"),
        ],
    )
    model = model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    InferShapesPass()(model)
    gather = next(node for node in model.graph if node.op_type == "Gather")
    found = _linear_axes(gather.inputs[1], 2)  # type: ignore[arg-type]
    assert isinstance(found, Mismatch) and "broadcast too large" in found.reason
    assert LINEAR not in SimplifyIndexGridsPass()(model).stats


def _torchscript_mask_gather(
    *,
    stride: str = "nt",
    b_axes: str = "lead",
    t_axes: str = "trail",
    flat: str = "flat = Flatten <axis = 2> (keep)",
    scale: str = "scaled = Mul(b4, stride)\n            idx = Add(t4, scaled)",
    inputs: str = "int64[B, T] ids, bool[B, T] keep",
    out: str = "bool[B, 1, 1, T, 1] y",
) -> str:
    """TorchScript's ``mask[batch_idx, kv_idx]`` (transformers' padding mask, [B, T] -> [B, 1, 1,
    T]): the mask flattened to rows and gathered at ``b * T + t``, T read off ``input_ids`` at run
    time (the batch too: two dynamic sizes and a dynamic stride)."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => ({out}) <
            int64 zero = {{0}}, int64 one = {{1}}, int64[3] lead = {{1, 2, 3}},
            int64[3] trail = {{0, 1, 2}}, int64[1] first = {{0}}, int64[1] flat_shape = {{-1}}
        > {{
            s = Shape(ids)
            nb = Gather(s, zero)
            nt = Gather(s, one)
            stride = Unsqueeze({stride}, first)
            rb = Range(zero, nb, one)
            rt = Range(zero, nt, one)
            b4 = Unsqueeze(rb, {b_axes})
            t4 = Unsqueeze(rt, {t_axes})
            {scale}
            {flat}
            y = Gather(flat, idx)
        }}
    """


@pytest.mark.parametrize(
    ("flat", "out", "axes"),
    [
        ("flat = Flatten <axis = 2> (keep)", "bool[B, 1, 1, T, 1] y", [1, 2, 4]),
        ("flat = Reshape(keep, flat_shape)", "bool[B, 1, 1, T] y", [1, 2]),
    ],
)
def test_a_torchscript_mask_gather_with_dynamic_strides_becomes_an_unsqueeze(
    flat: str, out: str, axes: list[int]
) -> None:
    rewritten = assert_rewrites(
        SimplifyIndexGridsPass, _torchscript_mask_gather(flat=flat, out=out), {LINEAR: 1},
        ["Shape", "Gather", "Gather", "Unsqueeze", "Range", "Range", "Unsqueeze", "Unsqueeze",
         "Mul", "Add", flat.split()[2].split("(")[0].split("<")[0], "Unsqueeze"],
        trials=2,
    )  # fmt: skip
    EliminateDeadCodePass()(rewritten)
    assert op_types(rewritten) == ["Unsqueeze"]
    unsqueeze = rewritten.graph.node(0)
    assert unsqueeze.inputs[0] is rewritten.graph.inputs[1]
    assert unsqueeze.inputs[1].const_value.numpy().tolist() == axes  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        # rows B long but stepped by B: the positions overlap and skip
        ({"stride": "nb"}, "not visit the data in row-major order"),
        # the batch counted along the last axis, stepped by one: the tokens' stride is not 1
        (
            {"b_axes": "trail", "t_axes": "lead", "out": "bool[T, 1, 1, B, 1] y"},
            "not visit the data in row-major order",
        ),
        # the tokens counted first, stepped by the batch: row-major over [T, B], a transpose
        (
            {
                "b_axes": "trail",
                "t_axes": "lead",
                "stride": "nb",
                "scale": "scaled = Mul(t4, stride)\n            idx = Add(b4, scaled)",
                "out": "bool[T, 1, 1, B, 1] y",
            },
            "cannot prove the indices count every element",
        ),
        # the lengths read off a tensor that shares no dim with the mask
        (
            {"inputs": "int64[C, D] ids, bool[B, T] keep", "out": "bool[C, 1, 1, D, 1] y"},
            "cannot prove the indices count every element",
        ),
    ],
)
def test_mask_gathers_it_cannot_prove_stay(variant: dict[str, str], reason: str) -> None:
    assert_refuses(SimplifyIndexGridsPass, _torchscript_mask_gather(**variant), reason)
