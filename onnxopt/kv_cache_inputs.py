"""What ONNX Runtime's GroupQueryAttention says about the sizes of a model's KV-cache inputs.

onnxruntime-genai's model builder (and Microsoft's published ``*-onnx`` LLMs) feed each layer's
past key and value straight from graph inputs into ``com.microsoft.GroupQueryAttention``, which
imposes rules the inputs' declared dims do not spell out:

- a past key or value is ``[batch, kv_num_heads, past, head_size]``; the current builder names
  the last dim ``kv_cache_dim`` (one export for plain and quantized caches), older ones wrote
  the head size, and neither is a size validation could guess (Phi-3's 96);
- the attention mask covers ``total = past + new`` positions: GroupQueryAttention reads the total
  from the mask's shape (``Shape(mask)[1]``) and each row's length from its sum, and at
  ``new == total`` it is a prompt that ignores the past it is given;
- a step with a past and more than one new token runs at batch 1 only;
- a sliding-window layer built with ``sliding_window_cache`` keeps a ring buffer exactly one
  window long (Gemma 2's local layers, their past dim named apart).

:func:`kv_cache_facts` reads these off the graph, so that validation and ``bench`` run the
model at the steps a runtime does (a prompt, a decode step) instead of sizes that merely load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op

_PAST_KEY, _PAST_VALUE, _TOTAL = 3, 4, 6  # GroupQueryAttention's inputs
# Ops a shape read passes through on its way from Shape(mask) to GroupQueryAttention.
_SCALAR_VIEWS = ("Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity")
# Ops whose output 0 has input 0's shape, between a projection and the query it makes (the
# rotary the builder writes apart from the attention for DirectML, a per-head norm).
_SAME_SHAPE = (
    (MS_DOMAIN, "RotaryEmbedding"),
    (MS_DOMAIN, "SimplifiedLayerNormalization"),
    ("", "SimplifiedLayerNormalization"),
    ("", "LayerNormalization"),
    ("", "RMSNormalization"),
    ("", "Cast"),
    ("", "Identity"),
)


@dataclass(frozen=True)
class KVCacheFacts:
    """``fixed``: (input name, axis) -> the size GroupQueryAttention requires there (a past's
    head count and head size; a ring buffer's length). ``past`` and ``total``: the names of the past length and of the
    mask's length, which is past + the new tokens; None where the graph does not name them."""

    fixed: dict[tuple[str, int], int]
    past: str | None
    total: str | None


def _dim_name(value: ir.Value, axis: int) -> str | None:
    if value.shape is None or axis >= len(value.shape):
        return None
    dim = value.shape[axis]
    return dim.value if isinstance(dim, ir.SymbolicDim) else None


def _width(value: ir.Value | None, depth: int = 0) -> int | None:
    """The static last dim of ``value``: recorded, or read off the node making it (a weight
    product, a Reshape to a constant width, a Split along the last axis), through ops that keep
    their input's shape."""
    if value is None or depth > 6:
        return None
    shape = value.shape
    if shape is not None and len(shape) > 0 and isinstance(shape[-1], int):
        return shape[-1]
    node = value.producer()
    if node is None:
        return None
    if is_op(node, "MatMulNBits", MS_DOMAIN):
        n = node.attributes.get_int("N", 0)
        return n if n > 0 else None
    if is_op(node, "MatMul") and len(node.inputs) == 2 and node.inputs[1] is not None:
        weight = node.inputs[1].shape
        if weight is not None and len(weight) >= 2 and isinstance(weight[-1], int):
            return weight[-1]
    if is_op(node, "Reshape") and len(node.inputs) == 2:
        target = const_array(node.inputs[1])
        if target is not None and target.size > 0 and int(target.reshape(-1)[-1]) > 0:
            return int(target.reshape(-1)[-1])
        return None
    if is_op(node, "Split") and len(node.inputs) == 2:
        sizes = const_array(node.inputs[1])
        index = list(node.outputs).index(value)
        axis = node.attributes.get_int("axis", 0)
        rank = len(shape) if shape is not None else None
        last = axis == -1 or (rank is not None and axis == rank - 1)
        if last and sizes is not None and index < sizes.size:
            return int(sizes.reshape(-1)[index])
        return None
    if any(is_op(node, op, domain) for domain, op in _SAME_SHAPE):
        return _width(node.inputs[0] if node.inputs else None, depth + 1)
    if is_op(node, "Add") and len(node.inputs) == 2:
        constant = [const_array(v) is not None for v in node.inputs]
        if constant.count(True) == 1:
            return _width(node.inputs[constant.index(False)], depth + 1)
    return None


def _head_size(node: ir.Node) -> int | None:
    """GroupQueryAttention's head size: its query's width over its heads (Q, K and V packed in
    one query input when the key is absent)."""
    heads = node.attributes.get_int("num_heads", 0)
    kv_heads = node.attributes.get_int("kv_num_heads", 0)
    width = _width(node.inputs[0] if node.inputs else None)
    if heads <= 0 or kv_heads <= 0 or width is None:
        return None
    packed = len(node.inputs) < 2 or node.inputs[1] is None
    share = heads + 2 * kv_heads if packed else heads
    return width // share if width % share == 0 else None


def _length_source(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """(graph input, axis) when ``value`` is that input's dim read by Shape (and Gather)."""
    for _ in range(8):
        node = value.producer() if value is not None else None
        if node is None:
            return None
        if any(is_op(node, op) for op in _SCALAR_VIEWS):
            value = node.inputs[0]
            continue
        if is_op(node, "Gather") and len(node.inputs) == 2:
            index = const_array(node.inputs[1])
            shape = node.inputs[0].producer() if node.inputs[0] is not None else None
            if index is None or index.size != 1 or not is_op(shape, "Shape") or shape is None:
                return None
            start = shape.attributes.get_int("start", 0)
            source = shape.inputs[0]
            if source is None or not source.is_graph_input() or source.shape is None:
                return None
            axis = int(np.asarray(index).reshape(())) + start
            axis = axis + len(source.shape) if axis < 0 else axis
            return (source, axis) if 0 <= axis < len(source.shape) else None
        if is_op(node, "Shape"):
            source = node.inputs[0]
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", start + 1)
            if source is None or not source.is_graph_input() or end - start != 1:
                return None
            return (source, start) if start >= 0 else None
        return None
    return None


def kv_cache_facts(model: ir.Model) -> KVCacheFacts | None:
    """The facts of the main graph's GroupQueryAttentions that read a past from graph inputs;
    None when there are none (or they disagree about the past length's name)."""
    fixed: dict[tuple[str, int], int] = {}
    pasts: set[str | None] = set()
    totals: set[str | None] = set()
    for node in model.graph:
        if not is_op(node, "GroupQueryAttention", MS_DOMAIN) or len(node.inputs) <= _PAST_VALUE:
            continue
        caches = [node.inputs[i] for i in (_PAST_KEY, _PAST_VALUE)]
        if not all(
            v is not None and v.is_graph_input() and v.shape is not None and len(v.shape) == 4
            for v in caches
        ):
            continue
        head_size = _head_size(node)
        kv_heads = node.attributes.get_int("kv_num_heads", 0)
        window = node.attributes.get_int("local_window_size", -1)
        ring = node.attributes.get_int("sliding_window_cache", 0) == 1 and window > 0
        for cache in caches:
            assert cache is not None and cache.name is not None
            if kv_heads > 0:
                fixed[(cache.name, 1)] = kv_heads
            if head_size is not None:
                fixed[(cache.name, 3)] = head_size
            if ring:  # a sliding-window layer's cache: a ring buffer one window long
                fixed[(cache.name, 2)] = window
            else:
                pasts.add(_dim_name(cache, 2))
        length = node.inputs[_TOTAL] if len(node.inputs) > _TOTAL else None
        source = _length_source(length)
        totals.add(_dim_name(*source) if source is not None else None)
    if not fixed and not pasts:
        return None
    past = pasts.pop() if len(pasts) == 1 else None
    total = totals.pop() if len(totals) == 1 else None
    return KVCacheFacts(fixed, past, total if total != past else None)
