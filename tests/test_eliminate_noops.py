from __future__ import annotations

import pytest

from onnxopt.passes.eliminate_noops import EliminateNoopsPass
from tests._pass_check import assert_refuses, assert_rewrites, load


def model(
    body: str, inputs: str = "float[2,3,4] x", outputs: str = "float[2,3,4] y", opset: int = 13
) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({inputs}) => ({outputs}) {body}'


# (id, model, stats, ops after, trials): every model ends in a Relu so the removed op's result is
# not a graph output (that case has its own tests below).
POSITIVE = [
    ("identity", model("{ i = Identity(x)\n y = Relu(i) }"), {"Identity removed": 1}, ["Relu"], 1),
    (
        "dropout-12",
        model("<float r = {0.5}> { d = Dropout(x, r)\n y = Relu(d) }", opset=12),
        {"Dropout removed": 1},
        ["Relu"],
        1,
    ),
    (
        "dropout-training-false",
        model("<float r = {0.5}, bool t = {0}> { d, m = Dropout(x, r, t)\n y = Relu(d) }"),
        {"Dropout removed": 1},
        ["Relu"],
        1,
    ),
    (
        "dropout-10-attr",
        model("{ d = Dropout <ratio = 0.3> (x)\n y = Relu(d) }", opset=10),
        {"Dropout removed": 1},
        ["Relu"],
        1,
    ),
    (
        "cast-same",
        model("{ c = Cast <to = 1> (x)\n y = Relu(c) }"),
        {"Cast removed": 1},
        ["Relu"],
        1,
    ),
    (
        "castlike-same",
        model("<float like = {1.0}> { c = CastLike(x, like)\n y = Relu(c) }", opset=15),
        {"CastLike removed": 1},
        ["Relu"],
        1,
    ),
    (
        "reshape-static",
        model("<int64[3] s = {2, 3, 4}> { r = Reshape(x, s)\n y = Relu(r) }"),
        {"Reshape removed": 1},
        ["Relu"],
        1,
    ),
    (
        "reshape-copy-dims-dynamic",
        model(
            "<int64[3] s = {0, 0, -1}> { r = Reshape(x, s)\n y = Relu(r) }",
            inputs="float[N,M,4] x",
            outputs="float[N,M,4] y",
        ),
        {"Reshape removed": 1},
        ["Relu"],
        2,
    ),
    (
        "reshape-shape-of-input",
        model(
            "{ s = Shape(x)\n r = Reshape(x, s)\n y = Relu(r) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
        ),
        {"Reshape removed": 1},
        ["Shape", "Relu"],
        2,
    ),
    (
        "transpose-identity",
        model("{ t = Transpose <perm = [0, 1, 2]> (x)\n y = Relu(t) }"),
        {"Transpose removed": 1},
        ["Relu"],
        1,
    ),
    (
        "expand-to-broadcastable",
        model(
            "<int64[2] s = {1, 4}> { e = Expand(x, s)\n y = Relu(e) }",
            inputs="float[N,3,4] x",
            outputs="float[N,3,4] y",
        ),
        {"Expand removed": 1},
        ["Relu"],
        2,
    ),
    (
        "pad-zero-input",
        model("<int64[6] p = {0, 0, 0, 0, 0, 0}> { q = Pad(x, p)\n y = Relu(q) }"),
        {"Pad removed": 1},
        ["Relu"],
        1,
    ),
    (
        "pad-zero-attr",
        model("{ q = Pad <pads = [0, 0, 0, 0, 0, 0]> (x)\n y = Relu(q) }", opset=10),
        {"Pad removed": 1},
        ["Relu"],
        1,
    ),
    (
        "slice-whole-dynamic",
        model(
            "<int64[2] st = {0, -100}, int64[2] en = {9223372036854775807, 4}, int64[2] ax = {0, -1}>"
            " { s = Slice(x, st, en, ax)\n y = Relu(s) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
        ),
        {"Slice removed": 1},
        ["Relu"],
        2,
    ),
    (
        "slice-whole-attr",
        model("{ s = Slice <starts = [0], ends = [1000], axes = [2]> (x)\n y = Relu(s) }", opset=9),
        {"Slice removed": 1},
        ["Relu"],
        1,
    ),
    (
        "concat-one",
        model("{ c = Concat <axis = 1> (x)\n y = Relu(c) }"),
        {"Concat removed": 1},
        ["Relu"],
        1,
    ),
    (
        # Phi-3: cat([q_rot, q[..., 16:]]) with the rotary over all 16 dims of each head
        "concat-beside-empty",
        model(
            "<int64[1] st = {4}, int64[1] en = {100}, int64[1] ax = {2}>"
            "{ e = Slice(x, st, en, ax)\n c = Concat <axis = -1> (x, e)\n y = Relu(c) }",
            inputs="float[N,3,4] x",
            outputs="float[N,3,4] y",
        ),
        {"Concat removed": 1},
        ["Slice", "Relu"],
        2,
    ),
    ("sum-one", model("{ c = Sum(x)\n y = Relu(c) }"), {"Sum removed": 1}, ["Relu"], 1),
    ("max-one", model("{ c = Max(x)\n y = Relu(c) }"), {"Max removed": 1}, ["Relu"], 1),
    (
        "tile-ones",
        model("<int64[3] r = {1, 1, 1}> { t = Tile(x, r)\n y = Relu(t) }"),
        {"Tile removed": 1},
        ["Relu"],
        1,
    ),
    (
        "reduce-size-one-axis",
        model(
            "{ r = ReduceMean <axes = [-1], keepdims = 1> (x)\n y = Relu(r) }",
            inputs="float[N,3,1] x",
            outputs="float[N,3,1] y",
        ),
        {"ReduceMean removed": 1},
        ["Relu"],
        2,
    ),
    (
        "reduce-noop-empty-axes",
        model("{ r = ReduceSum <noop_with_empty_axes = 1> (x)\n y = Relu(r) }"),
        {"ReduceSum removed": 1},
        ["Relu"],
        1,
    ),
    (
        "split-one",
        model("{ s = Split <axis = 1> (x)\n y = Relu(s) }"),
        {"Split removed": 1},
        ["Relu"],
        1,
    ),
    (
        "split-one-attr",
        model("{ s = Split <axis = 1, split = [3]> (x)\n y = Relu(s) }", opset=11),
        {"Split removed": 1},
        ["Relu"],
        1,
    ),
    (
        "flatten-2d",
        model(
            "{ f = Flatten <axis = 1> (x)\n y = Relu(f) }",
            inputs="float[N,5] x",
            outputs="float[N,5] y",
        ),
        {"Flatten removed": 1},
        ["Relu"],
        2,
    ),
    (
        "unsqueeze-squeeze-13",
        model("<int64[2] a = {0, -1}> { u = Unsqueeze(x, a)\n s = Squeeze(u, a)\n y = Relu(s) }"),
        {"Unsqueeze+Squeeze removed": 1},
        ["Relu"],
        1,
    ),
    (
        "unsqueeze-squeeze-11",
        model(
            "{ u = Unsqueeze <axes = [1]> (x)\n s = Squeeze <axes = [1]> (u)\n y = Relu(s) }",
            opset=11,
        ),
        {"Unsqueeze+Squeeze removed": 1},
        ["Relu"],
        1,
    ),
    (
        "squeeze-unsqueeze-no-axes",
        model(
            "<int64[2] a = {0, 2}> { s = Squeeze(x)\n u = Unsqueeze(s, a)\n y = Relu(u) }",
            inputs="float[1,3,1] x",
            outputs="float[1,3,1] y",
        ),
        {"Squeeze+Unsqueeze removed": 1},
        ["Relu"],
        1,
    ),
    (
        "add-zero-dynamic",
        model(
            "<float[4] z = {0.0, 0.0, 0.0, -0.0}> { a = Add(z, x)\n y = Relu(a) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
        ),
        {"Add 0 removed": 1},
        ["Relu"],
        2,
    ),
    (
        # baddbmm(torch.zeros(...), q, k): zeros of a shape computed at run time, which the
        # exporter recorded as the other operand's
        "add-expanded-zero",
        model(
            "<float z = {0.0}, int64[1] four = {4}, float[N,4] e, float[N,4] a> "
            "{ n = Shape<start=0, end=1>(x)\n s = Concat<axis=0>(n, four)\n "
            "e = Expand(z, s)\n a = Add(x, e)\n y = Relu(a) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
            opset=17,
        ),
        # the Expand goes too: Add broadcasts 0 against x, which has the target's dims
        {"Expand removed": 1, "Add 0 removed": 1},
        ["Shape", "Concat", "Relu"],
        2,
    ),
    (
        # softmax(x - x.amax(-1, keepdim=True)): the Softmax subtracts the row max itself
        "softmax-stabilizer",
        model(
            "<int64[1] last = {-1}> { m = ReduceMax<keepdims=1>(x, last)\n d = Sub(x, m)\n "
            "y = Softmax<axis=-1>(d) }",
            inputs="float[N,3,4] x",
            outputs="float[N,3,4] y",
            opset=18,
        ),
        {"Softmax stabilizer removed": 1},
        ["Softmax"],
        2,
    ),
    (
        "log-softmax-stabilizer-axis-attribute",
        model(
            "{ m = ReduceMax<axes=[1]>(x)\n d = Sub(x, m)\n y = LogSoftmax<axis=1>(d) }",
            opset=13,
        ),
        {"Softmax stabilizer removed": 1},
        ["LogSoftmax"],
        1,
    ),
    (
        # TensorFlow's stable_softmax (TF BART's scores + 1e-9 through tf2onnx)
        "softmax-shift",
        model(
            "<float eps = {1e-9}> { a = Add(x, eps)\n y = Softmax<axis=-1>(a) }",
            inputs="float[N,3,4] x",
            outputs="float[N,3,4] y",
        ),
        {"Softmax shift removed": 1},
        ["Softmax"],
        2,
    ),
    (
        "add-constant-of-shape-zero",
        model(
            "<float z = {0.0}, int64[1] four = {4}, float[N,4] e, float[N,4] a> "
            "{ n = Shape<start=0, end=1>(x)\n s = Concat<axis=0>(n, four)\n "
            "e = ConstantOfShape(s)\n a = Add(x, e)\n y = Relu(a) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
            opset=17,
        ),
        {"Add 0 removed": 1},
        ["Shape", "Concat", "ConstantOfShape", "Relu"],
        2,
    ),
    (
        "sub-zero",
        model("<float z = {0.0}> { a = Sub(x, z)\n y = Relu(a) }"),
        {"Sub 0 removed": 1},
        ["Relu"],
        1,
    ),
    (
        "mul-one-int",
        model(
            "<int64[1,1] one = {1}> { a = Mul(x, one)\n y = Abs(a) }",
            inputs="int64[3,4] x",
            outputs="int64[3,4] y",
        ),
        {"Mul 1 removed": 1},
        ["Abs"],
        1,
    ),
    (
        "div-one",
        model("<float[3,1] one = {1.0, 1.0, 1.0}> { a = Div(x, one)\n y = Relu(a) }"),
        {"Div 1 removed": 1},
        ["Relu"],
        1,
    ),
    (
        "where-true",
        model("<bool[4] c = {1, 1, 1, 1}, float o = {5.0}> { w = Where(c, x, o)\n y = Relu(w) }"),
        {"Where removed": 1},
        ["Relu"],
        1,
    ),
    (
        "chain",
        model(
            "{ i = Identity(x)\n t = Transpose <perm = [0, 1, 2]> (i)\n c = Cast <to = 1> (t)\n y = Relu(c) }"
        ),
        {"Identity removed": 1, "Transpose removed": 1, "Cast removed": 1},
        ["Relu"],
        1,
    ),
    (
        # TorchScript's masked_fill(mask.expand_as(scores)) and x + pos.expand_as(x): the Where
        # and the Add broadcast the unexpanded tensor against the same partner.
        "expand-as-partner",
        model(
            "<float f = {-9.0}> { s = Shape(x)\n e = Expand(m, s)\n w = Where(e, f, x)\n"
            " p = Expand(b, s)\n a = Add(p, x)\n y = Mul(a, w) }",
            inputs="float[N,3,4] x, bool[N,1,4] m, float[4] b",
            outputs="float[N,3,4] y",
        ),
        {"Expand removed": 2},
        ["Shape", "Where", "Add", "Mul"],
        2,
    ),
    (
        # the same, expanded to the shape of another tensor of the partner's shape (Swin-V2's
        # normalized key, once fold-shape-values shares the query's equal shape read)
        "expand-as-tensor-of-partner-shape",
        model(
            "{ s = Shape(z)\n e = Expand(m, s)\n y = Add(e, x) }",
            inputs="float[N,3,4] x, float[1,1,4] m, float[N,3,4] z",
            outputs="float[N,3,4] y",
        ),
        {"Expand removed": 1},
        ["Shape", "Add"],
        2,
    ),
    (
        # torch's dynamo x.std(-1): the variance, viewed [B, S, 1], broadcast_in_dim'd to dims
        # read off two inputs that carry B and S
        "expand-to-own-dims-read-elsewhere",
        model(
            "<int64[1] one = {1}> { b = Shape<start=0, end=1>(x)\n s = Shape<start=1, end=2>(m)\n"
            " t = Concat<axis=0>(b, s, one)\n e = Expand(v, t)\n y = Add(e, x) }",
            inputs="float[B,S,4] x, int64[B,S] m, float[B,S,1] v",
            outputs="float[B,S,4] y",
            opset=17,
        ),
        {"Expand removed": 1},
        ["Shape", "Shape", "Concat", "Add"],
        2,
    ),
    (
        # dynamo's F.normalize: the clamped norm expanded to [B, 4, 6], the batch read off x,
        # then divided into x, which has those dims
        "expand-to-partner-dims",
        model(
            "<int64[1] four = {4}, int64[1] six = {6}, float lo = {1e-12}> "
            "{ n = ReduceL2 <axes = [-1]> (x)\n c = Clip(n, lo)\n b = Shape<start=0, end=1>(x)\n"
            " t = Concat<axis=0>(b, four, six)\n e = Expand(c, t)\n y = Div(x, e) }",
            inputs="float[B,4,6] x",
            outputs="float[B,4,6] y",
            opset=17,
        ),
        {"Expand removed": 1},
        ["ReduceL2", "Clip", "Shape", "Concat", "Div"],
        2,
    ),
    (
        # jax2tf's expand of no dims
        "unsqueeze-of-no-axes",
        model("<int64[0] none = {}> { u = Unsqueeze(x, none)\n y = Relu(u) }"),
        {"Unsqueeze of no axes removed": 1},
        ["Relu"],
        1,
    ),
    (
        # jax2tf's einsum('...hqk,h->...hqk') of Flax's head mask of ones, ones first
        "matmul-by-ones-first",
        model(
            "<float[2,1,1] ones = {1.0, 1.0}> { p = MatMul(ones, x)\n y = Relu(p) }",
            inputs="float[2,1,N] x",
            outputs="float[2,1,N] y",
        ),
        {"MatMul by ones removed": 1},
        ["Relu"],
        2,
    ),
    (
        "matmul-by-ones-second",
        model(
            "<float[1,1] ones = {1.0}> { p = MatMul(x, ones)\n y = Relu(p) }",
            inputs="float[B,5,1] x",
            outputs="float[B,5,1] y",
        ),
        {"MatMul by ones removed": 1},
        ["Relu"],
        2,
    ),
]


