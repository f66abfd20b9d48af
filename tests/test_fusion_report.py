from __future__ import annotations

from onnxopt.api import TARGET_METADATA_KEY, optimize
from tests.fusion_util import parse, rng_array

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 6, 6] y, float[N, 4, 8, 8] z) {
    c = Conv <kernel_shape = [3, 3]> (x, w)
    y = BatchNormalization (c, s, b, m, v)
    d = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, w)
    z = BatchNormalization (d, s, b, m, v)
}
"""


def test_explain_reports_candidates_and_fused_per_rule() -> None:
    params = {
        "s": rng_array(4),
        "b": rng_array(4),
        "m": rng_array(4),
        "v": rng_array(4, positive=True),
    }
    model = parse(MODEL, w=rng_array(4, 3, 3, 3), **params)
    result = optimize(model, explain=True, target="onnx")
    assert result.validated
    # The shared weight blocks both folds: two candidates, none fused, each with its reason.
    assert result.report.fusion_counts() == [("conv+bn->conv", 2, 0)]
    assert any("shared with 1 other node" in note for note in result.report.explain_notes())
    assert result.model.metadata_props[TARGET_METADATA_KEY] == "onnx"
    assert result.report.to_json()["fusions"][0]["rule"] == "conv+bn->conv"
