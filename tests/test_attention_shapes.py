"""Reading Reshape targets the exporters build around attention (passes/_attention_shapes)."""

from __future__ import annotations

import onnx.parser
import onnx_ir as ir

from onnxopt.passes._attention_shapes import reshape_to_heads, same_dim, target_entries

# The dynamo exporter's repeat_kv: a [B, H, S, d] target, then its first two entries sliced off
# for the key transpose's reshape back to [B, H, d, T].
SLICED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (int64[2] bh, int64[2] every_other, int64[2] dynamic_end) <
    int64[1] four = {4}, int64[1] sixteen = {16}, int64[1] lowest = {-9223372036854775808},
    int64[1] minus2 = {-2}, int64[1] zero = {0}, int64[1] two = {2}, int64[1] axis0 = {0}
> {
    b = Shape<start = 0, end = 1>(x)
    s = Shape<start = 1, end = 2>(x)
    target = Concat<axis = 0>(b, four, s, sixteen)
    bh = Slice(target, lowest, minus2)
    every_other = Slice(target, zero, minus2, axis0, two)
    n = Shape<start = 2, end = 3>(x)
    dynamic_end = Slice(target, zero, n)
}
"""


def _outputs() -> tuple[ir.Value, dict[str, ir.Value]]:
    model = ir.serde.deserialize_model(onnx.parser.parse_model(SLICED))
    return model.graph.inputs[0], {str(value.name): value for value in model.graph.outputs}


def test_a_slice_of_a_readable_target_reads_its_entries() -> None:
    x, outputs = _outputs()
    assert target_entries(outputs["bh"]) == [("dim", x, 0), 4]


def test_a_slice_with_a_step_or_run_time_bounds_is_not_read() -> None:
    _, outputs = _outputs()
    assert target_entries(outputs["every_other"]) is None
    assert target_entries(outputs["dynamic_end"]) is None


def test_a_read_of_a_static_dim_is_that_size() -> None:
    # Falcon's dynamo SDPA export reads a key's single head off another layer's key.
    one_head = ir.Value(name="k_other", shape=ir.Shape(["B", 1, "S", 16]))
    key = ir.Value(name="k", shape=ir.Shape(["B", 1, "T", 16]))
    assert same_dim(("dim", one_head, 1), key, 1)
    assert same_dim(("dim", one_head, 3), key, 3)
    assert same_dim(("dim", one_head, 0), key, 0)  # the same symbol
    assert not same_dim(("dim", one_head, 2), key, 2)  # S and T
    assert not same_dim(("dim", one_head, 1), key, 3)  # 1 is not 16


HEAD_SIZE_INFERRED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 64] x, float[B, S, W] y) => (float[B, S, 4, 16] split, float[B, S, 3, W3] odd,
    float[B, S, 4, W4] unknown) <
    int64[4] heads = {0, 0, 4, -1}, int64[4] three = {0, 0, 3, -1}
> {
    split = Reshape(x, heads)
    odd = Reshape(x, three)
    unknown = Reshape(y, heads)
}
"""


def test_a_head_split_with_an_inferred_head_size_reads_it_off_the_width() -> None:
    # DeBERTa's [0, 0, H, -1]: d is the static width over H, when H divides it
    model = ir.serde.deserialize_model(onnx.parser.parse_model(HEAD_SIZE_INFERRED))
    outputs = {str(value.name): value for value in model.graph.outputs}
    split = reshape_to_heads(outputs["split"])
    assert split is not None and split[1:3] == (4, 16)
    assert reshape_to_heads(outputs["odd"]) is None  # 64 is not a multiple of 3
    assert reshape_to_heads(outputs["unknown"]) is None  # the width is unknown


def test_a_concat_that_other_targets_share_is_read() -> None:
    """tf2onnx builds an einsum's [B, H] batch once and concatenates it into several targets."""
    model = ir.serde.deserialize_model(
        onnx.parser.parse_model(
            """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (int64[4] target) <int64[1] four = {4}> {
    batch = Shape<end = 2>(x)
    piece = Concat<axis = 0>(batch, four)
    target = Concat<axis = 0>(piece, four)
}
"""
        )
    )
    x = model.graph.inputs[0]
    assert target_entries(model.graph.outputs[0]) == [("dim", x, 0), ("dim", x, 1), 4, 4]
