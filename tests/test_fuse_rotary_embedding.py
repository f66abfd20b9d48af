from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.ops import const_array
from onnxopt.passes.fuse_rotary_embedding import FuseRotaryEmbeddingPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

# Two rotaries (query with 4 heads, key with 2) sharing one cos/sin table, as transformers' LLaMA
# exports it after cleanup: f = positions * inv_freq [1, S, 8], cos = Unsqueeze(Cos(Concat(f, f)), 1).
ROPE = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[B, 4, S, 16] q, float[B, 2, S, 16] k{extra_input}) => (float[B, 4, S, 16] qr, float[B, 2, S, 16] kr{extra_output}) {{
    zero = Constant <value = int64 {{0}}> ()
    one = Constant <value = int64 {{1}}> ()
    shp = Shape <start = 2, end = 3> (q)
    n = Squeeze (shp)
    pos = Range (zero, n, one)
    axes02 = Constant <value = int64[2] {{0, 2}}> ()
    ax2 = Constant <value = int64[1] {{2}}> ()
    pos3 = Unsqueeze ({positions}, {position_axes})
    posf = Cast <to = 1> (pos3)
    f = Mul (posf, inv_freq)
    ff = Concat <axis = -1> (f, f)
    c3 = Cos (ff)
    s3 = Sin (ff)
    ax1 = Constant <value = int64[1] {{1}}> ()
    c = Unsqueeze (c3, ax1)
    s = Unsqueeze (s3, ax1)
{rotary_q}
{rotary_k}
}}
"""

ROTARY = """
    {x}_c = Mul ({x}, c)
    {x}_lo = Slice ({x}, starts_lo, ends_lo, last, step)
    {x}_hi = Slice ({x}, starts_hi, ends_hi, last, step)
    {x}_neg = Neg ({x}_hi)
    {x}_rot = Concat <axis = -1> ({x}_neg, {x}_lo)
    {x}_s = Mul ({x}_rot, s)
    {x}r = Add ({x}_c, {x}_s)
