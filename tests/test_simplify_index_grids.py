"""SimplifyIndexGridsPass: GatherND over an in-order Range grid (transformers' exported masks)."""

from __future__ import annotations

import pytest

from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
from onnxopt.passes.simplify_index_grids import SimplifyIndexGridsPass
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