@pytest.mark.parametrize(
    ("text", "stats", "ops", "trials"), [c[1:] for c in POSITIVE], ids=[c[0] for c in POSITIVE]
)
def test_removes_noop(text: str, stats: dict[str, int], ops: list[str], trials: int) -> None:
    assert_rewrites(EliminateNoopsPass, text, stats, ops, trials)


NEGATIVE = [
    (
        "concat-of-two-non-empty",
        model(
            "<int64[1] st = {2}, int64[1] en = {100}, int64[1] ax = {2}>"
            "{ e = Slice(x, st, en, ax)\n c = Concat <axis = 2> (x, e)\n y = Relu(c) }",
            outputs="float[2,3,6] y",
        ),
        "2 of them not provably empty",
    ),
    (
        "add-broadcast-enlarges",
        model(
            "<float[2,3,4] z = {" + ", ".join(["0.0"] * 24) + "}> { a = Add(x, z)\n y = Relu(a) }",
            inputs="float[3,4] x",
        ),
        "broadcasting would add dims",
    ),
    (
        "mul-broadcast-dim-enlarges",
        model(
            "<float[3] one = {1.0, 1.0, 1.0}> { a = Mul(x, one)\n y = Relu(a) }",
            inputs="float[2,1] x",
            outputs="float[2,3] y",
        ),
        "broadcasting changes the shape",
    ),
    (
        "add-symbolic-dim",
        model(
            "<float[3] z = {0.0, 0.0, 0.0}> { a = Add(x, z)\n y = Relu(a) }",
            inputs="float[2,N] x",
            outputs="float[2,3] y",
        ),
        "symbolic dim",
    ),
    (
        "add-unknown-shape",
        model(
            "<float[3] z = {0.0, 0.0, 0.0}> { r = Reshape(x, s)\n a = Add(r, z)\n y = Relu(a) }",
            inputs="float[6] x, int64[K] s",
            outputs="float y",
        ),
        "rank is unknown",
    ),
    (
        "add-expanded-zero-of-another-shape",
        model(
            "<float z = {0.0}, int64[1] four = {4}, float[M,4] e, float[K,4] a> "
            "{ n = Shape<start=0, end=1>(w)\n s = Concat<axis=0>(n, four)\n "
            "e = Expand(z, s)\n a = Add(x, e)\n y = Relu(a) }",
            inputs="float[N,4] x, float[M,4] w",
            outputs="float[K,4] y",
            opset=17,
        ),
        "expanded to a shape not provably the other operand's",
    ),
    (
        "stabilizer-over-another-axis",
        model("{ m = ReduceMax<axes=[1]>(x)\n d = Sub(x, m)\n y = Softmax<axis=-1>(d) }"),
        "not only by a Softmax over the reduced axis",
    ),
    (
        "stabilizer-read-elsewhere",
        model(
            "{ m = ReduceMax<axes=[2]>(x)\n d = Sub(x, m)\n s = Softmax<axis=-1>(d)\n "
            "y = Add(s, d) }"
        ),
        "read by Add",
    ),
    (
        "stabilizer-keepdims-0",
        model(
            "{ m = ReduceMax<axes=[2], keepdims=0>(x)\n u = Unsqueeze<axes=[2]>(m)\n "
            "d = Sub(x, u)\n y = Softmax<axis=-1>(d) }",
            opset=12,
        ),
        "does not subtract a ReduceMax of its own first operand",
    ),
    (
        "stabilizer-before-opset-13",
        model("{ m = ReduceMax<axes=[2]>(x)\n d = Sub(x, m)\n y = Softmax<axis=2>(d) }", opset=12),
        "before opset 13",
    ),
    (
        "softmax-shift-too-large",
        model("<float eps = {1e-3}> { a = Add(eps, x)\n y = Softmax<axis=-1>(a) }"),
        "magnitude 1e-06 or less",
    ),
    (
        "softmax-shift-read-elsewhere",
        model("<float eps = {1e-9}> { a = Add(x, eps)\n s = Softmax<axis=-1>(a)\n y = Add(s, a) }"),
        "read by something other than a Softmax",
    ),
    (
        "add-nonzero",
        model("<float z = {1.0}> { a = Add(x, z)\n y = Relu(a) }"),
        "no operand is a constant 0",
    ),
    (
        "sub-zero-on-left",
        model("<float z = {0.0}> { a = Sub(z, x)\n y = Relu(a) }"),
        "no operand is a constant 0",
    ),
    (
        "cast-changes-dtype",
        model("{ c = Cast <to = 11> (x)\n y = Relu(c) }", outputs="double[2,3,4] y"),
        "casts FLOAT to DOUBLE",
    ),
    (
        "dropout-training",
        model("<float r = {0.5}, bool t = {1}> { d, m = Dropout(x, r, t)\n y = Relu(d) }"),
        "training_mode is true",
    ),
    (
        "dropout-6-training",
        model("{ d = Dropout <is_test = 0> (x)\n y = Relu(d) }", opset=6),
        "is_test=0",
    ),
    (
        "dropout-mask-used",
        model("{ d, m = Dropout(x)\n y = Relu(d) }", outputs="float[2,3,4] y, bool[2,3,4] m"),
        "mask output is used",
    ),
    (
        "reshape-symbolic",
        model(
            "<int64[2] s = {2, 4}> { r = Reshape(x, s)\n y = Relu(r) }",
            inputs="float[N,4] x",
            outputs="float[2,4] y",
        ),
        "input dim is symbolic",
    ),
    (
        "reshape-changes",
        model(
            "<int64[3] s = {3, 2, 4}> { r = Reshape(x, s)\n y = Relu(r) }", outputs="float[3,2,4] y"
        ),
        "target dim 0 is 3 but the input has 2",
    ),
    (
        "transpose-real",
        model("{ t = Transpose <perm = [1, 0, 2]> (x)\n y = Relu(t) }", outputs="float[3,2,4] y"),
        "not the identity",
    ),
    (
        "expand-enlarges",
        model(
            "<int64[3] s = {2, 3, 4}> { e = Expand(x, s)\n y = Relu(e) }", inputs="float[1,3,4] x"
        ),
        "broadcasting changes the shape",
    ),
    (
        "expand-symbolic",
        model(
            "<int64[2] s = {3, 4}> { e = Expand(x, s)\n y = Relu(e) }",
            inputs="float[N,4] x",
            outputs="float[3,4] y",
        ),
        "symbolic dim",
    ),
    (
        "tile-repeats",
        model(
            "<int64[3] r = {1, 2, 1}> { t = Tile(x, r)\n y = Relu(t) }", outputs="float[2,6,4] y"
        ),
        "not all 1",
    ),
    (
        "reduce-keepdims-0",
        model(
            "{ r = ReduceMax <axes = [2], keepdims = 0> (x)\n y = Relu(r) }",
            inputs="float[2,3,1] x",
            outputs="float[2,3] y",
        ),
        "keepdims=0",
    ),
    (
        "reduce-symbolic-dim",
        model(
            "<int64[1] a = {1}> { r = ReduceSum(x, a)\n y = Relu(r) }",
            inputs="float[2,N] x",
            outputs="float[2,1] y",
        ),
        "not known to be 1",
    ),
    ("sum-two", model("{ c = Sum(x, x)\n y = Relu(c) }"), "it has 2 inputs"),
    (
        "pad-nonzero",
        model(
            "<int64[6] p = {0, 0, 1, 0, 0, 0}> { q = Pad(x, p)\n y = Relu(q) }",
            outputs="float[2,4,4] y",
        ),
        "not all zero",
    ),
    (
        "slice-partial",
        model(
            "<int64[1] st = {0}, int64[1] en = {3}, int64[1] ax = {2}> { s = Slice(x, st, en, ax)\n y = Relu(s) }",
            outputs="float[2,3,3] y",
        ),
        "ends at 3",
    ),
    (
        "slice-symbolic-end",
        model(
            "<int64[1] st = {0}, int64[1] en = {8}, int64[1] ax = {0}> { s = Slice(x, st, en, ax)\n y = Relu(s) }",
            inputs="float[N,4] x",
            outputs="float[N,4] y",
        ),
        "symbolic",
    ),
    (
        "flatten-3d",
        model("{ f = Flatten <axis = 1> (x)\n y = Relu(f) }", outputs="float[2,12] y"),
        "not known to be 2-D",
    ),
    (
        "squeeze-other-axes",
        model(
            "<int64[1] a = {0}, int64[1] b = {1}> { u = Unsqueeze(x, a)\n s = Squeeze(u, b)\n y = Relu(s) }",
            inputs="float[2,1,4] x",
            outputs="float[1,2,4] y",
        ),
        "differ",
    ),
    (
        "squeeze-all-symbolic",
        model(
            "<int64[1] a = {0}> { s = Squeeze(x)\n u = Unsqueeze(s, a)\n y = Relu(u) }",
            inputs="float[1,N] x",
            outputs="float[1,N] y",
        ),
        "not fully known",
    ),
    (
        "where-mixed",
        model("<bool[4] c = {1, 0, 1, 1}, float o = {5.0}> { w = Where(c, x, o)\n y = Relu(w) }"),
        "mixes true and false",
    ),
    (
        "where-other-branch-enlarges",
        model(
            "<bool c = {1}, float[2,3,4] o = {"
            + ", ".join(["1.0"] * 24)
            + "}> { w = Where(c, x, o)\n y = Relu(w) }",
            inputs="float[3,4] x",
        ),
        "the unused branch has rank 3 > 2",
    ),
    (
        "expand-as-other-tensor",
        model(
            "{ s = Shape(z)\n e = Expand(m, s)\n y = Add(e, x) }",
            inputs="float[3,4] x, float[1,1,4] m, float[2,3,4] z",
            outputs="float[2,3,4] y",
        ),
        "which Add does not also take",
    ),
    (
        "expand-as-read-by-relu",
        model(
            "{ s = Shape(x)\n e = Expand(m, s)\n a = Add(e, x)\n r = Relu(e)\n y = Add(a, r) }",
            inputs="float[2,3,4] x, float[1,1,4] m",
        ),
        "read by Relu",
    ),
    (
        "expand-as-part-of-shape",
        model(
            "{ s = Shape <start = 1> (x)\n e = Expand(m, s)\n y = Add(e, x) }",
            inputs="float[2,3,4] x, float[1,4] m",
        ),
        "not a constant",
    ),
    (
        # S read off m, whose dim 1 is another symbol: broadcasting may enlarge v
        "expand-to-dims-of-another-symbol",
        model(
            "<int64[1] one = {1}> { b = Shape<start=0, end=1>(x)\n s = Shape<start=1, end=2>(m)\n"
            " t = Concat<axis=0>(b, s, one)\n e = Expand(v, t)\n y = Add(e, x) }",
            inputs="float[B,S,4] x, int64[B,T] m, float[B,S,1] v",
            outputs="float[B,S,4] y",
            opset=17,
        ),
        "not a constant",
    ),
    (
        # the target's last dim is 6 and the partner's 1: the Expand makes the result wider
        "expand-to-dims-the-partner-lacks",
        model(
            "<int64[1] four = {4}, int64[1] six = {6}> { b = Shape<start=0, end=1>(x)\n"
            " t = Concat<axis=0>(b, four, six)\n e = Expand(v, t)\n y = Div(x, e) }",
            inputs="float[B,4,1] x, float[B,4,1] v",
            outputs="float[B,4,6] y",
            opset=17,
        ),
        "not a constant",
    ),
    (
        # a rank-2 v under a rank-3 target gains a dim
        "expand-to-own-dims-and-one-more",
        model(
            "<int64[1] one = {1}> { b = Shape<start=0, end=1>(x)\n s = Shape<start=1, end=2>(x)\n"
            " t = Concat<axis=0>(b, s, one)\n e = Expand(v, t)\n y = Add(e, x) }",
            inputs="float[B,S,4] x, float[S,1] v",
            outputs="float[B,S,4] y",
            opset=17,
        ),
        "not a constant",
    ),
]


