"""For ONNX Runtime, leave intermediate shapes to the runtime instead of storing them in the file."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite.driver import iter_graphs

# Domains whose ops ORT (and onnx) can infer types for.
_ORT_KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def dropped_annotations(model: ir.Model) -> list[ir.Value]:
    """The annotated values whose type and shape target ort leaves out of the file: intermediate
    outputs of ops ORT can infer (a custom op's output types may exist nowhere else)."""
    values: list[ir.Value] = []
    for graph in iter_graphs(model):
        interface = {id(v) for v in (*graph.inputs, *graph.outputs)}
        for node in graph:
            if node.domain not in _ORT_KNOWN_DOMAINS:
                continue
            values.extend(
                value
                for value in node.outputs
                if id(value) not in interface
                and (value.type is not None or value.shape is not None)
            )
    return values


class DropShapeAnnotationsPass(Pass):
    """Target ort: clear the type and shape of intermediate values (the file's value_info).

    Graph inputs, outputs and initializers keep theirs. ORT infers intermediate shapes itself when
    it loads the model; stored shapes add nothing there except that they let its ENABLE_ALL
    optimizer fuse Add + LayerNormalization into SkipLayerNormalization on TorchScript exports,
    a kernel measured 3-4x slower than the pair it replaces on ORT's CPU provider (README,
    "Shape annotations"). Target onnx keeps every annotation for other runtimes and tools.
    Runs last at O2/O3, after every pass that reads shapes.
    """

    name = "drop-shape-annotations"
    summary = "target ort: drop intermediate value_info (ORT infers it; stored shapes trigger slow SkipLayerNorm)"

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        cleared = 0
        for value in dropped_annotations(model):
            value.type = None
            value.shape = None
            cleared += 1
        stats = Counter({"shapes dropped": cleared}) if cleared else Counter()
        return PassResult(model, modified=bool(cleared), stats=stats)
