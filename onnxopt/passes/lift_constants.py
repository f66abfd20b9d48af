"""Turn Constant nodes into initializers (fewer nodes; the same bytes in the file)."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt.passes._counting import ModelCensus
from onnxopt.passes.base import Pass, PassResult


class LiftConstantsPass(Pass):
    """Replace each Constant node by an initializer of its graph holding the same tensor.

    A Constant whose output is a graph output stays (an initializer cannot take its place without
    renaming the output). Subgraph constants become subgraph initializers, so outer scopes are unchanged.
    """

    name = "lift-constants"
    summary = "turn Constant nodes into initializers (graph-output constants kept)"

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model).nodes
        ir_common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
        lifted = before - ModelCensus.of(model).nodes
        stats = Counter({"constants lifted": lifted}) if lifted > 0 else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