NEGATIVE += [
    (
        "matmul-by-twos",
        model(
            "<float[2,1,1] twos = {2.0, 2.0}> { p = MatMul(twos, x)\n y = Relu(p) }",
            inputs="float[2,1,4] x",
            outputs="float[2,1,4] y",
        ),
        "the [..., 1, 1] constant is not all ones",
    ),
    (
        "matmul-by-ones-raises-the-rank",
        model(
            "<float[3,2,1,1] ones = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0}> { p = MatMul(ones, x)\n"
            " y = Relu(p) }",
            inputs="float[2,1,4] x",
            outputs="float[3,2,1,4] y",
        ),
        "broadcasting would add dims",
    ),
    (
        "matmul-by-ones-broadcasts-a-batch",
        model(
            "<float[2,1,1] ones = {1.0, 1.0}> { p = MatMul(ones, x)\n y = Relu(p) }",
            inputs="float[1,1,4] x",
            outputs="float[2,1,4] y",
        ),
        "broadcasting changes the shape",
    ),
]


@pytest.mark.parametrize(
    ("text", "reason"), [c[1:] for c in NEGATIVE], ids=[c[0] for c in NEGATIVE]
)
def test_keeps_op_that_is_not_a_noop(text: str, reason: str) -> None:
    assert_refuses(EliminateNoopsPass, text, reason)


