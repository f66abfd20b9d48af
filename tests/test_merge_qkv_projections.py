"""MergeQkvProjectionsPass: sibling MatMuls with constant weights -> one MatMul (+ Add) + Split."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

from onnxopt.passes.merge_qkv_projections import MergeQkvProjectionsPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate


def _tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> str:
    values = ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))))
    return f"float[{', '.join(map(str, shape))}] {name} = {{{values}}}"


def _model(*, biases: bool = True, feed_weight: bool = False, opset: int = 17) -> ir.Model:
    rng = np.random.default_rng(0)
    inits = [
        _tensor("wq", (6, 4), rng),
        _tensor("wk", (6, 4), rng),
        _tensor("bq", (4,), rng),
        _tensor("bk", (4,), rng),
    ]
    if not feed_weight:
        inits.append(_tensor("wv", (6, 2), rng))
    inits.append(_tensor("bv", (2,), rng))
    extra = ", float[6, 2] wv" if feed_weight else ""
    add = "Add" if biases else "Sub"  # Sub: not a bias the pass may merge
    text = f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[B, S, 6] x{extra}) => (float[B, S, 4] q, float[B, S, 4] y, float[B, S, 2] v) <
            {", ".join(inits)}
        > {{
            q0 = MatMul(x, wq)
            q = Add(q0, bq)
            early = Relu(q)
            k0 = MatMul(x, wk)
            k = {add}(k0, bk)
            y = Add(early, k)
            v0 = MatMul(x, wv)
            v = Add(bv, v0)
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    return ir.serde.deserialize_model(proto)


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(batch).standard_normal((batch, seq, 6)).astype(np.float32)}


def test_merges_three_projections_with_biases() -> None:
    model = _model()
    merged = model.clone()
    result = MergeQkvProjectionsPass()(merged)
    assert result.stats == {"matmuls->merged-matmul": 1}
    types = [n.op_type for n in merged.graph]
    assert types.count("MatMul") == 1 and types.count("Split") == 1
    assert types.index("Split") < types.index("Relu")  # placed before the first user
    weight = next(n for n in merged.graph if n.op_type == "MatMul").inputs[1]
    assert weight is not None and weight.is_initializer() and weight.shape == ir.Shape([6, 10])
    report = validate(model, merged, inputs=[_feeds(1, 1), _feeds(3, 5)])
    assert report.passed, report
    assert not MergeQkvProjectionsPass()(merged).modified


def test_merges_matmuls_only_when_not_every_projection_has_a_bias() -> None:
    model = _model(biases=False, opset=11)
    merged = model.clone()
    result = MergeQkvProjectionsPass()(merged)
    assert result.stats == {"matmuls->merged-matmul": 1}
    split = next(n for n in merged.graph if n.op_type == "Split")
    assert list(split.attributes.get_ints("split")) == [4, 4, 2]
    assert validate(model, merged, inputs=[_feeds(2, 3)]).passed


def test_weight_fed_at_run_time_is_not_merged() -> None:
    model = _model(feed_weight=True)
    result = MergeQkvProjectionsPass()(model)
    assert result.stats == {"matmuls->merged-matmul": 1}  # only q and k remain constant
    assert [n.op_type for n in model.graph].count("MatMul") == 2


def test_lone_projections_are_not_explained_as_candidates() -> None:
    model = _model(feed_weight=True)
    MergeQkvProjectionsPass()(model)
    result = MergeQkvProjectionsPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == []
