"""FusePackedAttentionPass: Q/K/V projections (merged + Split, or three MatMuls) + MultiHeadAttention -> Attention."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.ops import const_array
from onnxopt.passes.fuse_packed_attention import FusePackedAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types


def _floats(name: str, shape: tuple[int, ...], seed: int) -> str:
    values = np.random.default_rng(seed).standard_normal(int(np.prod(shape))) * 0.5
    return (
        f"float[{', '.join(map(str, shape))}] {name} = {{{', '.join(f'{v:.4f}' for v in values)}}}"
    )


def _model(
    *,
    sizes: tuple[int, int, int] = (8, 8, 8),
    bias: bool = True,
    mask: bool = True,
    query_scale: bool = False,
    leak: bool = False,
    separate: bool = False,
    biases: tuple[bool, bool, bool] = (True, True, True),
    seq: str = "S",
    query_length_at: int | None = None,
    opset: int = 17,
    query_slice: tuple[int, int] = (1, 2),
) -> str:
    """One attention layer as fuse-attention leaves it: a merged projection + Split, or (separate)
    three projections of x with biases where ``biases`` says, then MultiHeadAttention.
    ``query_length_at`` reads the query length as ``Gather(Shape(q), [i])`` (GPT-Neo's TorchScript
    export), not ``Shape(q, 1, 2)``; below opset 15 the lengths are ``Slice(Shape(q), ...)``
    (``query_slice`` the query's bounds)."""
    width = sum(sizes)
    inits = ["int64[2] ones = {1, 1}", "float c = {0.5}"]
    if separate:
        body = []
        for i, (name, size) in enumerate(zip("qkv", sizes, strict=True)):
            inits.append(_floats(f"w{name}", (6, size), 2 * i))
            if biases[i]:
                inits.append(_floats(f"b{name}", (size,), 2 * i + 1))
                body += [f"{name}0 = MatMul(x, w{name})", f"{name} = Add({name}0, b{name})"]
            else:
                body.append(f"{name} = MatMul(x, w{name})")
    else:
        inits += [_floats("w", (6, width), 0), _floats("b", (width,), 1)]
        inits.append(f"int64[3] sizes = {{{', '.join(map(str, sizes))}}}")
        body = ["p0 = MatMul(x, w)", "p = Add(p0, b)"] if bias else ["p = MatMul(x, w)"]
        body.append("q, k, v = Split <axis: int = -1> (p, sizes)")
    query = "q"
    if query_scale:
        body.append("qs = Mul(q, c)")
        query = "qs"
    attention_bias = ""
    if mask:
        if query_length_at is not None:
            inits.append(f"int64[1] at = {{{query_length_at}}}")
            body += [f"q_shape = Shape({query})", "sq = Gather(q_shape, at)"]
        elif opset < 15:
            lo, hi = query_slice
            inits += [f"int64[1] lo = {{{lo}}}", f"int64[1] hi = {{{hi}}}"]
            inits += ["int64[1] one = {1}", "int64[1] two = {2}", "int64[1] axis0 = {0}"]
            body += [f"q_shape = Shape({query})", "sq = Slice(q_shape, lo, hi, axis0)"]
        else:
            body.append(f"sq = Shape <start: int = 1, end: int = 2> ({query})")
        if opset < 15:
            body += ["k_shape = Shape(k)", "sk = Slice(k_shape, one, two)"]
        else:
            body.append("sk = Shape <start: int = 1, end: int = 2> (k)")
        body += [
            "full = Concat <axis: int = 0> (ones, sq, sk)",
            "bias = Expand(m, full)",
        ]
        attention_bias = ', "", "", bias'
    body.append(
        "y = com.microsoft.MultiHeadAttention <num_heads: int = 2, scale: float = 0.25> "
        f"({query}, k, v{attention_bias})"
    )
    outputs = f"float[B, {seq}, {sizes[2]}] y"
    if leak:
        body.append("kk = Relu(k)")
        outputs += f", float[B, {seq}, {sizes[1]}] kk"
    mask_input = f", float[B, 1, 1, {seq}] m" if mask else ""
    newline = "\n"
    return f"""
        <ir_version: 8, opset_import: ["" : {opset}, "com.microsoft" : 1]>
        g (float[B, {seq}, 6] x{mask_input}) => ({outputs}) <
            {", ".join(inits)}
        > {{
            {newline.join(body)}
        }}
    """


def test_folds_projection_split_and_mha_into_attention() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(),
        {"qkv-matmul+split+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert attention.domain == "com.microsoft"
    assert attention.attributes.get_int("num_heads") == 2
    assert attention.attributes.get_float("scale") == pytest.approx(0.25)
    assert [v.name if v is not None else None for v in attention.inputs][:3] == ["x", "w", "b"]


def test_folds_a_query_scale_into_the_attention_scale() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(bias=False, mask=False, query_scale=True, seq="5"),
        {"qkv-matmul+split+mha->attention": 1},
        ["Attention"],
        trials=2,
    )
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert attention.attributes.get_float("scale") == pytest.approx(0.125)


def test_passes_a_narrower_value_as_qkv_hidden_sizes() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(sizes=(8, 8, 4)),
        {"qkv-matmul+split+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert list(attention.attributes.get_ints("qkv_hidden_sizes")) == [8, 8, 4]


def test_refuses_query_and_key_of_different_widths() -> None:
    assert_refuses(
        FusePackedAttentionPass,
        _model(sizes=(8, 4, 8), mask=False, seq="5"),
        "Q and K widths differ",
    )


def _attention(model: ir.Model) -> ir.Node:
    return next(n for n in model.graph if n.op_type == "Attention")


def test_folds_three_projections_into_attention_with_packed_weights() -> None:
    text = _model(separate=True)
    model = assert_rewrites(
        FusePackedAttentionPass,
        text,
        {"q,k,v-matmuls+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    attention = _attention(model)
    assert attention.domain == "com.microsoft"
    assert attention.inputs[0] is not None and attention.inputs[0].name == "x"
    original = {v.name: v.const_value.numpy() for v in load(text).graph.initializers.values()}
    weight, bias = (const_array(v) for v in attention.inputs[1:3])
    expected = np.concatenate([original["wq"], original["wk"], original["wv"]], axis=1)
    np.testing.assert_array_equal(weight, expected)
    np.testing.assert_array_equal(bias, np.concatenate([original[n] for n in ("bq", "bk", "bv")]))
    assert "qkv_hidden_sizes" not in attention.attributes


def test_folds_three_projections_without_biases() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(separate=True, biases=(False, False, False)),
        {"q,k,v-matmuls+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    # A zero bias, not none: ORT before 1.32 dereferences the bias input unchecked (SIGSEGV).
    attention = _attention(model)
    bias, weight = const_array(attention.inputs[2]), const_array(attention.inputs[1])
    assert bias is not None and weight is not None
    assert bias.shape == (weight.shape[1],) and not bias.any()

    # An Attention written without a bias (an older onnxopt's output) gets the zero bias.
    before = model.clone()
    biasless = _attention(before)
    biasless.replace_input_with(2, None)
    result = FusePackedAttentionPass()(before.clone())
    assert dict(result.stats) == {"attention-without-bias->zero-bias": 1}
    restored = const_array(_attention(result.model).inputs[2])
    assert restored is not None and restored.shape == bias.shape and not restored.any()
    assert validate(before, result.model).passed
    assert not FusePackedAttentionPass()(result.model).modified


def test_folds_whisper_like_projections_a_missing_key_bias_as_zeros() -> None:
    """Whisper: k_proj has no bias and the query is scaled after its projection."""
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(separate=True, biases=(True, False, True), query_scale=True),
        {"q,k,v-matmuls+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    attention = _attention(model)
    assert attention.attributes.get_float("scale") == pytest.approx(0.125)
    bias = const_array(attention.inputs[2])
    assert bias is not None and not bias[8:16].any() and bias[:8].all()


def test_folds_three_projections_without_a_mask_at_a_short_static_length() -> None:
    assert_rewrites(
        FusePackedAttentionPass,
        _model(separate=True, mask=False, seq="5"),
        {"q,k,v-matmuls+mha->attention": 1},
        ["Attention"],
        trials=2,
    )


def test_refuses_no_mask_at_a_long_sequence() -> None:
    assert_refuses(
        FusePackedAttentionPass,
        _model(separate=True, mask=False, seq="300"),
        "no mask and sequence length 300: MultiHeadAttention is faster",
    )


def test_refuses_no_mask_at_a_dynamic_sequence() -> None:
    assert_refuses(
        FusePackedAttentionPass,
        _model(separate=True, mask=False),
        "no mask and a dynamic sequence length: MultiHeadAttention is faster",
    )


def test_moves_a_whole_shape_read_only_for_a_leading_dim() -> None:
    assert_rewrites(
        FusePackedAttentionPass,
        _model(separate=True, query_length_at=1),
        {"q,k,v-matmuls+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Gather", "Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    # index -1 is the projected width, which x does not have: the query's read stays
    result = FusePackedAttentionPass(PassOptions(explain=True))(
        load(_model(separate=True, query_length_at=-1))
    )
    assert result.stats == {"shape-of-qkv-slice->shape-of-input": 1}  # the key's
    assert any(note.endswith("the Shape may read the projected axis") for note in result.notes)


def test_moves_sliced_shape_reads_below_opset_15() -> None:
    """Below opset 15 a one-dim read is ``Slice(Shape(q), [1], [2])`` (Shape has no start/end; what
    fuse-attention writes there, RoBERTa exported at opset 14): moved to x as a whole Shape."""
    model = assert_rewrites(
        FusePackedAttentionPass,
        _model(separate=True, opset=14),
        {"q,k,v-matmuls+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Slice", "Slice", "Concat", "Expand", "Attention"],
        trials=2,
    )
    assert all(not node.attributes for node in model.graph if node.op_type == "Shape")
    # [1:3] would read the query's projected width, which x does not have: the query's read stays
    result = FusePackedAttentionPass(PassOptions(explain=True))(
        load(_model(separate=True, opset=14, query_slice=(1, 3)))
    )
    assert result.stats == {"shape-of-qkv-slice->shape-of-input": 1}  # the key's
    assert any(note.endswith("the Shape may read the projected axis") for note in result.notes)


def test_refuses_a_slice_read_elsewhere() -> None:
    assert_refuses(FusePackedAttentionPass, _model(mask=False, leak=True), "other consumers")


def test_refuses_a_projection_read_elsewhere() -> None:
    assert_refuses(
        FusePackedAttentionPass, _model(separate=True, mask=False, leak=True), "other consumers"
    )


def test_leaves_target_onnx_alone() -> None:
    model = load(_model())
    result = FusePackedAttentionPass(PassOptions(target="onnx"))(model)
    assert not result.modified
    assert "Attention" not in op_types(model)


def test_fuses_without_shape_annotations_as_when_enabled_at_the_end() -> None:
    """``--enable`` runs the pass after drop-shape-annotations: MHA's contract gives the rank."""
    from onnxopt.passes.drop_shape_annotations import DropShapeAnnotationsPass

    model = load(_model())
    DropShapeAnnotationsPass()(model)
    result = FusePackedAttentionPass()(model)
    assert result.stats["qkv-matmul+split+mha->attention"] == 1
    assert op_types(model) == ["Shape", "Concat", "Expand", "Attention"]


def _gpt2_model(trans_b: int = 0, seq: str = "5") -> str:
    """GPT-2's Conv1D: the projection is Reshape(Gemm(Reshape(x, [-1, K]), W, b), [B, S, 3*D])."""
    weight = _floats("w", (24, 6) if trans_b else (6, 24), 0)
    return f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[B, {seq}, 6] x) => (float[B, {seq}, 8] y) <
            {weight}, {_floats("b", (24,), 1)}, int64[2] flat = {{-1, 6}},
            int64[1] width = {{24}}, int64[3] sizes = {{8, 8, 8}}
        > {{
            rows = Reshape(x, flat)
            p0 = Gemm <transB: int = {trans_b}> (rows, w, b)
            b0 = Shape <start: int = 0, end: int = 1> (x)
            s0 = Shape <start: int = 1, end: int = 2> (x)
            back = Concat <axis: int = 0> (b0, s0, width)
            p = Reshape(p0, back)
            q, k, v = Split <axis: int = 2> (p, sizes)
            y = com.microsoft.MultiHeadAttention <num_heads: int = 2> (q, k, v)
        }}
    """


def test_folds_gpt2_gemm_projection() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _gpt2_model(),
        {"qkv-matmul+split+mha->attention": 1},
        ["Shape", "Shape", "Concat", "Attention"],
        trials=2,
    )
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert attention.attributes.get_float("scale") == pytest.approx(0.5)  # 1/sqrt(4), made explicit


def test_refuses_a_transposed_gemm_weight() -> None:
    assert_refuses(FusePackedAttentionPass, _gpt2_model(trans_b=1), "scales or transposes")


def test_refuses_cross_attention() -> None:
    """K and V projected from another tensor (an encoder's output): Attention is self-attention."""
    text = _model(separate=True, mask=False, seq="5")
    text = text.replace("float[B, 5, 6] x)", "float[B, 5, 6] x, float[B, 5, 6] e)")
    text = text.replace("v0 = MatMul(x, wv)", "v0 = MatMul(e, wv)")
    assert_refuses(FusePackedAttentionPass, text, "projections of different tensors")


def _bloom_model(
    *,
    heads: int = 2,
    view_heads: int = 2,
    leak: bool = False,
    mask: bool = True,
    batch: str = "B",
    view_leading: str = "0, 0",
    allowzero: int = 0,
) -> str:
    """BLOOM's packed projection, Q/K/V interleaved per head: p [B, S, 24] viewed as
    [B, S, 2, 3, 4], part j of head h at columns h*12 + j*4 .. +4; the query merged back to
    [B, S, 8], K and V moved to [B, 2, S, 4]; the mask spelled out with S read off q and k
    (without a mask: S is 5). ``view_leading``: the view's B and S entries (folded to sizes
    when ``batch`` is static)."""
    seq = "S" if mask else "5"
    outputs = f"float[{batch}, {seq}, 8] y" + (f", float[{batch}, 2, {seq}, 4] kk" if leak else "")
    reads = """
            sq = Shape <start: int = 1, end: int = 2> (q)
            sk = Shape <start: int = 2, end: int = 3> (k)
            full = Concat <axis: int = 0> (ones, sq, sk)
            bias = Expand(m, full)"""
    return f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[{batch}, {seq}, 6] x{", float[B, 1, 1, S] m" if mask else ""}) => ({outputs}) <
            {_floats("w", (6, 24), 0)}, {_floats("b", (24,), 1)},
            int64[5] view = {{{view_leading}, {view_heads}, 3, 4}}, int64[3] merge = {{0, 0, -1}},
            int64 i0 = {{0}}, int64 i1 = {{1}}, int64 i2 = {{2}}, int64[2] ones = {{1, 1}}
        > {{
            p0 = MatMul(x, w)
            p = Add(p0, b)
            p5 = Reshape <allowzero: int = {allowzero}> (p, view)
            q4 = Gather <axis: int = 3> (p5, i0)
            k4 = Gather <axis: int = 3> (p5, i1)
            v4 = Gather <axis: int = 3> (p5, i2)
            k = Transpose <perm: ints = [0, 2, 1, 3]> (k4)
            v = Transpose <perm: ints = [0, 2, 1, 3]> (v4)
            q = Reshape(q4, merge)
            {reads if mask else ""}
            y = com.microsoft.MultiHeadAttention <num_heads: int = {heads}, scale: float = 0.5>
                (q, k, v{', "", "", bias' if mask else ""})
            {"kk = Relu(k)" if leak else ""}
        }}
    """


def test_folds_a_per_head_interleaved_projection_with_its_columns_reordered() -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _bloom_model(),
        {"interleaved-qkv-matmul+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    attention = _attention(model)
    weight, bias = const_array(attention.inputs[1]), const_array(attention.inputs[2])
    assert weight is not None and weight.shape == (6, 24) and bias is not None
    source = const_array(load(_bloom_model()).graph.initializers["w"])
    assert source is not None
    # Q of head 1 (columns 4..8 of the packed [Q | K | V]) was part 0 of head 1: columns 12..16
    np.testing.assert_array_equal(weight[:, 4:8], source[:, 12:16])
    # K of head 0 (columns 8..12) was part 1 of head 0: columns 4..8
    np.testing.assert_array_equal(weight[:, 8:12], source[:, 4:8])
    # the sequence length read off K ([B, H, S, d], axis 2) is read off x's axis 1
    shape = next(n for n in model.graph if n.op_type == "Shape")
    assert shape.inputs[0] is model.graph.inputs[0]
    assert (shape.attributes.get_int("start"), shape.attributes.get_int("end")) == (1, 2)


def test_folds_an_interleaved_projection_whose_view_sizes_were_folded() -> None:
    assert_rewrites(
        FusePackedAttentionPass,
        _bloom_model(mask=False, batch="2", view_leading="2, 5", allowzero=1),
        {"interleaved-qkv-matmul+mha->attention": 1},
        ["Attention"],
    )


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"view_heads": 3}, "the packed Q/K/V is viewed as [0, 0, 3, 3, 4], not [0, 0, 2, 3, d]"),
        (
            {"allowzero": 1},
            "the packed Q/K/V is viewed as [0, 0, 2, 3, 4]: dims 0, 1 are not its [B, S]",
        ),
        ({"leak": True}, "a Q/K/V projection has other consumers than the attention"),
    ],
)
def test_refuses_an_interleaved_projection(kwargs: dict[str, object], reason: str) -> None:
    text = _bloom_model(mask=False, **kwargs)  # type: ignore[arg-type]
    assert_refuses(FusePackedAttentionPass, text, reason)


_TAKE_PARTS = {
    # torch's unbind(0) as the exporters write it: Split + Squeeze, Slice + Squeeze, Gather
    "split": """
            t0, t1, t2 = Split <axis: int = 0> (parts, ones3)
            q4 = Squeeze(t0, zero1)
            k = Squeeze(t1, zero1)
            v = Squeeze(t2, zero1)""",
    "slice": """
            t0 = Slice(parts, zero1, one1, zero1)
            t1 = Slice(parts, one1, two1, zero1)
            t2 = Slice(parts, two1, three1, zero1)
            q4 = Squeeze(t0, zero1)
            k = Squeeze(t1, zero1)
            v = Squeeze(t2, zero1)""",
    "gather": """
            q4 = Gather <axis: int = 0> (parts, i0)
            k = Gather <axis: int = 0> (parts, i1)
            v = Gather <axis: int = 0> (parts, i2)""",
}


def _blocked_model(
    *,
    take: str = "split",
    perm: str = "2, 0, 3, 1, 4",
    leak: bool = False,
    order: str = "1, 2",
    seq: str = "S",
    view: str = "0, 0, 3, 2, 4",
    allowzero: int = 0,
) -> str:
    """A ViT's / hand-written packed projection: p [B, S, 24] viewed as [B, S, 3, 2, 4] and
    permuted to [3, B, 2, S, 4] (``qkv.reshape(B, S, 3, H, d).permute(2, 0, 3, 1, 4)``), the parts
    taken apart along axis 0 as ``take`` says; the query merged back to [B, S, 8], K and V
    [B, 2, S, 4] as they are; the mask spelled out with S read off q and k. ``order`` names the
    parts used as K and V."""
    key, value = (f"t{i}" for i in order.split(", "))
    body = _TAKE_PARTS[take]
    if order != "1, 2":
        body = body.replace("k = Squeeze(t1", f"k = Squeeze({key}").replace(
            "v = Squeeze(t2", f"v = Squeeze({value}"
        )
    outputs = f"float[B, {seq}, 8] y" + (f", float[3, B, 2, {seq}, 4] kk" if leak else "")
    return f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[B, {seq}, 6] x, float[B, 1, 1, {seq}] m) => ({outputs}) <
            {_floats("w", (6, 24), 0)}, {_floats("b", (24,), 1)},
            int64[5] view = {{{view}}}, int64[3] merge = {{0, 0, -1}},
            int64 i0 = {{0}}, int64 i1 = {{1}}, int64 i2 = {{2}}, int64[2] ones = {{1, 1}},
            int64[3] ones3 = {{1, 1, 1}}, int64[1] zero1 = {{0}}, int64[1] one1 = {{1}},
            int64[1] two1 = {{2}}, int64[1] three1 = {{3}}
        > {{
            p0 = MatMul(x, w)
            p = Add(p0, b)
            p5 = Reshape <allowzero: int = {allowzero}> (p, view)
            parts = Transpose <perm: ints = [{perm}]> (p5)
            {body}
            qm = Transpose <perm: ints = [0, 2, 1, 3]> (q4)
            q = Reshape(qm, merge)
            sq = Shape <start: int = 1, end: int = 2> (q)
            sk = Shape <start: int = 2, end: int = 3> (k)
            full = Concat <axis: int = 0> (ones, sq, sk)
            bias = Expand(m, full)
            y = com.microsoft.MultiHeadAttention <num_heads: int = 2, scale: float = 0.5>
                (q, k, v, "", "", bias)
            {"kk = Relu(parts)" if leak else ""}
        }}
    """


@pytest.mark.parametrize("take", ["split", "slice", "gather"])
def test_folds_a_blocked_projection_permuted_to_parts_first(take: str) -> None:
    model = assert_rewrites(
        FusePackedAttentionPass,
        _blocked_model(take=take),
        {"blocked-qkv-matmul+mha->attention": 1, "shape-of-qkv-slice->shape-of-input": 2},
        ["Shape", "Concat", "Expand", "Attention"],
        trials=2,
    )
    # the packed columns are [Q | K | V] already: the weight is passed as it is
    attention = _attention(model)
    assert attention.inputs[1] is model.graph.initializers["w"]
    shape = next(n for n in model.graph if n.op_type == "Shape")
    assert shape.inputs[0] is model.graph.inputs[0]
    assert (shape.attributes.get_int("start"), shape.attributes.get_int("end")) == (1, 2)


def test_folds_a_blocked_projection_viewed_with_an_inferred_batch() -> None:
    """torch.export at a static sequence (BLIP's vision tower): ``[-1, 5, 3, 2, 4]`` with
    allowzero=1, whose -1 is B since the rest is all of the packed [S, 3*H*d]."""
    text = _blocked_model(take="gather", seq="5", view="-1, 5, 3, 2, 4", allowzero=1)
    model = load(text)
    result = FusePackedAttentionPass(PassOptions(explain=True))(model.clone())
    assert result.stats["blocked-qkv-matmul+mha->attention"] == 1, result.notes
    assert validate(model, result.model).passed


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"leak": True}, "the [B, S, 3, H, d] view has other consumers"),
        ({"order": "2, 1"}, "K and V are not parts 1 and 2 of the query's [3, B, H, S, d] tensor"),
        (
            {"perm": "2, 0, 1, 3, 4"},
            "the Q/K/V parts are not of a [B, S, 3, H, d] view permuted (2, 0, 3, 1, 4)",
        ),
    ],
)
def test_refuses_a_blocked_projection(kwargs: dict[str, object], reason: str) -> None:
    # The mask's dim reads may still move to x (they read the same dims): only the fusion is refused.
    model = load(_blocked_model(**kwargs))  # type: ignore[arg-type]
    result = FusePackedAttentionPass(PassOptions(explain=True))(model)
    assert "Attention" not in op_types(result.model)
    assert any(reason in note for note in result.notes), result.notes