def test_graph_output_identity_of_producer_keeps_output_name() -> None:
    text = model("{ r = Relu(x)\n y = Identity(r) }")
    optimized = assert_rewrites(EliminateNoopsPass, text, {"Identity removed": 1}, ["Relu"])
    assert [v.name for v in optimized.graph.outputs] == ["y"]


def test_graph_output_identity_of_graph_input_is_kept() -> None:
    assert_refuses(EliminateNoopsPass, model("{ y = Identity(x) }"), "replacement is a graph input")


def test_graph_output_identity_of_initializer_is_kept() -> None:
    text = model(
        "<float[2] w = {1.0, 2.0}> { y = Identity(w) }", inputs="float[2] x", outputs="float[2] y"
    )
    assert_refuses(EliminateNoopsPass, text, "replacement is a graph input, output or initializer")


def test_identity_between_two_graph_outputs_is_kept() -> None:
    text = model("{ r = Relu(x)\n y = Identity(r) }", outputs="float[2,3,4] r, float[2,3,4] y")
    assert_refuses(EliminateNoopsPass, text, "graph output")


def test_identity_returning_outer_value_from_branch_is_kept() -> None:
    text = model(
        "{ c = ReduceSum <keepdims = 0> (x)\n b = Greater(c, c)\n r = Relu(x)\n"
        " y = If(b) <then_branch = t () => (float[2,3,4] o1) { o1 = Identity(r) },"
        " else_branch = e () => (float[2,3,4] o2) { o2 = Neg(x) }> }"
    )
    assert_refuses(EliminateNoopsPass, text, "another scope")


