"""FuseRotaryTransposesPass: a RotaryEmbedding between a head split's Transposes runs on [B, S, N*d]."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_rotary_transposes import FuseRotaryTransposesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

RULE = "RotaryEmbedding on [B, S, N*d]"
MS = "com.microsoft::"


def _model(
    back: str = "0, 2, 1, 3",
    reads: str = "sq = Shape <start = 2, end = 3> (r)\n full = Shape (r)",
    outputs: str = ", int64[1] sq, int64[4] full",
    rotary: str = "com.microsoft.RotaryEmbedding <interleaved = 0> (t, pos, cos, sin)",
    opset: int = 20,
    extra_output: str = "",
    pre: str = "",
    half_width: int = 4,
) -> ir.Model:
    """x [B, S, 32] split into 4 heads of 8, rotated, moved back and merged, as the attention
    fusions leave it; ``sq`` and ``full`` read the rotated heads' shape (the fusions' S reads)."""
    text = f"""
        <ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>
        g (float[B, S, 32] x) => (float[B, S, 32] y{outputs}{extra_output}) {{
            {pre}
            heads = Constant <value = int64[4] {{0, 0, 4, 8}}> ()
            h = Reshape (x, heads)
            t = Transpose <perm = [0, 2, 1, 3]> (h)
            r = {rotary}
            b = Transpose <perm = [{back}]> (r)
            merged = Constant <value = int64[3] {{0, 0, -1}}> ()
            y = Reshape (b, merged)
            {reads}
        }}
    """
    rng = np.random.default_rng(0)
    cos, sin = (rng.standard_normal((64, half_width)).astype(np.float32) for _ in range(2))
    return parse(text, pos=np.zeros(1, dtype=np.int64), cos=cos, sin=sin)


def _run(model: ir.Model, **options: object) -> tuple[ir.Model, dict[str, int], list[str]]:
    result = FuseRotaryTransposesPass(PassOptions(explain=True, **options))(model.clone())  # type: ignore[arg-type]
    return result.model, dict(result.stats), result.notes


PARTIAL = (
    "com.microsoft.RotaryEmbedding <num_heads = 4, rotary_embedding_dim = 4> (t, pos, cos, sin)"
)


@pytest.mark.parametrize(
    "original", [_model(), _model(rotary=PARTIAL, half_width=2)], ids=["full", "partial"]
)
def test_rotary_runs_on_the_merged_tensor_and_shape_reads_follow(original: ir.Model) -> None:
    fused, stats, _ = _run(original)
    assert stats == {RULE: 1}
    # (the reshape targets stay for dead-code elimination; B, S of a full read come off x)
    ops = ["Constant", f"{MS}RotaryEmbedding", "Shape", "Shape", "Shape", "Concat", "Constant"]
    assert op_types(fused) == ops
    rotary = list(fused.graph)[1]
    assert rotary.attributes.get_int("num_heads") == 4
    assert rotary.inputs[0] is fused.graph.inputs[0]
    report = validate(original, fused)
    assert report.passed, report
    assert len(report.trials) >= 2  # several sizes of B and S
    _, stats, _ = _run(fused)
    assert stats == {}


def test_heads_not_split_by_a_reshape_are_viewed_as_three_d_first() -> None:
    """Qwen3 / OLMo2 / Persimmon normalize each head of [B, S, N, d] before the rotary: that
    tensor, viewed as [B, S, N*d] by a new Reshape, is rotated instead."""
    text = """
        <ir_version: 10, opset_import: ["" : 20, "com.microsoft" : 1]>
        g (float[B, S, 4, 8] x) => (float[B, S, 32] y) {
            h = LayerNormalization <axis = -1> (x, scale)
            t = Transpose <perm = [0, 2, 1, 3]> (h)
            r = com.microsoft.RotaryEmbedding <interleaved = 0> (t, pos, cos, sin)
            b = Transpose <perm = [0, 2, 1, 3]> (r)
            merged = Constant <value = int64[3] {0, 0, -1}> ()
            y = Reshape (b, merged)
        }
    """
    rng = np.random.default_rng(0)
    cos, sin = (rng.standard_normal((64, 4)).astype(np.float32) for _ in range(2))
    scale = rng.standard_normal(8).astype(np.float32)
    original = parse(text, pos=np.zeros(1, dtype=np.int64), cos=cos, sin=sin, scale=scale)
    fused, stats, _ = _run(original)
    assert stats == {RULE: 1}
    assert "Transpose" not in op_types(fused)
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    view = rotary.inputs[0].producer()
    assert view is not None and view.op_type == "Reshape"
    assert rotary.attributes.get_int("num_heads") == 4
    report = validate(original, fused)
    assert report.passed, report
    assert not _run(fused)[1]


def test_standard_rotary_embedding_at_opset_23() -> None:
    positions = """
            zero = Constant <value = int64 {0}> ()
            one = Constant <value = int64 {1}> ()
            nb = Shape <start = 0, end = 1> (x)
            s = Shape <start = 1, end = 2> (x)
            n = Squeeze (s)
            row = Range (zero, n, one)
            axis0 = Constant <value = int64[1] {0}> ()
            row2 = Unsqueeze (row, axis0)
            bs = Concat <axis = 0> (nb, s)
            ids = Expand (row2, bs)
    """
    original = _model(
        rotary="RotaryEmbedding (t, cos, sin, ids)", reads="", outputs="", opset=23, pre=positions
    )
    fused, stats, _ = _run(original, target="onnx")
    assert stats == {RULE: 1}
    assert op_types(fused).count("RotaryEmbedding") == 1
    assert "Transpose" not in op_types(fused)
    report = validate(original, fused)
    assert report.passed, report


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"back": "0, 2, 3, 1"}, "read other than through one Transpose back"),
        ({"extra_output": ", float[B, 4, S, 8] r"}, "graph output"),
        ({"reads": "n = Neg (r)", "outputs": ", float[B, 4, S, 8] n"}, "more than one reader"),
        (
            {"rotary": "com.microsoft.RotaryEmbedding <num_heads = 2> (t, pos, cos, sin)"},
            "num_heads is 2, the head split makes 4",
        ),
        (
            {"rotary": "com.microsoft.RotaryEmbedding <is_packed_batching = 1> (t, pos, cos, sin)"},
            "packed batching",
        ),
    ],
)
def test_refusals_say_why(kwargs: dict[str, str], reason: str) -> None:
    model = _model(**kwargs)
    before = op_types(model)
    after, stats, notes = _run(model)
    assert stats == {}
    assert op_types(after) == before
    assert any(reason in note for note in notes), notes


def test_key_appended_to_a_kv_cache_keeps_its_layout() -> None:
    """The rotated key's one reader is the present Concat(past, k) [B, N, T, d]: nothing moves."""
    text = """
        <ir_version: 10, opset_import: ["" : 20, "com.microsoft" : 1]>
        g (float[B, S, 32] x, float[B, 4, P, 8] past) => (float[B, 4, T, 8] present) {
            heads = Constant <value = int64[4] {0, 0, 4, 8}> ()
            h = Reshape (x, heads)
            t = Transpose <perm = [0, 2, 1, 3]> (h)
            r = com.microsoft.RotaryEmbedding <interleaved = 0> (t, pos, cos, sin)
            present = Concat <axis = 2> (past, r)
        }
    """
    rng = np.random.default_rng(0)
    cos, sin = (rng.standard_normal((64, 4)).astype(np.float32) for _ in range(2))
    model = parse(text, pos=np.zeros(1, dtype=np.int64), cos=cos, sin=sin)
    after, stats, notes = _run(model)
    assert stats == {}
    assert op_types(after) == op_types(model)
    assert notes == [
        f"{RULE}: RotaryEmbedding: the rotated heads are appended to a KV cache (Concat on the "
        "sequence axis): the present stays [B, N, T, d], no Transpose to drop"
    ]


