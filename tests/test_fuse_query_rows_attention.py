"""FuseAttentionPass on multi-query attention with the query heads folded into the rows.

GPT-BigCode as transformers 4.x wrote it (SantaCoder, StarCoder) views the [B, S, H*d] query as
[B, S*H, d] rows, takes ``baddbmm`` of them with the one [B, d, T] key head, views the scores as
[B, S, H, T] for the mask (its lower-triangular ``bias`` buffer cut to [S, T], and the padding,
given a head axis of 1) and views the probabilities back as rows for P@V. TorchScript adds
baddbmm's ``beta * input`` as zeros of the scores' shape read off an ``empty`` tensor; dynamo
drops it and cuts the buffer from a constant row 0, where TorchScript computes ``T - S``.

The graphs are one layer of 4 query heads of 8 and one K/V head, in each spelling, with the
padding mask as an input so that the checks can pad rows on either side, or whole.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

HEADS, D, POSITIONS = 4, 8, 16
WIDTH = HEADS * D
LOWEST = "-3.4028234663852886e38"

# baddbmm's zeros, TorchScript's way: ConstantOfShape of the Shape of an ``empty`` of that shape
_ZEROS = """
            empty = ConstantOfShape(rows_shape)
            empty_shape = Shape(empty)
            zeros = ConstantOfShape(empty_shape)
            summed = Add(scaled, zeros)"""


def _model(
    spelling: str = "dynamo",
    *,
    view_heads: int = HEADS,
    buffer: np.ndarray | None = None,
    row_start: str = "",
    probs_out: bool = False,
) -> ir.Model:
    """x [B, S, 32] and mask [B, S] -> y [B, S, 32] (see the module docstring). ``view_heads``:
    the H the scores are viewed with; ``buffer``: the [P, P] causal buffer (lower-triangular);
    ``row_start``: a constant first row of its cut (S rows from there) instead of the exporter's
    ``T - S``; ``probs_out``: the
    probabilities are a graph output too."""
    torchscript = spelling == "torchscript"
    end = "seq"
    if row_start:
        start = (
            "start = Constant<value = int64[1] {"
            + row_start
            + "}>()\n            end = Add(start, seq)"
        )
        end = "end"
    elif torchscript:
        start = "gone = Sub(seq0, seq0)\n            start = Unsqueeze(gone, zero1)"
    else:
        start = "start = Identity(zero1)"
    text = f"""
        <ir_version: 9, opset_import: ["" : 17]>
        agraph (float[B, S, {WIDTH}] x, int64[B, S] mask)
            => (float[B, S, {WIDTH}] y{", float[B, S, " + str(view_heads) + ", S] probs" if probs_out else ""}) <
            int64[2] qkv_sizes = {{{WIDTH}, {2 * D}}},
            int64[2] kv_sizes = {{{D}, {D}}},
            int64[1] zero1 = {{0}},
            int64[1] one1 = {{1}},
            int64[1] two1 = {{2}},
            int64[1] size1 = {{{D}}},
            int64[1] heads1 = {{{view_heads}}},
            int64[1] width1 = {{{WIDTH}}},
            int64 heads = {{{HEADS}}},
            int64[3] pad_view = {{0, 1, -1}},
            float scale = {{0.35355339}},
            float lowest = {{{LOWEST}}}
        > {{
            proj = MatMul(x, w)
            biased = Add(proj, b)
            q, kv = Split<axis=2>(biased, qkv_sizes)
            k, v = Split<axis=-1>(kv, kv_sizes)
            batch = Shape<start=0, end=1>(x)
            seq = Shape<start=1, end=2>(x)
            seq0 = Squeeze(seq, zero1)
            rows0 = Mul(seq0, heads)
            rows = Unsqueeze(rows0, zero1)
            query_shape = Concat<axis=0>(batch, rows, size1)
            q3 = Reshape(q, query_shape)
            kt = Transpose<perm=[0, 2, 1]>(k)
            s3 = MatMul(q3, kt)
            scaled = Mul(s3, scale)
            rows_shape = Concat<axis=0>(batch, rows, seq){_ZEROS if torchscript else ""}
            view_shape = Concat<axis=0>(batch, seq, heads1, seq)
            s4 = Reshape({"summed" if torchscript else "scaled"}, view_shape)
            {start}
            cut_rows = Slice(causal, start, {end}, one1)
            cut = Slice(cut_rows, zero1, seq, two1)
            padding = Reshape(mask, pad_view)
            kept = Cast<to=9>(padding)
            keep = And(cut, kept)
            keep4 = Unsqueeze(keep, two1)
            filled = Where(keep4, s4, lowest)
            probs = Softmax<axis=-1>(filled)
            p3 = Reshape(probs, rows_shape)
            context = MatMul(p3, v)
            out_shape = Concat<axis=0>(batch, seq, width1)
            merged = Reshape(context, out_shape)
            y = MatMul(merged, wo)
        }}
    """
    rng = np.random.default_rng(0)
    if buffer is None:
        buffer = np.tril(np.ones((POSITIONS, POSITIONS), dtype=bool))
    return parse(
        text,
        w=(rng.standard_normal((WIDTH, WIDTH + 2 * D)) * 0.4).astype(np.float32),
        b=(rng.standard_normal(WIDTH + 2 * D) * 0.1).astype(np.float32),
        wo=(rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32),
        causal=buffer[None],
    )


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Row 1 fully padded, row 2 right-padded, row 3 left-padded."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[1] = 0
    if batch > 2:
        mask[2, (seq + 1) // 2 :] = 0
    if batch > 3:
        mask[3, : seq // 2] = 0
    return {"x": rng.standard_normal((batch, seq, WIDTH)).astype(np.float32), "mask": mask}


INPUTS = [_feeds(b, s, i) for i, (b, s) in enumerate(((4, 5), (1, 1), (4, 9), (2, 16)))]


def _checked(model: ir.Model, fused: ir.Model) -> None:
    report = validate(model, fused, inputs=INPUTS)
    assert report.passed, report


@pytest.mark.parametrize("spelling", ["dynamo", "torchscript"])
def test_query_rows_fuse_into_multi_head_attention(spelling: str) -> None:
    model = _model(spelling)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = op_types(fused)
    assert "Softmax" not in types and types.count("com.microsoft::MultiHeadAttention") == 1
    # nothing of the rows spelling is left (its shape arithmetic goes with dead-code elimination)
    left = {out.name for node in fused.graph for out in node.outputs}
    assert not left & {"q3", "s3", "scaled", "summed", "s4", "filled", "p3", "context", "merged"}
    assert not result.notes  # the respelled block's original is no candidate of its own
    _checked(model, fused)
    assert not FuseAttentionPass()(fused).modified


@pytest.mark.parametrize("spelling", ["dynamo", "torchscript"])
def test_query_rows_run_as_causal_grouped_query_attention(spelling: str) -> None:
    """The buffer cut from row and column 0 is causal: GroupQueryAttention with one K/V head runs
    causal, the fully padded row averaging V as the export does."""
    model = _model(spelling)
    fused = model.clone()
    FuseAttentionPass()(fused)
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    (gqa,) = (n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("kv_num_heads") == 1
    assert gqa.attributes.get_int("num_heads") == HEADS
    # the one K/V head goes in as the [B, T, d] it was split as: no view of it is left
    assert [value.name for value in gqa.inputs[1:3]] == ["k", "v"]
    _checked(model, fused)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"row_start": "1"}, "cut from row 1: key i+1 is kept for query i"),
        ({"buffer": np.ones((POSITIONS, POSITIONS), dtype=bool)}, "no key is masked"),
    ],
)
def test_a_buffer_cut_that_may_keep_later_keys_is_not_causal(
    change: dict[str, object], reason: str
) -> None:
    model = _model(**change)  # type: ignore[arg-type]
    fused = model.clone()
    FuseAttentionPass()(fused)
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa": 1}, reason
    inputs = INPUTS[:3] if change.get("row_start") else INPUTS  # rows 1..16 of 16 are 15
    report = validate(model, fused, inputs=inputs)
    assert report.passed, report


def _serialized(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


@pytest.mark.parametrize(
    ("change", "options"),
    [
        # no Attention-23 before opset 23: the block is found, respelled and not fused
        ({}, PassOptions(target="onnx")),
        # the probabilities are read outside the block: not respelled at all
        ({"probs_out": True}, PassOptions()),
    ],
)
def test_an_unfused_block_is_left_exactly_as_it_came(
    change: dict[str, object], options: PassOptions
) -> None:
    model = _model("torchscript", **change)  # type: ignore[arg-type]
    before = _serialized(model)
    assert not FuseAttentionPass(options)(model).modified
    assert _serialized(model) == before


def test_scores_viewed_with_another_head_count_are_not_respelled() -> None:
    # [B, S*4, T] viewed as [B, S, 2, T] splits rows across positions: no [B, H, S, T] reading
    model = _model(view_heads=2)
    before = _serialized(model)
    assert not FuseAttentionPass()(model).modified
    assert _serialized(model) == before
    onnx.checker.check_model(ir.serde.serialize_model(model))


@pytest.mark.parametrize(("opset", "found"), [(17, True), (12, False)])
def test_a_softmax_without_an_axis_is_over_the_keys_from_opset_13_only(
    opset: int, found: bool
) -> None:
    """Softmax-1/11 without an axis attribute normalizes from axis 1 on, not over T."""
    from onnxopt.passes._query_rows import _find

    model = _model()
    softmax = next(node for node in model.graph if node.op_type == "Softmax")
    del softmax.attributes["axis"]
    model.graph.opset_imports[""] = opset
    assert (_find(softmax) is not None) is found