def test_identity_inside_branch_is_removed() -> None:
    text = model(
        "{ c = ReduceSum <keepdims = 0> (x)\n b = Greater(c, c)\n"
        " y = If(b) <then_branch = t () => (float[2,3,4] o1) { i = Identity(x)\n o1 = Neg(i) },"
        " else_branch = e () => (float[2,3,4] o2) { o2 = Neg(x) }> }"
    )
    result = EliminateNoopsPass()(load(text))
    assert dict(result.stats) == {"Identity removed": 1}


def test_default_model_loses_its_noops_and_still_validates() -> None:
    import onnxopt

    # Without folding, which would forward the Identities of constants first.
    passes = ["infer-shapes", "eliminate-noops", "eliminate-dead-code"]
    result = onnxopt.optimize("models/default.onnx", passes=passes)
    assert result.validated
    totals = result.report.pass_totals()
    stats = {
        k: v
        for name, _, _, changes in totals
        if name == "eliminate-noops"
        for k, v in changes.items()
    }
    assert stats.get("Identity removed", 0) >= 1
    assert result.report.after.nodes < result.report.before.nodes


ALWAYS_TRUE = "And always-true removed"


def _bidirectional_mask(
    *,
    term: str = "t = GreaterOrEqual(q4, zero)",
    start: str = "zero",
    use: str = "bias = Where(both, keep_fill, masked)\n            y = Add(scores, bias)",
    scores: str = "float[B, 2, T, T] scores",
    out: str = "float[B, 2, T, T] y",
) -> str:
    """transformers' bidirectional padding mask, ``(q_idx >= 0) & mask[b, kv_idx]`` ([1, 1, T, 1]
    and [B, 1, 1, T]), turned additive and added to the [B, H, T, T] scores."""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({scores}, bool[B, T] keep) => ({out}) <
            int64 zero = {{0}}, int64 one = {{1}}, int64 minus_one = {{-1}},
            int64[3] q_axes = {{0, 1, 3}}, int64[2] k_axes = {{1, 2}},
            float keep_fill = {{0}}, float masked = {{-3.4e38}}, int64[1] one_1 = {{1}}
        > {{
            s = Shape(keep)
            n = Gather(s, one)
            q = Range({start}, n, one)
            q4 = Unsqueeze(q, q_axes)
            {term}
            k4 = Unsqueeze(keep, k_axes)
            both = And(t, k4)
            {use}
        }}
    """


_MASK_OPS = ["Shape", "Gather", "Range", "Unsqueeze", "GreaterOrEqual", "Unsqueeze"]


@pytest.mark.parametrize(
    ("variant", "ops"),
    [
        ({}, [*_MASK_OPS, "Where", "Add"]),
        ({"term": "t = Greater(q4, minus_one)"}, [*_MASK_OPS[:4], "Greater", "Unsqueeze", "Where", "Add"]),
        ({"term": "t = LessOrEqual(zero, q4)"}, [*_MASK_OPS[:4], "LessOrEqual", "Unsqueeze", "Where", "Add"]),
        # TorchScript's expand of the mask to [B, 1, T, T] before it turns additive
        (
            {
                "use": "b1 = Shape <start = 0, end = 1> (keep)\n            t1 = Shape <start = 1> (keep)\n"
                "            target = Concat <axis = 0> (b1, one_1, t1, t1)\n"
                "            e = Expand(both, target)\n"
                "            bias = Where(e, keep_fill, masked)\n            y = Add(scores, bias)"
            },
            [*_MASK_OPS, "Shape", "Shape", "Concat", "Expand", "Where", "Add"],
        ),
    ],
)  # fmt: skip
def test_an_and_with_an_always_true_ordering_is_its_other_operand(
    variant: dict[str, str], ops: list[str]
) -> None:
    assert_rewrites(EliminateNoopsPass, _bidirectional_mask(**variant), {ALWAYS_TRUE: 1}, ops, 2)


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        # the [B, 1, T, T] mask is the output: without the And it would be [B, 1, 1, T]
        ({"use": "y = Where(both, keep_fill, masked)", "out": "float[B, 1, T, T] y"}, "graph output"),
        # the scores' query length is another dim: the Add would not give T back
        (
            {"scores": "float[B, 2, Q, T] scores", "out": "float[B, 2, Q, T] y"},
            "graph output",
        ),
        # a reader that does not broadcast
        (
            {"use": "bias = Where(both, keep_fill, masked)\n            y = Softmax(bias)", "out": "float[B, 1, T, T] y"},
            "reaches Softmax",
        ),
    ],
)  # fmt: skip
def test_an_and_whose_true_operand_shapes_the_result_stays(
    variant: dict[str, str], reason: str
) -> None:
    assert_refuses(EliminateNoopsPass, _bidirectional_mask(**variant), reason)


@pytest.mark.parametrize(
    "variant",
    [
        {"term": "t = GreaterOrEqual(q4, one)"},  # position 0 is not >= 1
        {"term": "t = Greater(q4, zero)"},  # position 0 is not > 0
        {"start": "minus_one"},  # counting from -1
        {"term": "t = LessOrEqual(q4, zero)"},  # the count has no upper bound
    ],
)
def test_an_and_with_an_ordering_not_always_true_stays(variant: dict[str, str]) -> None:
    result = EliminateNoopsPass()(load(_bidirectional_mask(**variant)))
    assert ALWAYS_TRUE not in result.stats


def test_an_and_with_a_mask_of_ones_made_at_run_time_is_its_other_operand() -> None:
    """A decoder given no attention mask makes one of ones (``torch.ones(B, T)``, a
    ConstantOfShape cast to bool): its And with the causal [1, 1, T, T] mask is the causal mask,
    which the expand to [B, 1, T, T] after it broadcasts back (TorchScript's BART decoder)."""
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 2, T, T] scores, int64[B, T] ids) => (float[B, 2, T, T] y) <
            int64 zero = {0}, int64 one = {1}, int64[3] q_axes = {0, 1, 3},
            int64[3] k_axes = {0, 1, 2}, int64[2] mask_axes = {1, 2}, int64[1] one_1 = {1},
            float keep_fill = {0}, float masked = {-3.4e38}
        > {
            s = Shape(ids)
            n = Gather(s, one)
            q = Range(zero, n, one)
            q4 = Unsqueeze(q, q_axes)
            k4 = Unsqueeze(q, k_axes)
            causal = LessOrEqual(k4, q4)
            ones = ConstantOfShape <value = float[1] {1.0}> (s)
            keep = Cast <to = 9> (ones)
            keep4 = Unsqueeze(keep, mask_axes)
            both = And(causal, keep4)
            b1 = Shape <start = 0, end = 1> (ids)
            t1 = Shape <start = 1> (ids)
            target = Concat <axis = 0> (b1, one_1, t1, t1)
            e = Expand(both, target)
            bias = Where(e, keep_fill, masked)
            y = Add(scores, bias)
        }
    """
    rewritten = assert_rewrites(
        EliminateNoopsPass, text, {ALWAYS_TRUE: 1},
        ["Shape", "Gather", "Range", "Unsqueeze", "Unsqueeze", "LessOrEqual", "ConstantOfShape",
         "Cast", "Unsqueeze", "Shape", "Shape", "Concat", "Expand", "Where", "Add"],
        2,
    )  # fmt: skip
    expand = next(node for node in rewritten.graph if node.op_type == "Expand")
    assert expand.inputs[0].name == "causal"  # type: ignore[union-attr]
    zeros = text.replace("float[1] {1.0}", "float[1] {0.0}")  # a mask of zeros is no such thing
    assert ALWAYS_TRUE not in EliminateNoopsPass()(load(zeros)).stats
