from __future__ import annotations

import logging
from collections import Counter

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import _c_api_utils

from onnxopt.passes.base import Pass, PassResult

logger = logging.getLogger(__name__)


def _known_dims(shape: ir.Shape | None) -> int:
    if shape is None:
        return -1
    return sum(isinstance(d, int) for d in shape)


def pin_input_shapes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> int:
    """Replace the named graph inputs' dims with the user's; return how many inputs changed."""
    changed = 0
    by_name = {value.name: value for value in model.graph.inputs}
    for name, dims in shapes.items():
        value = by_name.get(name)
        if value is None:
            from onnxopt.errors import UsageError

            raise UsageError(
                f"--input-shape names '{name}', which is not a graph input ({', '.join(map(str, by_name))})"
            )
        if value.shape is not None and len(value.shape) != len(dims):
            from onnxopt.errors import UsageError

            raise UsageError(
                f"--input-shape {name}: rank {len(dims)} does not match the input's rank {len(value.shape)}"
            )
        new_shape = ir.Shape(list(dims))
        if value.shape != new_shape:
            value.shape = new_shape
            changed += 1
    return changed


class InferShapesPass(Pass):
    """Run ONNX shape inference (with data propagation) and record every value's type and shape.

    Symbolic dims stay symbolic; dims are pinned only for inputs named with ``--input-shape``.
    A value only gains information: a shape already known is never replaced by a less precise one.
    """

    name = "infer-shapes"
    summary = "ONNX shape/type inference with data propagation; symbolic dims stay symbolic"

    def call(self, model: ir.Model) -> PassResult:
        stats: Counter[str] = Counter()
        if self.options.input_shapes:
            pinned = pin_input_shapes(model, self.options.input_shapes)
            if pinned:
                stats["inputs pinned"] = pinned

        def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
            return onnx.shape_inference.infer_shapes(
                proto, check_type=False, strict_mode=False, data_prop=True
            )

        try:
            inferred = ir.serde.deserialize_model(_c_api_utils.call_onnx_api(infer, model))
        except (
            Exception
        ) as exc:  # inference is best-effort: a model it cannot handle stays as it is
            logger.warning(
                "shape inference failed, shapes left as they were: %s", str(exc).splitlines()[0]
            )
            return PassResult(
                model, modified=bool(stats), stats=stats, notes=[f"shape inference failed: {exc}"]
            )
        for original, result in zip(model.graphs(), inferred.graphs()):
            known = ir.convenience.create_value_mapping(result)
            for name, value in ir.convenience.create_value_mapping(original).items():
                other = known.get(name)
                if other is None:
                    continue
                if value.type is None and other.type is not None:
                    # The whole type: setting .dtype would make a sequence or optional a tensor.
                    value.type = other.type
                    stats["types inferred"] += 1
                if other.shape is not None and (
                    _known_dims(other.shape) > _known_dims(value.shape) or (value.shape is None)
                ):
                    value.shape = other.shape
                    stats["shapes inferred"] += 1
        return PassResult(model, modified=bool(stats), stats=stats)
