"""Inline the model's local functions (ONNX Runtime does the same when it loads the model)."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir
from onnx_ir.passes.common import InlinePass

from onnxopt.passes.base import Pass, PassResult

# A local function named like a standard or contrib op may stand for the op ORT has a kernel for.
_RUNTIME_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc")

STAT_INLINED = "functions inlined"
STAT_KEPT_DOMAIN = "function calls kept: standard or contrib domain"
STAT_KEPT_OPSET = "function calls kept: opset differs from the model's"


class InlineFunctionsPass(Pass):
    """Replace each call of a model-local function by the function's body, then drop the function.

    Exporters write modules as local functions (``torch.onnx.export(export_modules_as_functions=
    ...)``, onnxscript models); every rewrite here sees only the main graph, so a model made of
    function calls was left as it was, Conv + BatchNormalization unfused inside the functions.
    ORT inlines them at load anyway, so the file runs the same. Functions are kept when their
    domain is one ORT has kernels for (the call may run the kernel, not the body) or when they
    import an opset version the model does not (inlining would change the ops' meaning).
    """

    name = "inline-functions"
    summary = (
        "inline model-local functions (as ONNX Runtime does at load), so rewrites see their bodies"
    )

    def call(self, model: ir.Model) -> PassResult:
        if not model.functions:
            return PassResult(model, modified=False)
        stats: Counter[str] = Counter()

        def inlinable(function: ir.Function) -> bool:
            if function.domain in _RUNTIME_DOMAINS:
                stats[STAT_KEPT_DOMAIN] += 1
                return False
            imports = model.opset_imports
            if any(imports.get(d, v) != v for d, v in function.opset_imports.items()):
                stats[STAT_KEPT_OPSET] += 1
                return False
            return True

        defined = len(model.functions)
        result = InlinePass(criteria=inlinable)(model)
        if defined > len(model.functions):
            stats[STAT_INLINED] = defined - len(model.functions)
        return PassResult(model, modified=result.modified, stats=stats)
