"""fuse-interleaved-rotary: GPT-J / CodeGen / Cohere rotary (rotate_every_two), partial or full."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_interleaved_rotary import FuseInterleavedRotaryPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

HEADS, HEAD, MAX_POS = 4, 16, 40

# GPT-J as exported: the head split [B, S, H, d], the first R dims rotated pairwise, the cos/sin
# tables gathered from a constant [max_pos, R] at Range(0, S) and repeat_interleave'd.
GPTJ = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[B, S, 64] q3{extra_input}) => (float[B, S, 4, 16] qr{extra_output}) {{
    shp = Shape <start = 1, end = 2> ({seq_of})
    n = Squeeze (shp)
    pos = Range ({range_start}, n, one)
    idx = Unsqueeze (pos, {index_axes})
    sincos = {gather} ({table}, idx)
    sin_h, cos_h = Split <axis = -1> (sincos, halves)
    s5 = Unsqueeze (sin_h, ax24)
    s5r = {grow} (s5, reps)
    sin = Reshape <allowzero = {allowzero}> (s5r, table_shape)
    c5 = Unsqueeze (cos_h, ax24)
    c5r = {grow} (c5, reps)
    cos = Reshape <allowzero = {allowzero}> (c5r, table_shape)
{head_split}
    odd = Slice (q, one1, rot_end, ax3, two1)
    even = Slice (q, zero1, rot_end, ax3, two1)
    nodd = Neg ({negated})
    pa = Unsqueeze (nodd, last)
    pb = Unsqueeze ({kept}, last)
    pairs = Concat <axis = -1> (pa, pb)
    rot = Reshape (pairs, pairs_shape)
{tail}
}}
"""

PARTIAL_TAIL = """
    q_rot = Slice (q, zero1, rot_end, ax3, one1)
    q_pass = Slice (q, rot_end, big, ax3, one1)
    qc = Mul (q_rot, {cos})
    qs = Mul (rot, sin)
    y = Add (qc, qs)
    qr = Concat <axis = -1> (y, q_pass)
"""

HALVES = """
    cat_h = Concat <axis = -1> (cos_h, cos_h)
    cos_halves = Unsqueeze (cat_h, ax2)
"""

FULL_TAIL = """
    qc = Mul (q, {cos})
    qs = Mul (rot, sin)
    qr = Add (qc, qs)
"""


def _angles(rot: int) -> np.ndarray:
    inv_freq = 1.0 / 10000 ** (np.arange(0, rot, 2) / rot)
    return np.arange(MAX_POS)[:, None] * inv_freq[None, :]