"""


def _slices(lo: int = 8) -> dict[str, np.ndarray]:
    return {
        "starts_lo": np.array([0]),
        "ends_lo": np.array([lo]),
        "starts_hi": np.array([lo]),
        "ends_hi": np.array([2**63 - 1]),
        "last": np.array([-1]),
        "step": np.array([1]),
    }


def _inv_freq() -> np.ndarray:
    return (1.0 / 10000 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)


def _model(
    opset: int = 20,
    positions: str = "pos",
    lo: int = 8,
    extra_input: str = "",
    extra_output: str = "",
    position_axes: str = "axes02",
) -> ir.Model:
    text = _rope_text(opset, positions, extra_input, extra_output, position_axes)
    return parse(text, inv_freq=_inv_freq(), **_slices(lo))


def _rope_text(
    opset: int,
    positions: str = "pos",
    extra_input: str = "",
    extra_output: str = "",
    position_axes: str = "axes02",
    rotary: str = ROTARY,
) -> str:
    return ROPE.format(
        opset=opset,
        positions=positions,
        position_axes=position_axes,
        extra_input=extra_input,
        extra_output=extra_output,
        rotary_q=rotary.format(x="q"),
        rotary_k=rotary.format(x="k"),
    )


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((batch, 4, seq, 16)).astype(np.float32),
        "k": rng.standard_normal((batch, 2, seq, 16)).astype(np.float32),
    }


SIZES = [_feeds(2, 7, 0), _feeds(1, 1, 1), _feeds(3, 33, 2)]


# The two fused rotaries and the caches they share, computed from the model's own positions.
FUSED_ORT = [
    "Shape",
    "Squeeze",
    "Range",
    "Unsqueeze",
    "Cast",
    "Mul",
    "Reshape",
    "Cos",
    "Sin",
    "com.microsoft::RotaryEmbedding",
    "com.microsoft::RotaryEmbedding",
]


def _fuse(model: ir.Model, options: PassOptions | None = None) -> ir.Model:
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(options)(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    report = validate(model, fused, inputs=SIZES)
    assert report.passed, report
    assert len(report.trials) == len(SIZES)
    assert not FuseRotaryEmbeddingPass(options)(fused).modified
    return fused


def test_rotary_ort_shares_one_cache() -> None:
    fused = _fuse(_model())
    assert [t for t in op_types(fused) if t != "Constant"] == FUSED_ORT
    assert fused.opset_imports["com.microsoft"] == 1
    # The caches are [S, H/2], computed from the model's own positions: nothing pins S.
    rotary = [n for n in fused.graph if n.op_type == "RotaryEmbedding"]
    assert rotary[0].inputs[2] is rotary[1].inputs[2] and rotary[0].inputs[3] is rotary[1].inputs[3]
    assert rotary[0].attributes.get_int("interleaved") == 0


def test_rotary_onnx_opset_23() -> None:
    fused = _fuse(_model(opset=23), PassOptions(target="onnx"))
    types = [t for t in op_types(fused) if t != "Constant"]
    assert types.count("RotaryEmbedding") == 2 and "Neg" not in types and "Slice" not in types
    assert all(n.domain in ("", "ai.onnx") for n in fused.graph)


def test_rotary_onnx_old_opset_left_alone() -> None:
    result = FuseRotaryEmbeddingPass(PassOptions(target="onnx", explain=True))(_model())
    assert not result.modified
    assert (
        result.notes
        == ["rotary->RotaryEmbedding: Add: RotaryEmbedding needs opset 23, the model imports 20"]
        * 2
    )


def _static_table_model(rotary: str) -> tuple[ir.Model, np.ndarray]:
    """q [2, 4, 6, 16] rotated by ``rotary`` with the constant cos/sin tables a static export folds,
    and the angles those are of ([1, 1, 6, 16], both halves equal)."""
    angles = np.arange(6)[:, None] * _inv_freq()[None]
    table = np.concatenate([angles, angles], -1)[None, None].astype(np.float32)
    text = (
        """
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[2, 4, 6, 16] q) => (float[2, 4, 6, 16] qr) {
    """
        + rotary.format(x="q")
        + "}"
    )
    return parse(text, c=np.cos(table), s=np.sin(table), **_slices()), table


def test_rotary_constant_tables_static_shapes() -> None:
    """A static export folds cos/sin into constants: the caches become constants of the same rows."""
    model, _ = _static_table_model(ROTARY)
    fused = model.clone()
    result = FuseRotaryEmbeddingPass()(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 1}
    assert [t for t in op_types(fused) if t != "Constant"] == ["com.microsoft::RotaryEmbedding"]
    report = validate(model, fused)
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass()(fused).modified


def _refuses(model: ir.Model, reason: str, options: PassOptions | None = None) -> None:
    before = op_types(model)
    result = FuseRotaryEmbeddingPass(options or PassOptions(explain=True))(model)
    assert not result.modified, result.stats
    assert op_types(model) == before
    assert any(reason in note for note in result.notes), result.notes


def test_rotary_partial_dims_refused() -> None:
    _refuses(_model(lo=4), "rotate_half slices [0:4], expected the halves of 16")


def _per_row_model(opset: int = 20, batch: str = "B") -> ir.Model:
    """position_ids [B, S] given as an input (Optimum's decoders): the angles differ per batch row."""
    return _model(
        opset=opset,
        positions="position_ids",
        extra_input=f", int64[{batch}, S] position_ids",
        position_axes="ax2",
    )


def _per_row_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Each row its own positions: a left-padded row starts later, a decode step far on."""
    feeds = _feeds(batch, seq, seed)
    starts = np.random.default_rng(seed).integers(0, 50, (batch, 1))
    feeds["position_ids"] = (starts + np.arange(seq)[None]).astype(np.int64)
    return feeds


PER_ROW_SIZES = [_per_row_feeds(2, 7, 0), _per_row_feeds(1, 1, 1), _per_row_feeds(3, 1, 2)]


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rotary_positions_per_batch_row(target: str) -> None:
    """Caches of the angles' own B*S rows; token (b, s) reads row b*S + s (ort: position_ids
    Reshape(Range(0, B*S), [B, S]), built once for both rotaries; onnx: [B, S, H/2] caches)."""
    model = _per_row_model(opset=23 if target == "onnx" else 20)
    options = PassOptions(target=target)  # type: ignore[arg-type]
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(options)(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    # The template's unused Range(0, S) stays (dead code is another pass's job).
    types = [t for t in op_types(fused) if t != "Constant"][3:]
    assert [t for t in op_types(fused) if t != "Constant"][:3] == ["Shape", "Squeeze", "Range"]
    if target == "ort":
        assert types == [
            "Unsqueeze", "Cast", "Mul", "Reshape", "Cos", "Sin", "Shape", "ReduceProd",
            "Range", "Reshape", "com.microsoft::RotaryEmbedding", "com.microsoft::RotaryEmbedding",
        ]  # fmt: skip
    else:
        assert types == [
            "Unsqueeze",
            "Cast",
            "Mul",
            "Cos",
            "Sin",
            "RotaryEmbedding",
            "RotaryEmbedding",
        ]
    report = validate(model, fused, inputs=PER_ROW_SIZES)
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass(options)(fused).modified


def test_rotary_positions_per_batch_row_unproven_batch_refused() -> None:
    """position_ids [C, S]: C is not provably x's batch B (C = 1 would broadcast one row's angles)."""
    _refuses(_per_row_model(batch="C"), "cannot prove they have the input's batch size")


def test_rotary_unproven_sequence_length_refused() -> None:
    """Angles from positions of unknown length: cos could broadcast one row over every position."""
    _refuses(
        _model(positions="p", extra_input=", int64[P] p"),
        "cannot prove the cos table has one row per input position",
    )


def test_rotary_intermediate_used_elsewhere_refused() -> None:
    """The query's x*cos is also a graph output: only the key's rotary fuses."""
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(
        _model(extra_output=", float[B, 4, S, 16] q_c")
    )
    assert result.stats == {"rotary->RotaryEmbedding": 1}
    assert result.notes == [
        "rotary->RotaryEmbedding: Add: intermediate Mul result is used outside the rotary pattern"
    ]
    assert "Neg" in op_types(result.model) and "Cos" in op_types(result.model)


def test_rotary_halves_that_differ_refused() -> None:
    table = np.random.default_rng(0).standard_normal((1, 1, 6, 16)).astype(np.float32)
    text = (
        """
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[2, 4, 6, 16] q) => (float[2, 4, 6, 16] qr) {
    """
        + ROTARY.format(x="q")
        + "}"
    )
    _refuses(parse(text, c=table, s=table, **_slices()), "constant cos/sin halves differ")


# NanoChat's rotate_half, Concat(x2, -x1): the rotation by -angle, the rotary with sin negated.
NEGATED_ROTARY = ROTARY.replace("Neg ({x}_hi)", "Neg ({x}_lo)").replace(
    "({x}_neg, {x}_lo)", "({x}_hi, {x}_neg)"
)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rotary_negated_rotate_half(target: str) -> None:
    text = _rope_text(23, rotary=NEGATED_ROTARY)
    fused = _fuse(parse(text, inv_freq=_inv_freq(), **_slices()), PassOptions(target=target))
    types = [t for t in op_types(fused) if t != "Constant"]
    # one Neg of the shared sin cache, instead of one per rotated tensor
    assert types.count("Neg") == 1 and "Slice" not in types


def test_rotary_negated_rotate_half_constant_tables() -> None:
    model, table = _static_table_model(NEGATED_ROTARY)
    fused = model.clone()
    assert FuseRotaryEmbeddingPass()(fused).stats == {"rotary->RotaryEmbedding": 1}
    rotary = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    sin_cache = const_array(rotary.inputs[3])
    assert sin_cache is not None
    np.testing.assert_array_equal(sin_cache, -np.sin(table)[0, 0, :, :8])
    report = validate(model, fused)
    assert report.passed, report


def test_rotary_both_halves_negated_refused() -> None:
    both = ROTARY.replace("({x}_neg, {x}_lo)", "({x}_neg, {x}_lo_neg)").replace(
        "    {x}_s = Mul", "    {x}_lo_neg = Neg ({x}_lo)\n    {x}_s = Mul"
    )
    model, _ = _static_table_model(both)
    _refuses(model, "rotate_half is not Concat(Neg(Slice(x)), Slice(x))")


def _heads_last(text: str) -> str:
    """The ROPE model with q, k [B, S, N, 16] and the tables unsqueezed at axis 2 ([1, S, 1, 16]),
    as MLCD and Qwen2-VL's vision tower rotate before moving the heads ahead of the sequence."""
    for old, new in (
        ("float[B, 4, S, 16] qr", "float[B, S, 4, 16] qr"),
        ("float[B, 2, S, 16] kr", "float[B, S, 2, 16] kr"),
        ("float[B, 4, S, 16] q,", "float[B, S, 4, 16] q,"),
        ("float[B, 2, S, 16] k)", "float[B, S, 2, 16] k)"),
        ("Unsqueeze (c3, ax1)", "Unsqueeze (c3, ax2)"),
        ("Unsqueeze (s3, ax1)", "Unsqueeze (s3, ax2)"),
        ("Shape <start = 2, end = 3> (q)", "Shape <start = 1, end = 2> (q)"),
    ):
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize(("target", "opset"), [("ort", 20), ("onnx", 23)])
def test_rotary_heads_after_the_sequence(target: str, opset: int) -> None:
    text = _heads_last(_rope_text(opset))
    model = parse(text, inv_freq=_inv_freq(), **_slices())
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(target=target))(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    rotaries = [n for n in fused.graph if n.op_type == "RotaryEmbedding"]
    assert [n.attributes.get_int("num_heads") for n in rotaries] == [4, 2]
    assert all(len(n.inputs[0].shape or ()) == 3 for n in rotaries)  # the [B, S, N*16] views
    inputs = []
    for batch, seq in ((2, 7), (1, 1), (3, 33)):
        rng = np.random.default_rng(seq)
        q = rng.standard_normal((batch, seq, 4, 16)).astype(np.float32)
        inputs.append({"q": q, "k": rng.standard_normal((batch, seq, 2, 16)).astype(np.float32)})
    report = validate(model, fused, inputs=inputs)
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass(PassOptions(target=target))(fused).modified


def test_rotary_heads_after_the_sequence_constant_tables() -> None:
    text = (
        """
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[2, 6, 4, 16] q) => (float[2, 6, 4, 16] qr) {
    """
        + ROTARY.format(x="q")
        + "}"
    )
    angles = np.arange(6)[:, None] * _inv_freq()[None]
    table = np.concatenate([angles, angles], -1)[None, :, None].astype(np.float32)  # [1, 6, 1, 16]
    model = parse(text, c=np.cos(table), s=np.sin(table), **_slices())
    fused = model.clone()
    assert FuseRotaryEmbeddingPass()(fused).stats == {"rotary->RotaryEmbedding": 1}
    report = validate(model, fused)
    assert report.passed, report


def test_rotary_heads_after_the_sequence_with_dynamic_heads_refused() -> None:
    text = _heads_last(_rope_text(20)).replace("float[B, S, 4, 16] q,", "float[B, S, N, 16] q,")
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(
        parse(text, inv_freq=_inv_freq(), **_slices())
    )
    assert result.stats == {"rotary->RotaryEmbedding": 1}  # k only
    assert any("N not static" in note for note in result.notes), result.notes


@pytest.mark.torch
@pytest.mark.slow  # ~20 s each; test_zoo already runs llama-tiny (TorchScript) at -O2 in the fast set
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_tiny_llama_rotary(exporter: str, tmp_path: Path) -> None:
    """Both exporters' LLaMA: 2 layers x (query, key) rotaries fused, outputs equal at several sizes."""
    pytest.importorskip("torch")
    from onnxopt.api import optimize
    from onnxopt.export import export

    path = tmp_path / "llama.onnx"
    export("llama-tiny", path, exporter=exporter)  # type: ignore[arg-type]
    # fuse-gqa-rotary would fold these rotaries into GroupQueryAttention (tests/test_fuse_gqa_rotary.py)
    result = optimize(path, find_reference=True, disable=["fuse-gqa-rotary"])
    assert result.validated, result.report.validation
    assert result.report.validation is not None and len(result.report.validation.trials) >= 3
    ops = result.report.after.op_counts
    assert ops.get("com.microsoft::RotaryEmbedding") == 4
    assert "Neg" not in ops and "Sin" in ops
    assert result.report.reference is not None and not result.report.reference.errors


def test_rotary_float16_with_cast_tables() -> None:
    """transformers casts cos/sin to the activations' dtype: the Cast is rebuilt on the cache."""
    text = (
        _rope_text(20)
        .replace("float[B, 4, S, 16]", "float16[B, 4, S, 16]")
        .replace("float[B, 2, S, 16]", "float16[B, 2, S, 16]")
        .replace(
            "c = Unsqueeze (c3, ax1)", "c3h = Cast <to = 10> (c3)\n    c = Unsqueeze (c3h, ax1)"
        )
        .replace(
            "s = Unsqueeze (s3, ax1)", "s3h = Cast <to = 10> (s3)\n    s = Unsqueeze (s3h, ax1)"
        )
    )
    model = parse(text, inv_freq=_inv_freq(), **_slices())
    fused = model.clone()
    assert FuseRotaryEmbeddingPass()(fused).stats == {"rotary->RotaryEmbedding": 2}
    types = [t for t in op_types(fused) if t != "Constant"]
    assert types[-6:] == [
        "Cos",
        "Cast",
        "Sin",
        "Cast",
        "com.microsoft::RotaryEmbedding",
        "com.microsoft::RotaryEmbedding",
    ]
    half = [{k: v.astype(np.float16) for k, v in f.items()} for f in SIZES]
    report = validate(model, fused, inputs=half)
    assert report.passed, report


# Partial rotary (Phi, GPT-NeoX, StableLM): only x[..., :r] of each 16-dim head rotates, the rest
# is concatenated back unchanged. f [1, S, r/2]: the caches are [S, r/2].
PARTIAL = """
    {x}_r = Slice ({x}, zero1, r1, last, step)
    {x}_p = Slice ({x}, r1, big, last, step)
    {x}_c = Mul ({x}_r, c)
    {x}_lo = Slice ({halves_of}, zero1, h1, last, step)
    {x}_hi = Slice ({halves_of}, h1, {hi_end}, last, step)
    {x}_neg = Neg ({x}_hi)
    {x}_rot = Concat <axis = -1> ({x}_neg, {x}_lo)
    {x}_s = Mul ({x}_rot, s)
    {x}_a = Add ({x}_c, {x}_s)
{kept}
    {x}r = Concat <axis = -1> ({x}_a, {x}_kept)
"""
SPLIT = "{x}_r, {x}_p = Split <axis = -1> ({x}, sizes)"


def _partial_model(
    form: str = "merged",
    opset: int = 20,
    width: int = 8,
    kept: str = "",
    angles: int | None = None,
    query_heads: str = "4",
) -> ir.Model:
    """``nested``: rotate_half slices x[..., :r] as exported; ``merged``: it slices x itself, as
    after merge-consecutive-ops; ``split``: x[..., :r] and x[..., r:] are one Split's outputs."""
    body = ""
    for x in ("q", "k"):
        text = PARTIAL.format(
            x="{x}",
            halves_of="{x}" if form == "merged" else "{x}_r",
            hi_end="r1" if form == "merged" else "big",
            kept=f"    {{x}}_kept = {kept}" if kept else "",
        )
        if not kept:
            text = text.replace("{x}_kept", "{x}_p")
        if form == "split":
            text = text.replace(
                "{x}_r = Slice ({x}, zero1, r1, last, step)\n    {x}_p = Slice ({x}, r1, big, last, step)",
                SPLIT,
            )
        body += text.format(x=x)
    text = ROPE.format(
        opset=opset,
        positions="pos",
        position_axes="axes02",
        extra_input="",
        extra_output="",
        rotary_q=body,
        rotary_k="",
    ).replace("float[B, 4, S, 16] q,", f"float[B, {query_heads}, S, 16] q,")
    ints = {
        "zero1": [0],
        "r1": [width],
        "h1": [width // 2],
        "big": [2**63 - 1],
        "last": [-1],
        "step": [1],
        "sizes": [width, 16 - width],
    }
    arrays = {k: np.array(v, dtype=np.int64) for k, v in ints.items()}
    columns = width // 2 if angles is None else angles
    inv_freq = (1.0 / 10000 ** (np.arange(columns) * 2 / width)).astype(np.float32)
    return parse(text, inv_freq=inv_freq, two=np.array(2.0, dtype=np.float32), **arrays)


def _fuse_partial(model: ir.Model, options: PassOptions | None = None) -> ir.Model:
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(options)(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2, "partial-rotary->RotaryEmbedding": 2}
    report = validate(model, fused, inputs=SIZES)
    assert report.passed, report
    assert len(report.trials) == len(SIZES)
    assert not FuseRotaryEmbeddingPass(options)(fused).modified
    return fused


@pytest.mark.parametrize("form", ["nested", "merged", "split"])
def test_partial_rotary_ort(form: str) -> None:
    """ORT's contrib kernel rotates the first rotary_embedding_dim dims and copies the rest."""
    fused = _fuse_partial(_partial_model(form))
    assert [t for t in op_types(fused) if t != "Constant"] == FUSED_ORT
    rotary = [n for n in fused.graph if n.op_type == "RotaryEmbedding"]
    assert [n.inputs[0].name for n in rotary] == ["q", "k"]
    assert [n.attributes.get_int("rotary_embedding_dim") for n in rotary] == [8, 8]
    assert [n.attributes.get_int("num_heads") for n in rotary] == [4, 2]


def test_partial_rotary_onnx_opset_23() -> None:
    fused = _fuse_partial(_partial_model(opset=23), PassOptions(target="onnx"))
    types = [t for t in op_types(fused) if t != "Constant"]
    assert types.count("RotaryEmbedding") == 2 and "Slice" not in types and "Neg" not in types
    rotary = [n for n in fused.graph if n.op_type == "RotaryEmbedding"]
    assert [n.inputs[0].name for n in rotary] == ["q", "k"]
    assert [n.attributes.get_int("rotary_embedding_dim") for n in rotary] == [8, 8]
    assert all(n.domain in ("", "ai.onnx") for n in fused.graph)


def test_partial_rotary_odd_width_refused() -> None:
    """(No model that runs rotates an odd width as rotate_half: the check comes first.)"""
    _refuses(
        _partial_model("nested", width=7),
        "rotary->RotaryEmbedding: Add: rotary width 7 (the rotated dims) is not a static even number",
    )


def test_partial_rotary_pass_through_altered_refused() -> None:
    """x[..., r:] * 2 concatenated back: the rotary of x[..., :r] fuses on its own, no more."""
    model = _partial_model(kept="Mul ({x}_p, two)")
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    assert (
        result.notes
        == [
            "partial-rotary->RotaryEmbedding: Concat: the part concatenated after the rotary is not "
            "the rest of the head it was sliced from (x[..., r:] unchanged)"
        ]
        * 2
    )
    assert validate(model, fused, inputs=SIZES).passed


def test_partial_rotary_cache_width_refused() -> None:
    """Angles for 8 rotated dims ([S, 8] after Concat(f, f): 16 wide) against x[..., :8]."""
    _refuses(
        _partial_model(angles=8),
        "rotary->RotaryEmbedding: Add: rotary angles have 8 columns, not rotary width / 2 = 4",
    )


def test_partial_rotary_dynamic_head_count_refused() -> None:
    """The contrib op needs num_heads with rotary_embedding_dim: a symbolic head count can't give it."""
    model = _partial_model(query_heads="H")
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2, "partial-rotary->RotaryEmbedding": 1}
    assert result.notes == [
        "partial-rotary->RotaryEmbedding: Concat: the head count is not static "
        "(com.microsoft.RotaryEmbedding needs num_heads with rotary_embedding_dim)"
    ]


def test_partial_rotary_of_a_packed_projection() -> None:
    """GPT-NeoX after merge-consecutive-ops: K is dims 16:32 of a packed [B, 2, S, 48] Q/K/V and
    every slice reads the packed tensor: the fused op gets K sliced out once."""
    rotary = (
        PARTIAL.replace("{x}_kept", "{x}_p")
        .replace("{kept}\n", "")
        .format(x="k", halves_of="qkv", hi_end="e_rot")
        .replace("k_r = Slice (k, zero1, r1,", "k_r = Slice (qkv, s_k, e_rot,")
        .replace("k_p = Slice (k, r1, big,", "k_p = Slice (qkv, e_rot, e_k,")
        .replace("Slice (qkv, zero1, h1,", "Slice (qkv, s_k, mid,")
        .replace("Slice (qkv, h1, e_rot,", "Slice (qkv, mid, e_rot,")
    )
    text = ROPE.format(
        opset=20,
        positions="pos",
        position_axes="axes02",
        extra_input="",
        extra_output="",
        rotary_q="    qr = Identity (q)",
        rotary_k=rotary,
    ).replace("float[B, 2, S, 16] k)", "float[B, 2, S, 48] qkv)")
    bounds = {"s_k": 16, "mid": 20, "e_rot": 24, "e_k": 32, "last": -1, "step": 1}
    arrays = {k: np.array([v], dtype=np.int64) for k, v in bounds.items()}
    inv_freq = (1.0 / 10000 ** (np.arange(4) * 2 / 8)).astype(np.float32)
    model = parse(text, inv_freq=inv_freq, **arrays)
    fused = model.clone()
    result = FuseRotaryEmbeddingPass()(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 1, "partial-rotary->RotaryEmbedding": 1}
    node = next(n for n in fused.graph if n.op_type == "RotaryEmbedding")
    cut = node.inputs[0].producer()
    assert cut is not None and cut.op_type == "Slice" and cut.inputs[0].name == "qkv"
    assert [int(const_array(v)[0]) for v in cut.inputs[1:]] == [16, 32, -1]
    rng = np.random.default_rng(3)
    feeds = [
        {"q": rng.standard_normal((b, 4, s, 16)), "qkv": rng.standard_normal((b, 2, s, 48))}
        for b, s in ((2, 7), (1, 1))
    ]
    report = validate(
        model, fused, inputs=[{k: v.astype(np.float32) for k, v in f.items()} for f in feeds]
    )
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass()(fused).modified


# ---------------------------------------------------------------- positions after a KV cache
# With a past of P tokens the positions are P..P+S-1: Add(Range(0, S, 1), P) (TorchScript) or
# Range(P, P + S, 1). The table still has one row per input position, row s for token s.
OFFSET_FORMS = {
    "add": "pos_off = Add (pos, poff)",
    "range": "pend = Add (poff, n)\n    pos_off = Range (poff, pend, one)",
}


def _offset_model(form: str, offset: str = "poff = Squeeze (pshp)") -> ir.Model:
    text = _rope_text(20, positions="pos_off", extra_input=", float[B, 2, P, 16] past")
    cached = (
        f"    pshp = Shape <start = 2, end = 3> (past)\n    {offset}\n    {OFFSET_FORMS[form]}\n"
    )
    return parse(
        text.replace("    pos3 =", cached + "    pos3 ="), inv_freq=_inv_freq(), **_slices()
    )


def _offset_feeds(batch: int, past: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    feeds = _feeds(batch, seq, seed)
    feeds["past"] = np.zeros((batch, 2, past, 16), dtype=np.float32)
    return feeds


@pytest.mark.parametrize("form", sorted(OFFSET_FORMS))
def test_rotary_positions_after_a_cache(form: str) -> None:
    """Positions P..P+S-1 (decode S=1, prompt P=0): the table's rows are the tokens' rows."""
    model = _offset_model(form)
    fused = model.clone()
    result = FuseRotaryEmbeddingPass()(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    types = op_types(fused)
    assert types.count("com.microsoft::RotaryEmbedding") == 2 and "Neg" not in types
    sizes = [
        _offset_feeds(b, p, s, i)
        for i, (b, p, s) in enumerate([(2, 5, 3), (1, 0, 4), (2, 7, 1), (3, 40, 1)])
    ]
    report = validate(model, fused, inputs=sizes)
    assert report.passed, report
    assert len(report.trials) == len(sizes)
    assert not FuseRotaryEmbeddingPass()(fused).modified


def test_rotary_offset_of_several_elements_refused() -> None:
    """An offset [K] added to Range(0, S, 1) broadcasts to K rows when S = 1: not one row per token."""
    text = _rope_text(20, positions="pos_off", extra_input=", int64[K] poff")
    model = parse(
        text.replace("    pos3 =", "    pos_off = Add (pos, poff)\n    pos3 ="),
        inv_freq=_inv_freq(),
        **_slices(),
    )
    _refuses(model, "cannot prove the cos table has one row per input position")


def test_rotary_range_end_not_start_plus_length_refused() -> None:
    """Range(P, P * S, 1): its length is not a dim of the input."""
    text = _rope_text(20, positions="pos_off", extra_input=", float[B, 2, P, 16] past")
    cached = (
        "    pshp = Shape <start = 2, end = 3> (past)\n    poff = Squeeze (pshp)\n"
        "    pend = Mul (poff, n)\n    pos_off = Range (poff, pend, one)\n"
    )
    model = parse(
        text.replace("    pos3 =", cached + "    pos3 ="), inv_freq=_inv_freq(), **_slices()
    )
    _refuses(model, "cannot prove the cos table has one row per input position")


# GPT-OSS rotates the halves of each head itself, with half-width tables scaled by YaRN's
# attention_scaling: cos = Unsqueeze(Cos(f) * a, 1), f [1, S, 8] (no Concat(f, f)).
HALF_TABLES = """c3 = Cos (f)
    s3 = Sin (f)
    cs = Mul (c3, scaling)
    ss = Mul ({sin_factor})
    ax1 = Constant <value = int64[1] {{1}}> ()
    c = Unsqueeze (cs, ax1)
    s = Unsqueeze (ss, ax1)"""
ROPE_TABLES = """ff = Concat <axis = -1> (f, f)
    c3 = Cos (ff)
    s3 = Sin (ff)
    ax1 = Constant <value = int64[1] {{1}}> ()
    c = Unsqueeze (c3, ax1)
    s = Unsqueeze (s3, ax1)"""
# DeepSeek's / GLM's interleaved rotary as transformers 5 writes it: the even and odd dims rotated
# as halves by the first half of the full table.
FIRST_HALF_TABLES = """ff = Concat <axis = -1> (f, f)
    c3 = Cos (ff)
    s3 = Sin (ff)
    ch = Slice (c3, starts_lo, ends_lo, last, step)
    sh = Slice (s3, starts_lo, ends_lo, last, step)
    ax1 = Constant <value = int64[1] {{1}}> ()
    c = Unsqueeze (ch, ax1)
    s = Unsqueeze (sh, ax1)"""
# The halves by Split (dynamo) or two Slices (TorchScript), or the even and odd dims ("pairs");
# ``{first}`` and ``{second}`` are GPT-OSS's x1 * cos - x2 * sin and x2 * cos + x1 * sin unless a
# test changes them.
HALVES_ROTARY = {
    "split": "{x}1, {x}2 = Split <axis = -1, num_outputs = 2> ({x})",
    "slices": "{x}1 = Slice ({x}, starts_lo, ends_lo, last, step)\n"
    "    {x}2 = Slice ({x}, starts_hi, ends_hi, last, step)",
    "pairs": "{x}1 = Slice ({x}, starts_lo, ends_hi, last, every2)\n"
    "    {x}2 = Slice ({x}, odd, ends_hi, last, every2)",
}
HALVES_BODY = """
    {x}_a = Mul ({x}1, c)
    {x}_b = Mul ({x}2, s)
    {x}_first = {first}
    {x}_c = Mul ({x}2, c)
    {x}_d = Mul (s, {x}1)
    {x}_second = {second}
    {x}r = Concat <axis = -1> ({x}_first, {x}_second)
"""


def _halves_model(
    form: str = "split",
    opset: int = 20,
    second: str = "Add ({x}_d, {x}_c)",
    sin_factor: str = "scaling, s3",
    first: str = "Sub ({x}_a, {x}_b)",
    tables: str = HALF_TABLES,
    key_prefix: bool = False,
) -> ir.Model:
    """``key_prefix``: the key's rotated halves concatenated after an un-rotated input ``nope``
    [B, 2, S, 8] (DeepSeek's cat(k_nope, rope(k_pe)), once merge-consecutive-ops has flattened
    the two Concats)."""

    def rotary(x: str) -> str:
        body = HALVES_BODY.format(x=x, first=first.format(x=x), second=second.format(x=x))
        return "    " + HALVES_ROTARY[form].format(x=x) + body

    assert ROPE_TABLES in ROPE
    text = ROPE.replace(ROPE_TABLES, tables).format(
        opset=opset,
        positions="pos",
        position_axes="axes02",
        extra_input=", float[B, 2, S, 8] nope" if key_prefix else "",
        extra_output="",
        sin_factor=sin_factor,
        rotary_q=rotary("q"),
        rotary_k=rotary("k"),
    )
    if key_prefix:
        for old, new in (
            ("float[B, 2, S, 16] kr", "float[B, 2, S, 24] kr"),
            ("(k_first, k_second)", "(nope, k_first, k_second)"),
        ):
            assert old in text
            text = text.replace(old, new)
    scaling = np.array(1.3465736, np.float32)  # GPT-OSS's YaRN factor 32: 0.1 * ln(32) + 1
    pairs = {"odd": np.array([1]), "every2": np.array([2])}
    return parse(text, inv_freq=_inv_freq(), scaling=scaling, **_slices(), **pairs)


@pytest.mark.parametrize("form", ["split", "slices"])
@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rotary_halves_with_scaled_tables(form: str, target: str) -> None:
    """x1*cos - x2*sin, x2*cos + x1*sin is RotaryEmbedding(interleaved=0) of x with the tables as
    its caches; the scaling is multiplied onto Cos/Sin of the shared angles, as the model does."""
    model = _halves_model(form, opset=23 if target == "onnx" else 20)
    options = PassOptions(target=target)
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(options)(fused)
    assert result.stats == {"rotary-halves->RotaryEmbedding": 2}
    types = [t for t in op_types(fused) if t != "Constant"]
    rotary = "com.microsoft::RotaryEmbedding" if target == "ort" else "RotaryEmbedding"
    assert types.count(rotary) == 2 and "Split" not in types and "Slice" not in types
    assert types.count("Cos") == types.count("Sin") == 1 and types.count("Mul") == 3
    report = validate(model, fused, inputs=SIZES)
    assert report.passed, report
    assert max(o.max_abs for o in report.outputs) < 1e-5
    assert not FuseRotaryEmbeddingPass(options)(fused).modified


def test_rotary_halves_of_another_rotation_refused() -> None:
    """x2 * cos + x1 * sin is the second half; x1 * cos + x2 * sin, or the first half's
    difference taken the other way round, is another rotation."""
    _refuses(
        _halves_model(second="Add ({x}_a, {x}_b)"),
        "the two halves are not multiplied by the same cos and sin tables",
    )
    _refuses(
        _halves_model(first="Sub ({x}_b, {x}_a)"),
        "the halves are not rotated as Concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin) of one x",
    )


def test_rotary_halves_tables_scaled_differently_refused() -> None:
    """cos and sin scaled by different factors: the Sin table is a product of another kind."""
    _refuses(_halves_model(sin_factor="s3, c3"), "cos/sin is a product, not Cos/Sin(...) times")


def test_rotary_rotate_half_with_scaled_tables() -> None:
    """LLaMA-style rotate_half with YaRN's scaling on Cos/Sin(Concat(f, f)) fuses as well."""
    text = _rope_text(20).replace(
        "c = Unsqueeze (c3, ax1)", "c3s = Mul (c3, scaling)\n    c = Unsqueeze (c3s, ax1)"
    )
    text = text.replace(
        "s = Unsqueeze (s3, ax1)", "s3s = Mul (scaling, s3)\n    s = Unsqueeze (s3s, ax1)"
    )
    model = parse(text, inv_freq=_inv_freq(), scaling=np.array(1.25, np.float32), **_slices())
    fused = _fuse(model)
    assert [t for t in op_types(fused) if t != "Constant"].count("Mul") == 3


PATCH_ROPE = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[B, 4, 19, 16] qa) => (float[B, 4, 16, 16] qr) {
    q = Slice (qa, prefix, big, ax2)
    zero = Constant <value = int64 {0}> ()
    one = Constant <value = int64 {1}> ()
    shp = Shape <start = 2, end = 3> (q)
    n = Squeeze (shp)
    pos = Range (zero, n, one)
    axes02 = Constant <value = int64[2] {0, 2}> ()
    pos3 = Unsqueeze (pos, axes02)
    posf = Cast <to = 1> (pos3)
    f = Mul (posf, inv_freq)
    ff = Concat <axis = -1> (f, f)
    c3 = Cos (ff)
    s3 = Sin (ff)
    ax1 = Constant <value = int64[1] {1}> ()
    c = Unsqueeze (c3, ax1)
    s = Unsqueeze (s3, ax1)
    q_c = Mul (q, c)
    q_lo = Slice (qa, lo_starts, lo_ends, two_axes)
    q_hi = Slice (qa, hi_starts, hi_ends, two_axes)
    q_neg = Neg (q_hi)
    q_rot = Concat <axis = -1> (q_neg, q_lo)
    q_s = Mul (q_rot, s)
    qr = Add (q_c, q_s)
}
"""


@pytest.mark.parametrize("lo", [8, 7], ids=["halves", "not-halves"])
def test_rotary_of_patch_tokens_with_merged_half_slices(lo: int) -> None:
    """DINOv3 ropes its patch tokens only (``q[:, :, 3:]``, after the class and register tokens);
    merge-consecutive-ops merges each rotate_half slice with that one into ``qa[:, :, 3:, :8]``.
    Those are the halves of the patch tokens' heads."""
    big = 2**63 - 1
    model = parse(
        PATCH_ROPE,
        inv_freq=_inv_freq(),
        prefix=np.array([3]),
        big=np.array([big]),
        ax2=np.array([2]),
        lo_starts=np.array([3, 0]),
        lo_ends=np.array([big, lo]),
        hi_starts=np.array([3, lo]),
        hi_ends=np.array([big, big]),
        two_axes=np.array([2, 3]),
    )
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(fused)
    if lo != 8:
        assert not result.modified
        assert any("expected the halves of 16" in note for note in result.notes), result.notes
        return
    assert result.stats == {"rotary->RotaryEmbedding": 1}, result.notes
    (rotary,) = (node for node in fused.graph if node.op_type == "RotaryEmbedding")
    assert rotary.inputs[0].name == "q"
    rng = np.random.default_rng(0)
    feeds = [{"qa": rng.standard_normal((b, 4, 19, 16)).astype(np.float32)} for b in (2, 1)]
    assert validate(model, fused, inputs=feeds).passed


ANGLE_ROPE = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[B, 4, 6, 16] q) => (float[B, 4, 6, 16] qr) {
    c = Cos (angles)
    s = Sin (angles)
    q_c = Mul (q, c)
    q_lo = Slice (q, starts_lo, ends_lo, last, step)
    q_hi = Slice (q, starts_hi, ends_hi, last, step)
    q_neg = Neg (q_hi)
    q_rot = Concat <axis = -1> (q_neg, q_lo)
    q_s = Mul (q_rot, s)
    qr = Add (q_c, q_s)
}
"""


@pytest.mark.parametrize("equal_halves", [True, False], ids=["tiled", "halves-differ"])
def test_rotary_of_a_constant_angle_table(equal_halves: bool) -> None:
    """torch.export folds DINOv3's 2-D RoPE angles (the patch grid's, tiled twice) into one
    [S, H] constant that Cos and Sin read directly: the cache is its first half."""
    rng = np.random.default_rng(0)
    half = rng.uniform(-3, 3, (6, 8)).astype(np.float32)
    other = half if equal_halves else half + 1
    model = parse(ANGLE_ROPE, angles=np.concatenate([half, other], axis=1), **_slices())
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(fused)
    if not equal_halves:
        assert not result.modified
        assert any("angles' halves differ" in note for note in result.notes), result.notes
        return
    assert result.stats == {"rotary->RotaryEmbedding": 1}, result.notes
    assert [t for t in op_types(fused) if t != "Constant"].count("Neg") == 0
    feeds = [{"q": rng.standard_normal((b, 4, 6, 16)).astype(np.float32)} for b in (2, 1)]
    assert validate(model, fused, inputs=feeds).passed
    assert not FuseRotaryEmbeddingPass()(fused).modified
    # the whole pipeline: its half-width cache is a constant, not a Reshape a second run folds
    from onnxopt.api import optimize

    first = optimize(model, check=False).model
    again = optimize(first, check=False).model
    assert any(node.op_type == "RotaryEmbedding" for node in first.graph)
    assert op_types(again) == op_types(first)


@pytest.mark.parametrize(("rows", "repeats"), [(6, [1, 2]), (3, [2, 1])], ids=["halves", "rows"])
def test_rotary_of_tiled_angles_computed_at_run_time(rows: int, repeats: list[int]) -> None:
    """DINOv3's TorchScript export computes the patch angles from two constants (kept unfolded,
    the growth policy) and tiles them: Cos(Tile(a, [1, 2])) rotates by a's angles twice. Tiled
    along the rows instead, the halves differ: no rotary."""
    rng = np.random.default_rng(1)
    text = ANGLE_ROPE.replace(
        "c = Cos (angles)",
        "a = Mul (position, frequency)\n    angles = Tile (a, repeats)\n    c = Cos (angles)",
    )
    width = 16 // repeats[1]
    model = parse(
        text,
        position=rng.uniform(0, 2, (rows, 1)).astype(np.float32),
        frequency=rng.uniform(0, 1, (1, width)).astype(np.float32),
        repeats=np.array(repeats, np.int64),
        **_slices(),
    )
    fused = model.clone()
    result = FuseRotaryEmbeddingPass()(fused)
    if repeats != [1, 2]:
        assert not result.modified
        return
    assert result.stats == {"rotary->RotaryEmbedding": 1}
    assert "Tile" not in op_types(fused)
    feeds = [{"q": rng.standard_normal((b, 4, 6, 16)).astype(np.float32)} for b in (2, 1)]
    assert validate(model, fused, inputs=feeds).passed
    assert not FuseRotaryEmbeddingPass()(fused).modified


@pytest.mark.parametrize("key_prefix", [True, False], ids=["in-key-concat", "alone"])
def test_rotary_of_even_and_odd_dims(key_prefix: bool) -> None:
    model = _halves_model("pairs", tables=FIRST_HALF_TABLES, key_prefix=key_prefix)
    fused = model.clone()
    result = FuseRotaryEmbeddingPass()(fused)
    assert result.stats == {"rotary-halves->RotaryEmbedding": 2}, result.stats
    types = [t for t in op_types(fused) if t != "Constant"]
    assert "Sub" not in types and types.count("Mul") == 1  # positions x inv_freq only
    assert types.count("Slice") == 4  # the even and odd dims, concatenated for the rotary
    rng = np.random.default_rng(3)
    feeds = [dict(size) for size in SIZES]
    if key_prefix:
        for size in feeds:
            batch, _, seq, _ = size["k"].shape
            size["nope"] = rng.standard_normal((batch, 2, seq, 8)).astype(np.float32)
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass()(fused).modified


def test_rotary_of_a_contiguous_half_and_the_odd_dims_refused() -> None:
    model = _halves_model("pairs", tables=FIRST_HALF_TABLES)
    first = next(n for n in model.graph if n.outputs[0].name == "q1")
    table_half = next(n for n in model.graph if n.outputs[0].name == "ch")  # [..., 0:8:1]
    first.replace_input_with(2, table_half.inputs[2])
    first.replace_input_with(4, table_half.inputs[4])
    result = FuseRotaryEmbeddingPass(PassOptions(explain=True))(model)  # q1 = q[..., 0:8]
    assert result.stats == {"rotary-halves->RotaryEmbedding": 1}  # k's only
    assert any("partly contiguous" in note for note in result.notes), result.notes


# transformers before 4.38 (Mixtral and PhiMoE up to 4.46): a precomputed cos_cached [P, H] (halves
# equal), sliced to the sequence and indexed by the position ids, Range(0, S).
CACHED = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[B, 4, S, 16] q, float[B, 2, S, 16] k) => (float[B, 4, S, 16] qr, float[B, 2, S, 16] kr) {{
    zero = Constant <value = int64 {{{start}}}> ()
    one = Constant <value = int64 {{1}}> ()
    shp = Shape <start = 2, end = 3> (q)
    n = Squeeze (shp)
    {top}
    pos = Range (zero, {end}, one)
    ax0 = Constant <value = int64[1] {{0}}> ()
    ax1 = Constant <value = int64[1] {{1}}> ()
    axes02 = Constant <value = int64[2] {{0, 2}}> ()
    first = Constant <value = int64[1] {{0}}> ()
    rows = Unsqueeze ({end}, ax0)
    cos_part = Slice (cos_cached, first, rows, first)
    sin_part = Slice (sin_cached, first, rows, first)
{gather}
    c = Unsqueeze (c2, ax1)
    s = Unsqueeze (s2, ax1)
{rotary_q}
{rotary_k}
}}
"""

