"""A spelled-out stable softmax, ``exp(x - max) / sum(exp(x - max))``, merged into one Softmax.

The forms are jax's (``jax.nn.softmax`` through jax2tf and tf2onnx: statistics reduced with
keepdims=0, viewed back by a Reshape, the max floored with -inf), as Flax attention and Google's
magika are converted, and a hand-written one with keepdims=1.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxopt.passes.merge_consecutive_ops import MergeConsecutiveOpsPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests._pass_check import assert_refuses, assert_rewrites, load, op_types
from tests.test_eliminate_noops import model

RULE = "exp(x-max)/sum->Softmax"
# jax's keepdims=0 sum viewed back is first made a keepdims=1 sum by its own rule
KEEP = "Reshape∘Reduce(keepdims=0)->Reduce(keepdims=1)"

# jax's softmax of attention scores [B, 4, S, S] over the last axis, as tf2onnx writes it.
JAX = (
    "<int64[1] axis = {3}, int64[4] back = {0, 4, 0, 1}, float floor = {-inf}> {\n"
    " m = ReduceMax<axes = [3], keepdims = 0>(x)\n f = Max(floor, m)\n fm = Reshape(f, back)\n"
    " d = Sub(x, fm)\n e = Exp(d)\n s = ReduceSum<keepdims = 0>(e, axis)\n"
    " sv = Reshape(s, back)\n y = Div(e, sv) }"
)
JAX_IO = {"inputs": "float[B,4,S,S] x", "outputs": "float[B,4,S,S] y"}

# magika's classifier head: [B, C] logits, the statistics viewed back with [-1, 1].
MAGIKA = (
    "<int64[1] axis = {1}, int64[2] back = {-1, 1}, float floor = {-inf}> {\n"
    " m = ReduceMax<axes = [1], keepdims = 0>(x)\n f = Max(floor, m)\n fm = Reshape(f, back)\n"
    " d = Sub(x, fm)\n e = Exp(d)\n s = ReduceSum<keepdims = 0>(e, axis)\n"
    " sv = Reshape(s, back)\n y = Div(e, sv) }"
)

# A hand-written stable softmax over a middle axis, keepdims=1.
KEPT = (
    "<int64[1] axis = {1}> {\n m = ReduceMax<axes = [1]>(x)\n d = Sub(x, m)\n e = Exp(d)\n"
    " s = ReduceSum(e, axis)\n y = Div(e, s) }"
)


@pytest.mark.parametrize(
    ("text", "axis", "trials", "stats"),
    [
        (model(JAX, **JAX_IO, opset=17), 3, 2, {KEEP: 1, RULE: 1}),
        (
            model(MAGIKA, inputs="float[B,7] x", outputs="float[B,7] y", opset=17),
            1,
            2,
            {KEEP: 1, RULE: 1},
        ),
        (model(KEPT, opset=13), 1, 1, {RULE: 1}),
    ],
    ids=["jax-attention", "magika-head", "keepdims-middle-axis"],
)
def test_stable_softmax_becomes_one_softmax(
    text: str, axis: int, trials: int, stats: dict[str, int]
) -> None:
    optimized = assert_rewrites(MergeConsecutiveOpsPass, text, stats, ["Softmax"], trials)
    (softmax,) = list(optimized.graph)
    assert softmax.attributes.get_int("axis") == axis


def test_softmax_of_large_scores_and_masked_rows_matches() -> None:
    """Scores in the hundreds (exp would overflow without the max), a row of -inf (NaN in both)
    and a row holding one finite score among -inf (one-hot in both)."""
    original = load(model(JAX, **JAX_IO, opset=17))
    result = MergeConsecutiveOpsPass()(original.clone())
    scores = np.random.default_rng(0).uniform(-300, 300, size=(2, 4, 5, 5)).astype(np.float32)
    scores[0, 1, 2] = -np.inf
    scores[1, 3, 4] = -np.inf
    scores[1, 3, 4, 2] = 7.0
    report = validate(original, result.model, inputs=[{"x": scores}])
    assert report.passed, report


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("back = {0, 4, 0, 1}", "back = {0, 0, 4, 1}", "does not provably put back the reduced"),
        ("axis = {3}", "axis = {2}", "the divisor is not the exponentials' row sum"),
        ("float floor = {-inf}", "float floor = {0}", "does not subtract the row max"),
        (" d = Sub(x, fm)", " d = Sub(x, x)", "does not subtract the row max"),
        (
            " y = Div(e, sv) }",
            " y = Div(e, sv)\n z = Relu(e) }",
            "the Exp result is also read outside the softmax",
        ),
    ],
    ids=["view-moves-dims", "sum-over-another-axis", "floor-not-inf", "no-max", "exp-shared"],
)
def test_what_is_not_provably_softmax_is_left(old: str, new: str, reason: str) -> None:
    outputs = "float[B,4,S,S] y" + (", float[B,4,S,S] z" if "z = Relu" in new else "")
    body = JAX.replace(old, new)
    assert body != JAX
    text = model(body, inputs=JAX_IO["inputs"], outputs=outputs, opset=17)
    # The keepdims=0 sum may still become a keepdims=1 one (its own rule); no Softmax is made.
    result = MergeConsecutiveOpsPass(PassOptions(explain=True))(load(text))
    assert set(result.stats) <= {KEEP}, result.stats
    assert "Softmax" not in op_types(result.model)
    assert any(reason in note for note in result.notes), result.notes


def test_before_opset_13_only_the_last_axis() -> None:
    text = model(KEPT.replace("axis = {1}", "axis = {1}"), opset=12)
    assert_refuses(MergeConsecutiveOpsPass, text, "before opset 13 Softmax normalizes")