PARTS_RULE = "parts of moved heads -> moved parts"
SPLIT = "q, k, v = Split <axis = 3> (t, sizes)"
SLICES = """
            q = Slice (t, s0, s8, last)
            k = Slice (t, s8, s16, last)
            v = Slice (t, s16, s24, last)"""


def _parts_model(cut: str = SPLIT, also: str = "", also_output: str = "") -> ir.Model:
    """GPT-NeoX's head split: x [B, S, 4 * 3 * 8] viewed as 4 heads of [q | k | v], moved ahead
    of the sequence, then cut into Q, K and V (dynamo: one Split; TorchScript: three Slices); Q
    and K rotated, all three moved back and merged as the attention fusions read them."""
    back = "\n".join(
        f"""
            {p}b = Transpose <perm = [0, 2, 1, 3]> ({p}r)
            {p}y = Reshape ({p}b, merged)"""
        for p in "qkv"
    )
    text = f"""
        <ir_version: 10, opset_import: ["" : 20, "com.microsoft" : 1]>
        g (float[B, S, 96] x) => (float[B, S, 32] qy, float[B, S, 32] ky, float[B, S, 32] vy{also_output}) {{
            heads = Constant <value = int64[4] {{0, 0, 4, 24}}> ()
            merged = Constant <value = int64[3] {{0, 0, -1}}> ()
            h = Reshape (x, heads)
            t = Transpose <perm = [0, 2, 1, 3]> (h)
            {cut}
            qr = com.microsoft.RotaryEmbedding <interleaved = 0, num_heads = 4> (q, pos, cos, sin)
            kr = com.microsoft.RotaryEmbedding <interleaved = 0, num_heads = 4> (k, pos, cos, sin)
            vr = Identity (v)
            {back}
            {also}
        }}
    """
    rng = np.random.default_rng(1)
    cos, sin = (rng.standard_normal((64, 4)).astype(np.float32) for _ in range(2))
    constants = {f"s{n}": np.array([n], dtype=np.int64) for n in (0, 8, 16, 24)}
    return parse(
        text,
        pos=np.zeros(1, dtype=np.int64),
        cos=cos,
        sin=sin,
        sizes=np.array([8, 8, 8], dtype=np.int64),
        last=np.array([3], dtype=np.int64),
        **constants,
    )


@pytest.mark.parametrize("cut", [SPLIT, SLICES], ids=["split", "slices"])
def test_parts_cut_from_moved_heads_are_cut_first_and_rotated_in_three_d(cut: str) -> None:
    original = _parts_model(cut)
    fused, stats, _ = _run(original)
    assert stats == {PARTS_RULE: 1, RULE: 2}
    ops = op_types(fused)
    assert ops.count(f"{MS}RotaryEmbedding") == 2
    for rotary in (n for n in fused.graph if n.op_type == "RotaryEmbedding"):
        assert rotary.attributes.get_int("num_heads") == 4
        view = rotary.inputs[0].producer()  # [B, S, 4, 8] part viewed as [B, S, 32]
        assert view is not None and view.op_type == "Reshape"
        cut_node = view.inputs[0].producer()
        assert cut_node is not None and cut_node.inputs[0] is not None
        reshape = cut_node.inputs[0].producer()
        assert reshape is not None and reshape.op_type == "Reshape"  # cut before any Transpose
    # Only V's moved part and the move back remain, for the cleanup's Transpose merge.
    assert ops.count("Transpose") == 2
    report = validate(original, fused)
    assert report.passed, report
    assert len(report.trials) >= 2
    assert _run(fused)[1] == {}


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (
            {"also": "n = Neg (t)", "also_output": ", float[B, 4, S, 24] n"},
            "read other than as parts of each head",
        ),
        (
            {"cut": SPLIT.replace("axis = 3", "axis = 1")},
            "read other than as parts of each head",
        ),
        (
            {"cut": SLICES.replace("k = Slice (t, s8, s16, last)", "k = Slice (t, s8, s16, s24)")},
            "read other than as parts of each head",
        ),
        (
            {"cut": "sz = Identity (sizes)\n q, k, v = Split <axis = 3> (t, sz)"},
            "read other than as parts of each head",
        ),
        ({"also_output": ", float[B, 4, S, 8] v"}, "a part of the heads is a graph output"),
    ],
    ids=[
        "heads-read-elsewhere",
        "split-over-heads",
        "slice-other-axis",
        "computed-sizes",
        "output",
    ],
)
def test_parts_refusals_say_why(kwargs: dict[str, str], reason: str) -> None:
    model = _parts_model(**kwargs)
    after, stats, notes = _run(model)
    assert PARTS_RULE not in stats
    assert any(note.startswith(f"{PARTS_RULE}: Transpose") and reason in note for note in notes)
    assert op_types(after).count("Transpose") == op_types(model).count("Transpose")