GATHERS = {
    "gather": """    ids = Unsqueeze (pos, ax0)
    c2 = Gather <axis = 0> (cos_part, ids)
    s2 = Gather <axis = 0> (sin_part, ids)""",
    "gathernd": """    ids = Unsqueeze (pos, axes02)
    c2 = GatherND (cos_part, ids)
    s2 = GatherND (sin_part, ids)""",
}


def _cached_model(gather: str, start: int = 0) -> ir.Model:
    angles = np.arange(40, dtype=np.float32)[:, None] * _inv_freq()[None, :]
    table = np.concatenate([angles, angles], -1)
    text = CACHED.format(
        start=start,
        top="top = Add (n, zero)" if start else "",
        end="top" if start else "n",
        gather=GATHERS[gather],
        rotary_q=ROTARY.format(x="q"),
        rotary_k=ROTARY.format(x="k"),
    )
    return parse(text, cos_cached=np.cos(table), sin_cached=np.sin(table), **_slices())


@pytest.mark.parametrize("gather", ["gather", "gathernd"])
def test_rotary_precomputed_tables_indexed_by_positions(gather: str) -> None:
    """The cache is the table's first half, all P rows, read from position 0 ([0] offset)."""
    fused = _fuse(_cached_model(gather))
    rotaries = [n for n in fused.graph if n.op_type == "RotaryEmbedding"]
    cache = const_array(rotaries[0].inputs[2])
    assert cache is not None and cache.shape == (40, 8)
    np.testing.assert_array_equal(const_array(rotaries[0].inputs[1]), [0])
    _refuses(
        _cached_model(gather),
        "more rows than positions: ONNX's RotaryEmbedding",
        PassOptions(target="onnx", explain=True),
    )


