from __future__ import annotations

from graphs import assert_numerically_equal, parse_model

from onnxopt import optimize
from onnxopt.io import to_proto
from onnxopt.passes.base import FixedPoint
from onnxopt.passes.drop_shape_annotations import DropShapeAnnotationsPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.levels import build_steps
from onnxopt.passes.options import PassOptions

TEXT = """
<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
    a = Relu(x)
    b = Sigmoid(a)
    y = Add(a, b)
    c = custom.Thing(x)
    z = Abs(x)
}
"""


def _value_info_names(model) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.name for v in to_proto(model).graph.value_info]


def test_intermediate_shapes_are_dropped_for_ort_only() -> None:
    model = parse_model(TEXT)
    InferShapesPass()(model)
    assert {"a", "b"} <= set(_value_info_names(model))
    onnx_target = DropShapeAnnotationsPass(PassOptions(target="onnx"))(model)
    assert not onnx_target.modified
    result = DropShapeAnnotationsPass(PassOptions(target="ort"))(model)
    assert result.stats == {"shapes dropped": 2}
    names = _value_info_names(result.model)
    assert "a" not in names and "b" not in names
    assert result.model.graph.outputs[0].shape is not None  # the interface keeps its types
    assert not DropShapeAnnotationsPass()(result.model).modified


def test_default_level_drops_annotations_for_ort_and_keeps_them_for_onnx() -> None:
    model = parse_model(TEXT.replace(', "custom" : 1', "").replace("    c = custom.Thing(x)\n", ""))
    result = optimize(model)
    assert result.report.passes_run[-1] == "drop-shape-annotations"
    assert _value_info_names(result.model) == []
    assert_numerically_equal(model, result.model)
    portable = optimize(model, target="onnx")
    assert {"a", "b"} <= set(_value_info_names(portable.model))


def test_enable_puts_a_pass_where_all_passes_orders_it() -> None:
    # Before the memory reorder and the annotation drop (opt-in fusions still see shapes); the
    # Q/K/V merge right after attention fusion, as the pipeline once ran it.
    model = parse_model(TEXT.replace(', "custom" : 1', "").replace("    c = custom.Thing(x)\n", ""))
    result = optimize(model, enable=["fuse-skip-layer-norm", "merge-qkv-projections"])
    ran = list(result.report.passes_run)
    assert ran[-5:] == [
        "fuse-skip-layer-norm",
        "keep-layer-norm-unfused",  # finds nothing left once the pairs are fused
        "localize-initializers",
        "reorder-for-memory",
        "drop-shape-annotations",
    ]
    # (after the shape-value folding, dead-code sweep and shape inference that follow attention
    # fusion, before packed attention): read off the steps, since a run of a pass that found
    # nothing in the same model before is left out of what ran
    steps = build_steps(enable=["fuse-skip-layer-norm", "merge-qkv-projections"])
    order = [
        p.name for step in steps for p in (step.passes if isinstance(step, FixedPoint) else [step])
    ]
    at = order.index("merge-qkv-projections")
    assert order[at - 4 : at + 2] == [
        "fuse-attention",
        "fold-shape-values",
        "eliminate-dead-code",
        "infer-shapes",
        "merge-qkv-projections",
        "fuse-packed-attention",
    ]