def _gptj(
    rot: int = 8,
    *,
    spelling: str = "dynamo",
    opset: int = 20,
    table: str = "table",
    extra_input: str = "",
    range_start: str = "zero",
    seq_of: str = "q3",
    negated: str = "odd",
    kept: str = "even",
    cos: str = "cos",
    head_split: str = "    q = Reshape (q3, head_shape)",
    extra_output: str = "",
) -> ir.Model:
    """GPT-J's rotary; ``spelling`` dynamo: GatherND + Expand + Reshape([1, -1, 1, R], allowzero=1),
    torchscript: Gather + Tile + Reshape([1, 0, 1, -1]); gather-elements (transformers before 5,
    either exporter): ``torch.gather(table.repeat(1, 1, 1), 1, ids)``, the position ids
    repeated along the width, then as dynamo."""
    angles = _angles(rot)
    elements = spelling == "gather-elements"
    dynamo = spelling == "dynamo" or elements
    if elements and table == "table":
        table = "table3"
    text = GPTJ.format(
        opset=opset,
        extra_input=extra_input,
        seq_of=seq_of,
        range_start=range_start,
        index_axes="ax02" if dynamo else "ax0",
        gather="GatherND" if dynamo else "Gather <axis = 0>",
        table=table,
        grow="Expand" if dynamo else "Tile",
        allowzero=1 if dynamo else 0,
        negated=negated,
        kept=kept,
        head_split=head_split,
        extra_output=extra_output,
        tail=(HALVES if cos == "cos_halves" else "")
        + (PARTIAL_TAIL if rot < HEAD else FULL_TAIL).format(cos=cos),
    )
    arrays = {
        "zero": np.array(0, dtype=np.int64),
        "one": np.array(1, dtype=np.int64),
        "zero1": np.array([0]),
        "one1": np.array([1]),
        "two1": np.array([2]),
        "rot_end": np.array([rot]),
        "big": np.array([2**63 - 1]),
        "ax0": np.array([0]),
        "ax02": np.array([0, 2]),
        "ax2": np.array([2]),
        "ax3": np.array([3]),
        "ax24": np.array([2, 4]),
        "last": np.array([-1]),
        "halves": np.array([rot // 2, rot // 2]),
        "reps": np.array([1, 1, 1, 1, 2]),
        "table_shape": np.array([1, -1, 1, rot] if dynamo else [1, 0, 1, -1]),
        "head_shape": np.array([0, 0, HEADS, HEAD]),
        "split5": np.array([0, 0, HEADS, 1, HEAD]),
        "pairs_shape": np.array([0, 0, HEADS, rot] if dynamo else [0, 0, 0, -1]),
    }
    sincos = np.concatenate([np.sin(angles), np.cos(angles)], -1).astype(np.float32)
    if table == "table":
        arrays["table"] = sincos
    if elements:
        gathered = f"    sincos = GatherND ({table}, idx)"
        assert gathered in text
        text = text.replace(
            gathered,
            f"    ids = Tile (idx, width)\n    sincos = GatherElements <axis = 1> ({table}, ids)",
        )
        arrays["width"] = np.array([1, 1, rot])
        arrays["table3"] = sincos[None]
    return parse(text.replace("{opset}", str(opset)), **arrays)


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((batch, seq, HEADS * HEAD))
    return {"q3": x.astype(np.float32)}


SIZES = [_feeds(2, 7, 0), _feeds(1, 1, 1), _feeds(3, 33, 2)]


def _fuse(model: ir.Model, rule: str) -> ir.Model:
    fused = model.clone()
    result = FuseInterleavedRotaryPass()(fused)
    assert result.stats == {rule: 1}
    report = validate(model, fused, inputs=SIZES)
    assert report.passed, report
    assert len(report.trials) == len(SIZES)
    assert not FuseInterleavedRotaryPass()(fused).modified
    return fused


@pytest.mark.parametrize("spelling", ["dynamo", "torchscript", "gather-elements"])
def test_partial_gathered_table(spelling: str) -> None:
    fused = _fuse(_gptj(8, spelling=spelling), "partial-interleaved-rotary->RotaryEmbedding")
    # The positions (now unused) stay for dead-code elimination; the rotary reads the rank-3 input.
    assert op_types(fused)[-2:] == ["com.microsoft::RotaryEmbedding", "Reshape"]
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    assert rotary.inputs[0] is fused.graph.inputs[0]
    attrs = {k: a.value for k, a in rotary.attributes.items()}
    assert attrs == {"interleaved": 1, "num_heads": HEADS, "rotary_embedding_dim": 8}
    # The caches are the table's columns as the Split hands them out: sin first, then cos.
    cos, sin = (np.asarray(v.const_value) for v in rotary.inputs[2:4])  # type: ignore[arg-type]
    np.testing.assert_array_equal(cos, np.cos(_angles(8)).astype(np.float32))
    np.testing.assert_array_equal(sin, np.sin(_angles(8)).astype(np.float32))


@pytest.mark.parametrize("spelling", ["dynamo", "torchscript", "gather-elements"])
def test_full_gathered_table(spelling: str) -> None:
    fused = _fuse(_gptj(HEAD, spelling=spelling), "interleaved-rotary->RotaryEmbedding")
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    attrs = {k: a.value for k, a in rotary.attributes.items()}
    assert attrs == {"interleaved": 1, "num_heads": HEADS}


SPLIT5 = "    q5 = Reshape (q3, split5)\n    q = Squeeze (q5, ax3)"


def test_heads_not_split_from_rank_3() -> None:
    """CodeGen: [B, S, H, d] from a packed Q/K/V, not Reshape(x3, [0, 0, H, d]). The table's
    broadcast ([1, S, 1, r]) says which axis is S: merged to [B, S, H*d] for the op and back."""
    fused = _fuse(_gptj(8, head_split=SPLIT5), "partial-interleaved-rotary->RotaryEmbedding")
    assert op_types(fused)[-3:] == ["Reshape", "com.microsoft::RotaryEmbedding", "Reshape"]


def test_heads_not_split_from_rank_3_onnx() -> None:
    model = _gptj(8, head_split=SPLIT5, opset=23)
    fused = model.clone()
    options = PassOptions(target="onnx")
    assert sum(FuseInterleavedRotaryPass(options)(fused).stats.values()) == 1
    assert validate(model, fused, inputs=SIZES).passed
    assert not FuseInterleavedRotaryPass(options)(fused).modified


def _refuses(model: ir.Model, reason: str, options: PassOptions | None = None) -> None:
    result = FuseInterleavedRotaryPass(options or PassOptions(explain=True))(model)
    assert not result.modified
    assert any(reason in note for note in result.notes), result.notes


def test_table_not_constant_refused() -> None:
    _refuses(
        _gptj(table="t", extra_input=", float[40, 8] t"),
        "the gathered cos/sin table is not a constant",
    )


def test_positions_not_from_zero_refused() -> None:
    _refuses(_gptj(range_start="one"), "gather positions are not Unsqueeze(Range(0, S, 1))")


def test_positions_of_another_length_refused() -> None:
    _refuses(
        _gptj(seq_of="p", extra_input=", float[X, P] p"),
        "cannot prove the cos/sin table's gather positions are 0..S-1",
    )


def test_step2_slices_swapped_refused() -> None:
    _refuses(
        _gptj(negated="even", kept="odd"),
        "step-2 slices are not x[..., 1::2] negated, then x[..., ::2]",
    )


def test_intermediate_used_elsewhere_refused() -> None:
    _refuses(
        _gptj(extra_output=", float[B, S, 4, 8] qs"),
        "intermediate Mul result is used outside the rotary pattern",
    )


def test_rotate_half_cos_refused() -> None:
    """A cos that is not repeat_interleave'd (rotate-half's Concat(c, c)) is not interleaved RoPE."""
    _refuses(_gptj(cos="cos_halves"), "the cos/sin table is not repeat_interleave'd")


@pytest.mark.parametrize("rot", [8, HEAD])
def test_target_onnx_opset_23(rot: int) -> None:
    model = _gptj(rot, opset=23)
    fused = model.clone()
    options = PassOptions(target="onnx")
    result = FuseInterleavedRotaryPass(options)(fused)
    assert sum(result.stats.values()) == 1
    assert validate(model, fused, inputs=SIZES).passed
    assert not FuseInterleavedRotaryPass(options)(fused).modified
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    assert rotary.domain == "" and len(rotary.inputs) == 3
    assert rotary.attributes.get_int("interleaved") == 1


def test_target_onnx_old_opset_refused() -> None:
    _refuses(_gptj(), "RotaryEmbedding needs opset 23", PassOptions(target="onnx", explain=True))


# Cohere as exported: heads already moved ahead of the sequence [B, H, S, d], the tables
# Cos/Sin(repeat_interleave(positions * inv_freq)) computed in the graph.
COHERE = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[B, S, 64] q3) => (float[B, 4, S, 16] qr) {
    shp = Shape <start = 1, end = 2> (q3)
    n = Squeeze (shp)
    pos = Range (zero, n, one)
    pos3 = Unsqueeze (pos, ax02)
    posf = Cast <to = 1> (pos3)
    f = Mul (posf, inv_freq)
    f4 = Unsqueeze (f, ax3)
    f4r = Expand (f4, reps)
    rep = Reshape <allowzero = 1> (f4r, rep_shape)
    c3 = Cos (rep)
    s3 = Sin (rep)
    cos = Unsqueeze (c3, ax1)
    sin = Unsqueeze (s3, ax1)
    q4 = Reshape (q3, head_shape)
    q = Transpose <perm = [0, 2, 1, 3]> (q4)
    even = Slice (q, zero1, big, ax3, two1)
    odd = Slice (q, one1, big, ax3, two1)
    nodd = Neg (odd)
    pa = Unsqueeze (nodd, last)
    pb = Unsqueeze (even, last)
    pairs = Concat <axis = -1> (pa, pb)
    rot = Reshape (pairs, pairs_shape)
    qc = Mul (q, cos)
    qs = Mul (rot, sin)
    qr = Add (qc, qs)
}
"""


def test_full_in_graph_angles_heads_first() -> None:
    model = _cohere()
    fused = _fuse(model, "interleaved-rotary->RotaryEmbedding")
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    # The 4-D [B, H, S, d] input as is; the caches Cos/Sin(Reshape(f, [-1, d/2])) built in the graph.
    assert rotary.inputs[0].producer().op_type == "Transpose"  # type: ignore[union-attr]
    assert {k: a.value for k, a in rotary.attributes.items()} == {
        "interleaved": 1,
        "num_heads": HEADS,
    }
    assert [rotary.inputs[i].producer().op_type for i in (2, 3)] == ["Cos", "Sin"]  # type: ignore[union-attr]


def test_full_in_graph_angles_heads_first_onnx() -> None:
    model = _cohere(opset=23)
    fused = model.clone()
    options = PassOptions(target="onnx")
    assert FuseInterleavedRotaryPass(options)(fused).stats == {
        "interleaved-rotary->RotaryEmbedding": 1
    }
    assert validate(model, fused, inputs=SIZES).passed
    assert not FuseInterleavedRotaryPass(options)(fused).modified


def _cohere(opset: int = 20) -> ir.Model:
    return parse(
        COHERE.replace('"" : 20', f'"" : {opset}'),
        zero=np.array(0, dtype=np.int64),
        one=np.array(1, dtype=np.int64),
        zero1=np.array([0]),
        one1=np.array([1]),
        two1=np.array([2]),
        big=np.array([2**63 - 1]),
        ax02=np.array([0, 2]),
        ax1=np.array([1]),
        ax3=np.array([3]),
        last=np.array([-1]),
        inv_freq=(1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD)).astype(np.float32),
        reps=np.array([1, 1, 1, 2]),
        rep_shape=np.array([1, -1, HEAD]),
        head_shape=np.array([0, 0, HEADS, HEAD]),
        pairs_shape=np.array([0, HEADS, 0, HEAD]),
    )


# GLM / Helium / ERNIE 4.5: the usual rotate_half tables Cos/Sin(Concat(f, f)) get the heads axis
# first, and then their first half is repeat_interleave'd (``cos[..., : d // 2]``): Cos(f) paired.
GLM_TABLES = """
    f2 = Add (f, f)
    emb = Concat <axis = -1> (f, {second})
    c3 = Cos (emb)
    s3 = Sin (emb)
    cu = Unsqueeze (c3, ax1)
    su = Unsqueeze (s3, ax1)
    ch = Slice (cu, {window}, ax3)
    sh = Slice (su, {window}, ax3)
    c5 = Unsqueeze (ch, ax4)
    s5 = Unsqueeze (sh, ax4)
    c5r = Expand (c5, reps5)
    s5r = Expand (s5, reps5)
    cos = Reshape <allowzero = 1> (c5r, rep_shape4)
    sin = Reshape <allowzero = 1> (s5r, rep_shape4)
"""


def _glm(second: str = "f", window: str = "zero1, half1") -> ir.Model:
    start = COHERE.index("    f4 = Unsqueeze")
    end = COHERE.index("    q4 = Reshape")
    text = COHERE[:start] + GLM_TABLES.format(second=second, window=window) + COHERE[end:]
    model = _cohere()
    return parse(
        text,
        **{
            v.name: v.const_value.numpy()  # type: ignore[union-attr]
            for v in model.graph.initializers.values()
            if v.name not in ("reps", "rep_shape")
        },
        ax4=np.array([4]),
        half1=np.array([HEAD // 2]),
        end1=np.array([HEAD]),
        reps5=np.array([1, 1, 1, 1, 2]),
        rep_shape4=np.array([1, 1, -1, HEAD]),
    )


def test_halved_rotate_half_tables() -> None:
    fused = _fuse(_glm(), "interleaved-rotary->RotaryEmbedding")
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    assert rotary.attributes["interleaved"].value == 1
    assert [rotary.inputs[i].producer().op_type for i in (2, 3)] == ["Cos", "Sin"]  # type: ignore[union-attr]
    # The second half of Concat(f, f) is f too, but a repeat of it is not what the graph shows
    # (refused, not assumed); nor is the half of Concat(f, 2f).
    _refuses(_glm(window="half1, end1"), "a slice other than its first half")
    _refuses(_glm(second="f2"), "not Concat(f, f)")


def test_gather_elements_of_more_than_one_table_row_refused() -> None:
    """torch.gather along the positions of a table repeated for two rows reads per-row ids: not
    one constant cache (nothing proves the rows alike), so the rotary is left as it is."""
    model = _gptj(8, spelling="gather-elements")
    table = next(v for v in model.graph.initializers.values() if v.name == "table3")
    table.const_value = ir.tensor(np.concatenate([np.asarray(table.const_value)] * 2))
    table.shape = ir.Shape([2, MAX_POS, 8])
    _refuses(model, "does not read one row of a constant table")