def test_rotary_precomputed_tables_at_shifted_positions_refused() -> None:
    """Positions 1..S read rows 1..S: not the [0] offset form."""
    _refuses(_cached_model("gather", start=1), "not Range(0, S)")


def test_rotary_positions_per_batch_row_below_opset_15() -> None:
    """Below opset 15 the row ids' [B, S] are read as a Slice of the whole Shape (a Shape with
    start/end, as at opset 20, is refused by ORT there)."""
    text = _rope_text(14, "position_ids", ", int64[B, S] position_ids", position_axes="ax2")
    text = text.replace(  # the template's own length read, as opset 14 writes it
        "shp = Shape <start = 2, end = 3> (q)\n    n = Squeeze (shp)",
        "shp = Shape (q)\n    two = Constant <value = int64 {2}> ()\n"
        "    n = Gather <axis = 0> (shp, two)",
    )
    model = parse(text, inv_freq=_inv_freq(), **_slices())
    assert "start =" not in text
    fused = model.clone()
    result = FuseRotaryEmbeddingPass(PassOptions(target="ort"))(fused)
    assert result.stats == {"rotary->RotaryEmbedding": 2}
    reads = [n for n in fused.graph if n.op_type == "Shape" and n.inputs[0] is not None]
    new_reads = [n for n in reads if n.inputs[0].name == "f"]  # the angles' [B, S]
    assert new_reads and all(not n.attributes for n in new_reads)
    report = validate(model, fused, inputs=PER_ROW_SIZES)
    assert report.passed, report
    assert not FuseRotaryEmbeddingPass(PassOptions(target="ort"))(fused).modified
