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
