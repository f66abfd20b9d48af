"""Stand-ins that let ONNX shape inference see through the ONNX Runtime ops the fusions emit.

ONNX's shape inference does not know ``com.microsoft`` ops (nor ORT's SimplifiedLayerNormalization in
the default domain): every value after the first fused attention lost its shape, so a TorchScript
export's per-layer shape reads (``Shape(attention output)`` feeding the next Reshape) could not be
shared. Nor does it know the experimental ops of opsets 1-9 whose schemas onnx has since dropped
but ONNX Runtime still runs (tiny-YOLOv2 of the model zoo starts with ImageScaler): every value
after one had no type, so no Conv behind it could be fused. Before inference, each such node whose first output provably has the shape of one of its
inputs is swapped, in the throwaway proto handed to inference only, for ``Identity`` of that input.
Only these cases are claimed (each is the op's documented output shape):

- element-wise or normalizing ops (RotaryEmbedding, BiasGelu, FastGelu, QuickGelu, Gelu,
  SkipLayerNormalization, (Skip)SimplifiedLayerNormalization; the dropped ImageScaler, Affine,
  ScaledTanh, ParametricSoftplus and ThresholdedRelu-1): output 0 has input 0's shape;
- MultiHeadAttention and GroupQueryAttention with separate 3-D query, key and value (K and V
  may be [B, N, T, d] for MultiHeadAttention): output 0 is [B, S, hidden of V] (GroupQueryAttention:
  of Q), the query's shape when V's hidden size (N*d) is Q's;
- packed Attention: [B, S, v] with v its third ``qkv_hidden_sizes`` or a third of the weight's
  width, the input's shape when v is the input's own width.

Nodes with more than one output in use are left out, and so are all others: their outputs stay
unknown, as before.
"""

from __future__ import annotations

import onnx

from onnxopt.ops import MS_DOMAIN

_SHAPE_OF_FIRST_INPUT = {
    (MS_DOMAIN, "RotaryEmbedding"),
    (MS_DOMAIN, "BiasGelu"),
    (MS_DOMAIN, "FastGelu"),
    (MS_DOMAIN, "QuickGelu"),
    (MS_DOMAIN, "Gelu"),
    (MS_DOMAIN, "SkipLayerNormalization"),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"),
    (MS_DOMAIN, "SimplifiedLayerNormalization"),
    ("", "SimplifiedLayerNormalization"),
    ("", "SkipSimplifiedLayerNormalization"),
    ("", "ImageScaler"),
    ("", "Affine"),
    ("", "ScaledTanh"),
    ("", "ParametricSoftplus"),
    ("", "ThresholdedRelu"),
}


def _dims(info: onnx.ValueInfoProto | None) -> list[int | None] | None:
    if info is None or not info.type.HasField("tensor_type"):
        return None
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]


def _width(infos: dict[str, onnx.ValueInfoProto], name: str, rank: int) -> int | None:
    """The static last dim of a value of the given rank, if recorded."""
    dims = _dims(infos.get(name))
    return dims[-1] if dims is not None and len(dims) == rank else None


def _same_shape_input(node: onnx.NodeProto, infos: dict[str, onnx.ValueInfoProto]) -> str | None:
    """The input whose shape ``node``'s first output provably has, or None."""
    if len([o for o in node.output if o]) != 1 or not node.output or not node.output[0]:
        return None
    if not node.input or not node.input[0]:
        return None
    key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
    if key in _SHAPE_OF_FIRST_INPUT:
        return node.input[0]
    if node.domain != MS_DOMAIN:
        return None
    inputs = list(node.input) + [""] * 3
    if node.op_type in ("MultiHeadAttention", "GroupQueryAttention"):
        query, key_, value = inputs[0], inputs[1], inputs[2]
        if not key_ or not value:
            return None  # packed Q/K/V: the output width is not the query's
        width_q, width_v = _width(infos, query, 3), _width(infos, value, 3)
        heads_v = _dims(infos.get(value))
        if width_v is None and heads_v is not None and len(heads_v) == 4:
            # V as [B, N, T, dv]: the output is [B, S, N*dv]
            count, size = heads_v[1], heads_v[3]
            width_v = count * size if count and size else None
        if node.op_type == "GroupQueryAttention" and width_q is not None:
            return query  # output: [B, S, num_heads * head_size], head_size = width_q / num_heads
        return query if width_q is not None and width_q == width_v else None
    if node.op_type == "Attention":
        width_x = _width(infos, inputs[0], 3)
        sizes = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), [])
        if sizes:
            width_v = sizes[2] if len(sizes) == 3 else None
        else:
            weight = _dims(infos.get(inputs[1]))
            width_v = weight[1] // 3 if weight and len(weight) == 2 and weight[1] else None
        return inputs[0] if width_x is not None and width_x == width_v else None
    return None


def with_stand_ins(proto: onnx.ModelProto) -> int:
    """Swap, in ``proto``'s main graph, each node the module docstring lists for an Identity of
    the input whose shape its output has; return how many were swapped."""
    graph = proto.graph
    infos = {i.name: i for i in (*graph.input, *graph.value_info, *graph.output)}
    swapped = 0
    for index, node in enumerate(graph.node):
        source = _same_shape_input(node, infos)
        if source is None:
            continue
        stand_in = onnx.NodeProto(op_type="Identity", input=[source], output=[node.output[0]])
        graph.node[index].CopyFrom(stand_in)
        swapped += 1
    return swapped
