from __future__ import annotations

from collections import Counter

import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt.passes._counting import ModelCensus
from onnxopt.passes.base import Pass, PassResult

# Small tensors are compared byte for byte; larger ones by content hash (bounded memory).
_EXACT_LIMIT_ELEMENTS = 1024


class DeduplicateInitializersPass(Pass):
    """Point every use of an initializer at one copy when several hold identical dtype, shape and bytes."""

    name = "deduplicate-initializers"
    summary = "merge initializers with identical dtype, shape and contents"

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model).initializers
        ir_common.DeduplicateInitializersPass(size_limit=_EXACT_LIMIT_ELEMENTS)(model)
        ir_common.DeduplicateHashedInitializersPass()(model)
        merged = before - ModelCensus.of(model).initializers
        stats = Counter({"initializers merged": merged}) if merged > 0 else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
