"""Reorder the main graph's nodes to lower the peak of live activation memory."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.analysis.memory import (
    DEFAULT_SYMBOLIC_DIM,
    TensorSizes,
    build_dataflow,
    has_symbolic_inputs,
    tensor_sizes,
)
from onnxopt.analysis.schedule import Schedule, is_topological, schedule_for_memory
from onnxopt.ops import all_graphs
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.drop_shape_annotations import dropped_annotations
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions


def apply_order(graph: ir.Graph, order: list[ir.Node]) -> None:
    """Put ``graph``'s nodes in ``order`` (a permutation of them); connections are untouched."""
    graph.remove(order, safe=False)
    graph.extend(order)


_MAX_ROUNDS = 8
# Reorder only when nearly every tensor's size is known.
_MAX_UNKNOWN_FRACTION = 0.02
# ... and only for a gain worth moving nodes for: the planned arena (or, where it is the same, the
# peak) at least 1% lower. YOLO11's dynamic export, sized at 64 for its unnamed dims, moved 232 of
# its 323 nodes for 64 bytes, an order chosen for a size the model never runs at.
_MIN_GAIN = 0.01


def _pinned_inference(model: ir.Model, options: PassOptions) -> bool:
    """Whether ``tensor_sizes`` will infer shapes itself, on a copy with the inputs' dims bound
    (dims named by ``--dim`` or ``--input-shape``, or an input with a symbolic dim)."""
    return bool(options.dims or options.input_shapes) or has_symbolic_inputs(model)


def _worth_moving(schedule: Schedule) -> bool:
    if schedule.arena != schedule.original_arena:
        return schedule.original_arena - schedule.arena >= _MIN_GAIN * schedule.original_arena
    return schedule.original_peak - schedule.peak >= _MIN_GAIN * schedule.original_peak


class ReorderForMemoryPass(Pass):
    """Memory-aware list scheduling plus exact window search; keeps the order unless the peak drops
    (the planned arena, or where it is the same the peak, by 1% or more).

    Sizes come from inferred shapes with symbolic dims bound by ``--dim`` (unnamed ones: 64). The
    peak counts intermediates with view and in-place reuse (see ``onnxopt.analysis.memory``); the
    new order is a topological order of the same nodes, so results are unchanged.
    """

    name = "reorder-for-memory"
    summary = "reorder nodes to lower peak activation memory (never raises it)"

    def _sizes(self, model: ir.Model) -> TensorSizes:
        """Each tensor's size in bytes. For target ort, from shapes inferred afresh, as a second
        optimize run will see them: the file keeps no intermediate shapes (drop-shape-annotations),
        and an exporter's annotations can know dims inference cannot derive (wav2vec2's
        ``samples // 320 - 1``). Sized from those, this run and the next could choose different
        orders, and optimizing the output again would change it."""

        def measure() -> TensorSizes:
            return tensor_sizes(
                model,
                self.options.dims,
                input_shapes=self.options.input_shapes or None,
                default_dim=DEFAULT_SYMBOLIC_DIM,
            )

        if self.options.target != "ort":
            return measure()
        annotated = [
            v
            for graph in all_graphs(model)
            for v in (*graph.inputs, *graph.outputs, *(o for node in graph for o in node.outputs))
        ]
        saved = [(v, v.type, v.shape) for v in annotated]
        try:
            for value in dropped_annotations(model):
                value.type = None
                value.shape = None
            if not _pinned_inference(model, self.options):
                InferShapesPass(self.options)(model)
            # (else tensor_sizes infers on a copy with the inputs' dims bound: a run here too
            # would only be merged into that one)
            return measure()
        finally:
            for value, type_, shape in saved:
                value.type = type_
                value.shape = shape

    def call(self, model: ir.Model) -> PassResult:
        stats: Counter[str] = Counter()
        graph = model.graph
        if len(graph) < 3:
            return PassResult(model, modified=False)
        sizes = self._sizes(model)
        unknown = [
            str(value.name)
            for node in graph
            for value in node.outputs
            if value.name and sizes.get(value) is None
        ]
        outputs = sum(len(node.outputs) for node in graph)
        if len(unknown) > _MAX_UNKNOWN_FRACTION * outputs:
            # A schedule that counts many unknown tensors as empty can raise the real peak (e.g.
            # after contrib-op fusions, whose outputs onnx's shape inference cannot size).
            return PassResult(
                model,
                modified=False,
                notes=[
                    f"{self.name}: graph: {len(unknown)} tensor size(s) unknown "
                    f"(e.g. '{unknown[0]}'); order kept"
                ],
            )
        # Scheduling from a better order can find a better order still; repeat until it stops
        # improving, so that reordering the output again changes nothing (idempotence).
        initial = {id(node): index for index, node in enumerate(graph)}
        first_peak = first_arena = None
        peak = arena = 0
        applied = False
        for _ in range(_MAX_ROUNDS):
            flow = build_dataflow(graph, sizes, inplace=True)
            schedule = schedule_for_memory(flow, min_gain=_MIN_GAIN)
            if first_peak is None:
                first_peak, first_arena = schedule.original_peak, schedule.original_arena
            if not _worth_moving(schedule) or not is_topological(flow, schedule.order):
                break
            apply_order(graph, [flow.nodes[i] for i in schedule.order])
            peak, arena = schedule.peak, schedule.arena
            applied = True
        if not applied or first_peak is None or first_arena is None:
            return PassResult(
                model,
                modified=False,
                notes=[
                    f"{self.name}: graph: no order found with a lower peak than {first_peak} "
                    f"bytes (by {_MIN_GAIN:.0%} or more)"
                ],
            )
        stats["nodes moved"] = sum(
            1 for index, node in enumerate(graph) if initial[id(node)] != index
        )
        if peak != first_peak:
            stats["peak bytes saved"] = first_peak - peak
        if arena != first_arena:
            stats["arena bytes saved"] = first_arena - arena
        return PassResult(model, modified=True, stats=stats)
