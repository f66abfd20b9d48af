"""Before IR version 4 every initializer had to be listed as a graph input; make them plain weights."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.passes.base import Pass, PassResult

# The first IR version in which an initializer need not be a graph input.
FIRST_IR_WITHOUT_INITIALIZER_INPUTS = 4


class RemoveInitializerInputsPass(Pass):
    """On an IR < 4 model, drop the initializers from the main graph's inputs and set IR version 4.

    Those IR versions required each initializer to be a graph input too, so the list says nothing
    about whether a caller means to feed it: they are the model's weights (constant folding already
    treats them as constants). As inputs they look overridable, which stops deduplication, common
    subexpression elimination and dead-code elimination from touching them. IR 4 changed nothing but
    that rule, so raising the version keeps the meaning. Models of IR 4 and later are left alone:
    there an initializer listed as an input was put there on purpose. Subgraph inputs are positional
    (Loop/Scan bodies) and are never touched.
    """

    name = "remove-initializer-inputs"
    summary = "IR < 4: initializers stop being graph inputs (IR version raised to 4)"

    def call(self, model: ir.Model) -> PassResult:
        if model.ir_version >= FIRST_IR_WITHOUT_INITIALIZER_INPUTS:
            return PassResult(model, modified=False)
        graph = model.graph
        kept = [value for value in graph.inputs if not value.is_initializer()]
        removed = len(graph.inputs) - len(kept)
        if not removed:
            return PassResult(model, modified=False)
        graph.inputs.clear()
        graph.inputs.extend(kept)
        model.ir_version = FIRST_IR_WITHOUT_INITIALIZER_INPUTS
        stats = Counter({"initializer inputs removed": removed})
        return PassResult(model, modified=True, stats=stats)
