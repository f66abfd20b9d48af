from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common as ir_common

from onnxopt import io
from onnxopt.ops import all_graphs
from onnxopt.passes._counting import ModelCensus
from onnxopt.passes.base import Pass, PassResult

# Small tensors are compared byte for byte by onnx-ir's pass; larger ones here, by streamed hash.
_EXACT_LIMIT_ELEMENTS = 1024
# Bytes read from each end of a tensor to split a dtype+shape group before any full hash: trained
# (or randomly initialized) weights of the same shape already differ there, so most groups end here.
_SAMPLE_BYTES = 4096


def _sample(tensor: ir.TensorProtocol) -> bytes:
    """The first and last ``_SAMPLE_BYTES`` of the tensor's bytes, read without copying the rest."""
    if isinstance(tensor, ir.ExternalTensor) and tensor.length is not None:
        offset, length = tensor.offset or 0, tensor.length
        with open(tensor.path, "rb") as f:
            f.seek(offset)
            head = f.read(min(_SAMPLE_BYTES, length))
            f.seek(offset + max(length - _SAMPLE_BYTES, 0))
            return head + f.read(min(_SAMPLE_BYTES, length))
    if isinstance(tensor, ir.Tensor) and tensor.dtype.bitwidth % 8 == 0:
        flat = np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8)
        return flat[:_SAMPLE_BYTES].tobytes() + flat[-_SAMPLE_BYTES:].tobytes()
    data = tensor.tobytes()
    return data[:_SAMPLE_BYTES] + data[-_SAMPLE_BYTES:]


def _digest(tensor: ir.TensorProtocol) -> bytes:
    digest = hashlib.sha256()
    for piece in io.tensor_bytes(tensor)[1]:
        digest.update(piece)
    return digest.digest()


def _same_bytes(a: ir.TensorProtocol, b: ir.TensorProtocol) -> bool:
    """Confirm a hash match byte for byte, piece by piece (bounded memory)."""
    left: bytes | memoryview = b""
    right: bytes | memoryview = b""
    stream_a, stream_b = io.tensor_bytes(a)[1], io.tensor_bytes(b)[1]
    while True:
        if not left:
            left = next(stream_a, b"")
        if not right:
            right = next(stream_b, b"")
        if not left or not right:
            return not left and not right
        size = min(len(left), len(right))
        if left[:size] != right[:size]:
            return False
        left, right = left[size:], right[size:]


def _merge_large(model: ir.Model) -> int:
    """Merge equal initializers above the exact-compare size, one graph at a time, in graph order."""
    merged = 0
    for graph in all_graphs(model):
        interface = {id(v) for v in (*graph.inputs, *graph.outputs)}
        groups: dict[tuple[object, tuple[object, ...]], list[ir.Value]] = {}
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or id(value) in interface or tensor.size <= _EXACT_LIMIT_ELEMENTS:
                continue
            groups.setdefault((tensor.dtype, tuple(tensor.shape)), []).append(value)
        subgroups: list[list[ir.Value]] = []
        for candidates in groups.values():
            if len(candidates) < 2:
                continue  # nothing to compare with: no need to read the bytes at all
            by_sample: dict[bytes, list[ir.Value]] = {}
            for value in candidates:
                assert value.const_value is not None
                by_sample.setdefault(_sample(value.const_value), []).append(value)
            subgroups.extend(group for group in by_sample.values() if len(group) > 1)
        for candidates in subgroups:
            kept: dict[bytes, list[ir.Value]] = {}
            for value in candidates:
                assert value.const_value is not None
                key = _digest(value.const_value)
                twin = next(
                    (
                        k
                        for k in kept.get(key, [])
                        if k.const_value is not None
                        and _same_bytes(k.const_value, value.const_value)
                    ),
                    None,
                )
                if twin is None:
                    kept.setdefault(key, []).append(value)
                    continue
                ir.convenience.replace_all_uses_with(value, twin)
                assert value.name is not None
                del graph.initializers[value.name]
                merged += 1
    return merged


class DeduplicateInitializersPass(Pass):
    """Point every use of an initializer at one copy when several hold identical dtype, shape and bytes.

    Only tensors that share dtype and shape with another are read, first 8 KiB of each (both
    ends); only those that also share those bytes are hashed in full, in 16 MiB pieces straight
    from their external-data file, so memory stays bounded on big models.
    """

    name = "deduplicate-initializers"
    summary = "merge initializers with identical dtype, shape and contents"
    # Two initializers are equal by their tensors, whoever reads them.
    reads_producers_only = True

    def call(self, model: ir.Model) -> PassResult:
        before = ModelCensus.of(model).initializers
        ir_common.DeduplicateInitializersPass(size_limit=_EXACT_LIMIT_ELEMENTS)(model)
        _merge_large(model)
        merged = before - ModelCensus.of(model).initializers
        stats = Counter({"initializers merged": merged}) if merged > 0 else Counter()
        return PassResult(model, modified=bool(stats), stats=stats)
