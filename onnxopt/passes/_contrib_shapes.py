"""Stand-ins that let ONNX shape inference see through the ONNX Runtime ops the fusions emit.

ONNX's shape inference does not know ``com.microsoft`` ops (nor ORT's SimplifiedLayerNormalization in
the default domain): every value after the first fused attention lost its shape, so a TorchScript
export's per-layer shape reads (``Shape(attention output)`` feeding the next Reshape) could not be
shared. Nor does it know the experimental ops of opsets 1-9 whose schemas onnx has since dropped
but ONNX Runtime still runs (tiny-YOLOv2 of the model zoo starts with ImageScaler): every value
after one had no type, so no Conv behind it could be fused. Before inference, each such node whose
first output provably has the shape of one of its inputs is swapped, in the throwaway proto handed
to inference only, for ``Identity`` of that input.
Only these cases are claimed (each is the op's documented output shape):

- element-wise or normalizing ops (RotaryEmbedding, BiasGelu, FastGelu, QuickGelu, Gelu,
  SkipLayerNormalization, (Skip)SimplifiedLayerNormalization; the dropped ImageScaler, Affine,
  ScaledTanh, ParametricSoftplus and ThresholdedRelu-1): output 0 has input 0's shape;
- MultiHeadAttention and GroupQueryAttention with separate 3-D query, key and value (K and V
  may be [B, N, T, d] for MultiHeadAttention): output 0 is [B, S, hidden of V] (GroupQueryAttention:
  of Q, so always the query's shape), the query's shape when V's hidden size (N*d) is Q's;
- packed Attention: [B, S, v] with v its third ``qkv_hidden_sizes`` or a third of the weight's
  width, the input's shape when v is the input's own width.

Where the recorded shapes do not tell the widths (a file read again: the optimized model keeps no
intermediate shapes), and for the ops below, a node is swapped for standard ops whose outputs have
its outputs' shapes (each, again, per the op's documented output shapes):

- MultiHeadAttention with separate 3-D query, key and value (opset 12 on): the Einsum
  ``bsi,btj->bsj`` of query and value, [B, S, hidden of V];
- packed Attention: MatMul of its input with a typed stand-in input [K, v] for V's part of its
  weight [K, 3v] (v its third ``qkv_hidden_sizes``, else a third of the weight's width);
- GroupQueryAttention on packed Q/K/V [B, S, (N + 2*Nk)*d] that a projection makes (MatMul or
  Gemm by a recorded weight, MatMulNBits, an Add of a recorded bias: GPT-2's and onnxruntime-genai's
  layers): MatMul with a typed stand-in input [(N + 2*Nk)*d, N*d];
- MatMulNBits (onnxruntime-genai's int4 weights): MatMul with a typed stand-in input [K, N];
- GatherBlockQuantized (its int4 tied embedding, Gemma 2's): Gather from a typed stand-in input
  of the data's shape, its quantized axis times 8 / ``bits`` for packed uint8 data, in the
  scales' type;
- FusedConv (fuse-conv-activation's Conv + Relu/Clip/Sigmoid...): Conv with its convolution
  attributes and its first three inputs (the activation keeps the shape; the optional sum input Z
  has the output's shape);
- FusedMatMul (fuse-matmul's Transpose + MatMul) without batch transposes: MatMul, or where it
  transposes an operand (opset 12 on), the Einsum of the same product;
- Skip(Simplified)LayerNormalization whose sum (output 3) is read as well as its output 0 (and
  nothing else): an Identity of input 0 for each.

Without these, every value after a network's first FusedConv (ResNet: 16 of 17 values), FusedMatMul
(YOLO11's attention: half of the graph) or fused attention (BERT: 17 of 36) lost its shape when the
optimized file was read again, and reorder-for-memory, which sizes tensors as a second run would,
kept the order.

An attention op's other outputs (its KV cache's presents) may be graph outputs that no node reads:
its first output is then read as above, and the presents keep the types the graph declares. Other
nodes with more than one output in use are left out, and so are all others: their outputs stay
unknown, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
import onnx.numpy_helper

from onnxopt.ops import MS_DOMAIN, ONNX_DOMAINS, may_hold_graphs

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

# The default-domain ops above: every other node a stand-in replaces is a com.microsoft one.
_STANDARD_DOMAIN_OPS = frozenset(op for domain, op in _SHAPE_OF_FIRST_INPUT if not domain)


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
        if node.op_type == "GroupQueryAttention":
            return query  # output: [B, S, num_heads * head_size], the query's own shape
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


def _einsum(inputs: list[str], output: str, equation: str) -> onnx.NodeProto:
    attribute = onnx.AttributeProto(
        name="equation", type=onnx.AttributeProto.STRING, s=equation.encode()
    )
    return onnx.NodeProto(op_type="Einsum", input=inputs, output=[output], attribute=[attribute])


_CONV_ATTRIBUTES = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})


def _narrowed(
    x: str, rows: int, width: int, dtype: int, output: str, inputs: list[onnx.ValueInfoProto]
) -> onnx.NodeProto:
    """``MatMul(x, P)``, P a typed stand-in input [rows, width] (appended to ``inputs``): x's
    shape with its last dim, ``rows``, made ``width``."""
    part = _typed_input(f"{output}__onnxopt_stand_in_weight", [rows, width], dtype, inputs)
    return onnx.NodeProto(op_type="MatMul", input=[x, part], output=[output])


def _typed_input(name: str, shape: list[int], dtype: int, inputs: list[onnx.ValueInfoProto]) -> str:
    """``name``, declared a graph input of ``shape`` and element type ``dtype`` (appended to
    ``inputs``)."""
    dims = [onnx.TensorShapeProto.Dimension(dim_value=d) for d in shape]
    tensor = onnx.TypeProto.Tensor(elem_type=dtype, shape=onnx.TensorShapeProto(dim=dims))
    inputs.append(onnx.ValueInfoProto(name=name, type=onnx.TypeProto(tensor_type=tensor)))
    return name


def _int64_constant(
    name: str, producers: dict[str, onnx.NodeProto], initializers: dict[str, onnx.TensorProto]
) -> onnx.TensorProto | None:
    """The int64 tensor an initializer or a Constant node holds under ``name``, or None."""
    tensor = initializers.get(name)
    node = producers.get(name)
    constant = node is not None and node.op_type == "Constant" and node.domain in ONNX_DOMAINS
    if tensor is None and node is not None and constant:
        tensor = next((a.t for a in node.attribute if a.name == "value"), None)
    return tensor if tensor is not None and tensor.data_type == onnx.TensorProto.INT64 else None


def _reshaped(
    name: str,
    producers: dict[str, onnx.NodeProto],
    typed: dict[str, tuple[list[int | None], int]],
    initializers: dict[str, onnx.TensorProto],
) -> tuple[list[int | None], int] | None:
    """(dims, element type) of a Reshape of a recorded tensor by a constant shape (the tied
    embedding's view of the output projection's packed weight), or None."""
    node = producers.get(name)
    if node is None or node.op_type != "Reshape" or node.domain not in ONNX_DOMAINS:
        return None
    source = typed.get(node.input[0]) if node.input else None
    target = (
        _int64_constant(node.input[1], producers, initializers) if len(node.input) == 2 else None
    )
    if source is None or target is None:
        return None
    dims = [int(d) for d in onnx.numpy_helper.to_array(target).reshape(-1)]
    allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
    known = [d for d in source[0] if d]
    if len(known) != len(source[0]) or dims.count(-1) > 1 or any(d < -1 for d in dims):
        return None
    if not allow_zero:
        if any(d == 0 and i >= len(known) for i, d in enumerate(dims)):
            return None
        dims = [known[i] if d == 0 else d for i, d in enumerate(dims)]
    size = math.prod(known)
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        if not rest or size % rest:
            return None
        dims[dims.index(-1)] = size // rest
    return (dims, source[1]) if math.prod(dims) == size else None  # type: ignore[return-value]


def _dequantized_gather(
    node: onnx.NodeProto,
    producers: dict[str, onnx.NodeProto],
    typed: dict[str, tuple[list[int | None], int]],
    initializers: dict[str, onnx.TensorProto],
    inputs: list[onnx.ValueInfoProto],
) -> onnx.NodeProto | None:
    """GatherBlockQuantized as ``Gather`` from a typed stand-in input: the data's shape (uint8 data
    packs 8 / ``bits`` values a byte along the quantized axis, so that dim is that many times
    the bytes': ORT's kernel gives 14 columns for 7 bytes of 4-bit values) in the scales' type.
    The data may be a constant Reshape of a recorded tensor."""
    operands = [*node.input, "", ""]
    data, scales = typed.get(operands[0]), typed.get(operands[2])
    if data is None:
        data = _reshaped(operands[0], producers, typed, initializers)
    if data is None or scales is None or not operands[1]:
        return None
    shape = data[0]
    attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    bits, rank = attrs.get("bits", 4), len(shape)
    gather, quantize = attrs.get("gather_axis", 0), attrs.get("quantize_axis", 1)
    if bits not in (2, 4, 8) or not -rank <= gather < rank or not -rank <= quantize < rank:
        return None
    dims = [d for d in shape if d]
    if len(dims) != rank:
        return None
    if data[1] == onnx.TensorProto.UINT8:
        dims[quantize % rank] *= 8 // bits
    table = _typed_input(f"{node.output[0]}__onnxopt_stand_in_table", dims, scales[1], inputs)
    gathered = onnx.NodeProto(op_type="Gather", input=[table, operands[1]], output=[node.output[0]])
    gathered.attribute.append(
        onnx.AttributeProto(name="axis", type=onnx.AttributeProto.INT, i=gather % rank)
    )
    return gathered


def _projected(
    name: str, producers: dict[str, onnx.NodeProto], typed: dict[str, tuple[list[int | None], int]]
) -> tuple[int, int] | None:
    """(last dim, element type) of a value a projection makes: MatMul or Gemm by a recorded
    [K, n] weight, MatMulNBits (its ``N``), or an Add of a recorded [n] bias (n > 1)."""
    node = producers.get(name)
    if node is None:
        return None
    operands = [*node.input, "", "", ""]
    if node.op_type in ("MatMul", "Gemm") and node.domain in ONNX_DOMAINS:
        transposed = any(a.name == "transB" and a.i for a in node.attribute)
        weight = typed.get(operands[1])
        if weight is None or len(weight[0]) != 2:
            return None
        width = weight[0][0] if transposed else weight[0][-1]  # (transB: Gemm's only)
        return (width, weight[1]) if width else None
    if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN and operands[2] in typed:
        width = next((a.i for a in node.attribute if a.name == "N"), 0)
        return (width, typed[operands[2]][1]) if width else None  # (the scales' type is A's)
    if node.op_type == "Add" and node.domain in ONNX_DOMAINS:
        for operand in operands[:2]:
            bias = typed.get(operand)
            if bias is not None and len(bias[0]) == 1 and (bias[0][0] or 0) > 1:
                return bias[0][0], bias[1]  # type: ignore[return-value]
    return None


def _standard_stand_in(
    node: onnx.NodeProto,
    opset: int,
    producers: dict[str, onnx.NodeProto],
    typed: dict[str, tuple[list[int | None], int]],
    initializers: dict[str, onnx.TensorProto],
    inputs: list[onnx.ValueInfoProto],
) -> onnx.NodeProto | None:
    """A standard op computing the output shape of a node of the module docstring's second list,
    or None; typed graph inputs it reads are appended to ``inputs``."""
    if node.domain != MS_DOMAIN or len([o for o in node.output if o]) != 1 or not node.output[0]:
        return None
    output = node.output[0]
    operands = [*node.input, "", "", ""]
    if node.op_type == "MultiHeadAttention" and all(operands[:3]) and opset >= 12:
        # [B, S, hidden of V] for a 3-D V (a 4-D V's rank makes the Einsum fail: unknown)
        return _einsum([operands[0], operands[2]], output, "bsi,btj->bsj")
    if node.op_type == "Attention" and operands[0] and operands[1]:
        weight = typed.get(operands[1])
        sizes = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), [])
        if weight is None or len(weight[0]) != 2 or (sizes and len(sizes) != 3):
            return None
        rows, columns = weight[0]
        width = sizes[2] if sizes else (columns // 3 if columns else None)
        # [B, S, width]: the input times a [K, width] stand-in for V's part of the weight
        return (
            _narrowed(operands[0], rows, width, weight[1], output, inputs)
            if rows and width
            else None
        )
    if node.op_type == "GroupQueryAttention" and operands[0] and not operands[1]:
        # Packed Q/K/V [B, S, (N + 2*Nk) * d] from a projection: the output is [B, S, N * d]
        packed = _projected(operands[0], producers, typed)
        heads = {a.name: a.i for a in node.attribute if a.name in ("num_heads", "kv_num_heads")}
        total = heads.get("num_heads", 0) + 2 * heads.get("kv_num_heads", 0)
        if packed is None or not total or packed[0] % total:
            return None
        width = packed[0] // total * heads["num_heads"]
        return _narrowed(operands[0], packed[0], width, packed[1], output, inputs)
    if node.op_type == "MatMulNBits" and operands[0] and operands[2] in typed:
        k_n = {a.name: a.i for a in node.attribute if a.name in ("K", "N")}
        if k_n.get("K", 0) > 0 and k_n.get("N", 0) > 0:  # (the scales' type is A's)
            return _narrowed(operands[0], k_n["K"], k_n["N"], typed[operands[2]][1], output, inputs)
    if node.op_type == "GatherBlockQuantized":
        return _dequantized_gather(node, producers, typed, initializers, inputs)
    if node.op_type == "FusedConv" and len(node.input) >= 2 and all(node.input[:2]):
        conv = onnx.NodeProto(op_type="Conv", input=list(node.input[:3]), output=[output])
        conv.attribute.extend(a for a in node.attribute if a.name in _CONV_ATTRIBUTES)
        return conv
    if node.op_type != "FusedMatMul" or len(node.input) != 2 or not all(node.input):
        return None
    flags = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    if flags.get("transBatchA", 0) or flags.get("transBatchB", 0):
        return None
    left = "ji" if flags.get("transA", 0) else "ij"
    right = "kj" if flags.get("transB", 0) else "jk"
    if left == "ij" and right == "jk":
        return onnx.NodeProto(op_type="MatMul", input=list(node.input), output=[output])
    if opset < 12:
        return None  # (no Einsum; a Transpose would need the operand's rank, not yet known)
    # The ranks are not known before inference: Einsum's batch dims ("...") broadcast as
    # MatMul's do, and ONNX leaves its shape unknown where the two ranks differ.
    return _einsum(list(node.input), output, f"...{left},...{right}->...ik")


def with_stand_ins(proto: onnx.ModelProto) -> int:
    """Swap, in ``proto``'s main graph, each node the module docstring lists for an Identity of
    the input whose shape its output has, or for the standard op computing its shape; return how
    many were swapped."""
    graph = proto.graph
    candidates = [
        index
        for index, node in enumerate(graph.node)
        if node.domain == MS_DOMAIN
        or (node.domain in ONNX_DOMAINS and node.op_type in _STANDARD_DOMAIN_OPS)
    ]
    if not candidates:
        return 0  # (most models before fusion: the tables below cost more than inference)
    infos = {i.name: i for i in (*graph.input, *graph.value_info, *graph.output)}
    opset = next((o.version for o in proto.opset_import if o.domain in ONNX_DOMAINS), 0)
    producers = {name: node for node in graph.node for name in node.output if name}
    initializers = {t.name: t for t in graph.initializer}
    typed: dict[str, tuple[list[int | None], int]] = {
        name: (list(t.dims), t.data_type) for name, t in initializers.items()
    }
    for name, info in infos.items():
        dims = _dims(info)
        if dims is not None:
            typed[name] = (dims, info.type.tensor_type.elem_type)
    inputs: list[onnx.ValueInfoProto] = []
    swapped = 0
    pairs: list[tuple[int, onnx.NodeProto]] = []  # the skip norms' second Identity, after its index
    read = _read_names(graph)
    typed_inputs: list[str] = []  # the stand-in inputs already in ``typed``
    for index in candidates:
        node = _attention_output_alone(graph.node[index], read)
        source = _same_shape_input(node, infos)
        stand_in = (
            onnx.NodeProto(op_type="Identity", input=[source], output=[node.output[0]])
            if source is not None
            else _skip_norm_stand_in(node, pairs, index)
            or _standard_stand_in(node, opset, producers, typed, initializers, inputs)
        )
        if stand_in is None:
            continue
        graph.node[index].CopyFrom(stand_in)
        swapped += 1
        for info in inputs[len(typed_inputs) :]:  # a later projection read through this stand-in
            typed[info.name] = (_dims(info) or [], info.type.tensor_type.elem_type)
            typed_inputs.append(info.name)
    if pairs:
        after = dict(pairs)
        rebuilt = onnx.GraphProto()  # (copies, made before the graph's own nodes are cleared)
        for index, node in enumerate(graph.node):
            rebuilt.node.append(node)
            if index in after:
                rebuilt.node.append(after[index])
        del graph.node[:]
        graph.node.extend(rebuilt.node)
    graph.input.extend(inputs)
    return swapped


def graph_protos(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes (only the nodes that
    ``may_hold_graphs`` are looked into)."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            if not may_hold_graphs(node.op_type, node.domain):
                continue
            for attr in node.attribute:
                if attr.HasField("g"):
                    stack.append(attr.g)
                stack.extend(attr.graphs)


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of ``graph`` or of a graph nested in it reads."""
    read: set[str] = set()
    for current in graph_protos(graph):
        for node in current.node:
            read.update(node.input)
    return read


_ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})


def _attention_output_alone(node: onnx.NodeProto, read: set[str]) -> onnx.NodeProto:
    """An attention node whose other outputs (the KV cache's presents) no node reads, as its
    first output alone: those are graph outputs, typed where the graph declares them, and
    onnxruntime-genai's layers write them. Any other node as it is."""
    if node.domain != MS_DOMAIN or node.op_type not in _ATTENTION_OPS or len(node.output) < 2:
        return node
    if not node.output[0] or any(name in read for name in node.output[1:] if name):
        return node
    alone = onnx.NodeProto()
    alone.CopyFrom(node)
    del alone.output[1:]
    return alone


_SKIP_NORMS = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})


def _skip_norm_stand_in(
    node: onnx.NodeProto, pairs: list[tuple[int, onnx.NodeProto]], index: int
) -> onnx.NodeProto | None:
    """A skip norm whose sum (output 3) is read too, as onnxruntime-genai's layers chain them:
    Identity of input 0 for output 0, and a second one for output 3 (appended to ``pairs``)."""
    outputs = [*node.output, "", "", "", ""]
    if (
        node.op_type not in _SKIP_NORMS
        or node.domain not in (MS_DOMAIN, "")
        or not node.input
        or not node.input[0]
        or not outputs[0]
        or not outputs[3]
        or outputs[1]
        or outputs[2]
        or any(outputs[4:])
    ):
        return None
    pairs.append(
        (index, onnx.NodeProto(op_type="Identity", input=[node.input[0]], output=[outputs[3]]))
    )
    return onnx.NodeProto(op_type="Identity", input=[node.input[0]], output=[outputs[0]])
