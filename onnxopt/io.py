"""Loading and saving models: the only module that reads or writes ONNX protobuf files.

Loading is defensive: the file is sniffed, parsed without touching external data, then every
external-data reference is checked to stay inside the model's folder *before* anything is read, and
the graph structure (names, order, cycles) is checked so that passes can assume a well-formed graph.
External tensors are memory-mapped by onnx-ir, never copied into the process.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mmap
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxopt.errors import ModelLoadError, ModelSaveError, UnsafeModelError, UsageError
from onnxopt.guard import leave_no_trace, temp_folder
from onnxopt.ops import all_graphs, nested_graphs

logger = logging.getLogger(__name__)

PROTOBUF_LIMIT = 2**31 - 1
# Leave headroom below the hard protobuf limit for the graph itself.
EXTERNAL_DATA_AUTO_THRESHOLD = 1_800_000_000
MAX_OPSET = onnx.defs.onnx_opset_version()
MAX_IR_VERSION = onnx.IR_VERSION

_MAGIC = [
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.pth checkpoint?)"),
    (b"\x89HDF", "an HDF5 file (a Keras model?)"),
    (b"\x89PNG", "a PNG image"),
    (b"GGUF", "a GGUF file"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x7fELF", "an executable"),
]


@dataclass(frozen=True)
class LoadedModel:
    model: ir.Model
    path: Path | None
    file_bytes: int
    external_files: tuple[Path, ...]
    renamed_nodes: int = 0  # duplicate node names made unique (ORT refuses to load duplicates)
    repairs: tuple[str, ...] = ()  # what loading fixed in the file, in words (report warnings)
    trimmed_nodes: int = (
        0  # nodes whose empty trailing outputs were dropped (ORT may crash on them)
    )

    @property
    def runs_as_is(self) -> bool:
        """ONNX Runtime can be handed the file itself (else: a save of this load)."""
        return not self.renamed_nodes and not self.trimmed_nodes


def _sniff(path: Path, head: bytes) -> None:
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise ModelLoadError(f"{path}: this is {what}, not an ONNX model")
    if head[4:8] == b"ORTM":  # the flatbuffer file identifier of ONNX Runtime's own format
        raise ModelLoadError(
            f"{path}: this is an ORT format model (.ort), which only ONNX Runtime reads; "
            "optimize the .onnx file it was converted from"
        )
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        raise ModelLoadError(
            f"{path}: this is a Python pickle, not an ONNX model (pickles are never loaded)"
        )
    if head.lstrip()[:1] in (b"{", b"<"):
        raise ModelLoadError(f"{path}: this is a text file (JSON/XML?), not a binary ONNX model")


def _read_proto(path: Path) -> onnx.ModelProto:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"{path}: is a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{path}: is not a regular file")
    if st.st_size == 0:
        raise ModelLoadError(f"{path}: file is empty")
    if st.st_size > PROTOBUF_LIMIT:
        raise ModelLoadError(
            f"{path}: {st.st_size} bytes is over the 2 GiB protobuf limit; weights must be stored as external data"
        )
    try:
        with path.open("rb") as f:
            head = f.read(16)
            f.seek(0)
            data = f.read()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror})") from None
    _sniff(path, head)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as exc:
        if "MaxDepth" in str(exc):
            raise ModelLoadError(
                f"{path}: protobuf messages are nested too deeply (subgraphs within subgraphs?); not loaded"
            ) from None
        raise ModelLoadError(
            f"{path}: not a valid ONNX protobuf (truncated, corrupted or too deeply nested)"
        ) from None
    except RecursionError:
        raise ModelLoadError(f"{path}: protobuf nesting is too deep") from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{path}: no graph in this protobuf (is it an ONNX model?)")
    return proto


def _check_versions(where: str, proto: onnx.ModelProto) -> None:
    if proto.ir_version <= 0:
        raise ModelLoadError(f"{where}: missing or invalid ir_version ({proto.ir_version})")
    if proto.ir_version > MAX_IR_VERSION:
        raise ModelLoadError(
            f"{where}: IR version {proto.ir_version} is newer than the installed onnx supports ({MAX_IR_VERSION})"
        )
    default_opset = None
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            default_opset = opset.version
    if default_opset is None:
        # A model made only of custom or ai.onnx.ml ops needs no default opset.
        user = _first_default_domain_node(proto.graph)
        if user is not None:
            raise ModelLoadError(
                f"{where}: node '{user.name or user.op_type}' ({user.op_type}) is a standard ONNX op, "
                "but the model imports no opset for the default ONNX domain"
            )
        return
    if default_opset < 1 or default_opset > MAX_OPSET:
        raise ModelLoadError(
            f"{where}: opset {default_opset} is not supported (the installed onnx knows opsets 1..{MAX_OPSET})"
        )


@functools.cache
def _latest_opset(domain: str) -> int:
    """The newest opset of ``domain`` the installed onnx has schemas for (1 for com.microsoft)."""
    schemas = onnx.defs.get_all_schemas_with_history()
    return max((s.since_version for s in schemas if s.domain == domain), default=1)


# Domains ONNX Runtime resolves without an opset import (at the newest version it knows).
_IMPLIED_DOMAINS = ("ai.onnx.ml", "com.microsoft")


def _drop_repeated_imports(where: str, proto: onnx.ModelProto) -> tuple[str, ...]:
    """Keep one of each opset import a model repeats at the same version.

    skl2onnx writes some models (a LogisticRegression, a RandomForest) with the default domain
    imported twice at one version; onnx's checker and ONNX Runtime accept that, and onnx-ir keeps
    one version per domain anyway. A domain imported at two different versions is ambiguous (ONNX
    Runtime silently picks one) and refused.
    """
    versions: dict[str, int] = {}
    repeated = []
    for index, opset in enumerate(proto.opset_import):
        if opset.domain not in versions:
            versions[opset.domain] = opset.version
        elif versions[opset.domain] == opset.version:
            repeated.append(index)
        else:
            raise ModelLoadError(
                f"{where}: opset for domain '{opset.domain}' is imported twice, at versions "
                f"{versions[opset.domain]} and {opset.version}"
            )
    domains = list(dict.fromkeys(proto.opset_import[i].domain for i in repeated))
    for index in reversed(repeated):
        del proto.opset_import[index]
    return tuple(
        f"opset {versions[d]} of domain '{d}' was imported twice: kept one import" for d in domains
    )


def _drop_empty_trailing_outputs(proto: onnx.ModelProto) -> int:
    """Drop the empty names that end a node's output list; return how many nodes had them.

    An empty output name means the optional output is absent, exactly as leaving it off the end
    of the list does. ONNX Runtime disagrees for BatchNormalization-7/9 (``y, "", "", "", ""``):
    it counts the outputs, runs in training mode and crashes the process writing the absent ones.
    Every graph is repaired: the main one, local functions and the subgraphs below both (ORT
    inlines a function at load, so an If branch inside one crashes it alike).
    """
    trimmed = 0
    for node in _all_nodes(proto):
        keep = len(node.output)
        while keep and not node.output[keep - 1]:
            keep -= 1
        if keep < len(node.output):
            del node.output[keep:]
            trimmed += 1
    return trimmed


def _minus_one_dims_unknown(proto: onnx.ModelProto) -> int:
    """Make each type dim written as -1 an unknown dim; return how many values had one.

    PaddlePaddle's converter (paddle2onnx) and some older ones write a dynamic dim as
    ``dim_value: -1`` rather than leaving it unset; ONNX Runtime reads it as unknown (None), and
    so does onnxopt now. Other negative dims stay an error.
    """

    def clear(type_proto: onnx.TypeProto) -> bool:
        found = False
        while True:
            kind = type_proto.WhichOneof("value")
            if kind in ("tensor_type", "sparse_tensor_type"):
                for dim in getattr(type_proto, kind).shape.dim:
                    if dim.HasField("dim_value") and dim.dim_value == -1:
                        dim.ClearField("dim_value")
                        found = True
                return found
            if kind in ("sequence_type", "optional_type"):
                type_proto = getattr(type_proto, kind).elem_type
                continue
            return found

    changed = 0
    for graph in _graph_protos(proto.graph, *proto.functions):
        values = [*graph.value_info]
        if isinstance(graph, onnx.GraphProto):
            values += [*graph.input, *graph.output]
        changed += sum(clear(value.type) for value in values)
    return changed


def _import_implied_domains(proto: onnx.ModelProto) -> tuple[str, ...]:
    """Import ai.onnx.ml / com.microsoft where nodes use them but the model does not import them.

    ONNX Runtime runs such a model as if the newest version of the domain were imported; onnx's
    shape inference instead fails on the whole graph ("No opset import for domain"), which would
    leave every shape-based rewrite idle. Import what ORT assumes, so both read the model alike.
    """
    imported = {o.domain for o in proto.opset_import}
    used: list[str] = []
    for node in _all_nodes(proto):
        if (
            node.domain in _IMPLIED_DOMAINS
            and node.domain not in imported
            and node.domain not in used
        ):
            used.append(node.domain)
    repairs = []
    for domain in used:
        version = _latest_opset(domain)
        proto.opset_import.append(onnx.helper.make_opsetid(domain, version))
        repairs.append(
            f"the model uses {domain} ops without importing that domain: imported {domain} "
            f"opset {version} (ONNX Runtime, too, reads a missing import as the newest version)"
        )
    return tuple(repairs)


def _opsets(proto: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}


# Far beyond any real model (LLM exports have ~10^5 nodes); each node costs ~0.5 KB in onnx-ir and
# passes walk them repeatedly, so a 10 MB file of empty nodes would take minutes and gigabytes.
MAX_NODES = 2_000_000


def _graph_protos(
    *roots: onnx.GraphProto | onnx.FunctionProto,
) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    """``roots`` and every subgraph below them (If/Loop/Scan bodies), without recursion (the
    nesting may be deep in a hostile file); a graph is yielded before its subgraphs are read."""
    stack = list(roots)
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    stack.append(attr.g)
                stack.extend(attr.graphs)


def _all_nodes(proto: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model: the main graph's, the local functions', and those of every
    subgraph below either (an If branch inside a function too)."""
    for current in _graph_protos(proto.graph, *proto.functions):
        yield from current.node


def _check_node_count(where: str, proto: onnx.ModelProto) -> None:
    total = 0
    for current in _graph_protos(proto.graph, *proto.functions):
        total += len(current.node)
        if total > MAX_NODES:
            raise ModelLoadError(
                f"{where}: the model has over {MAX_NODES} nodes; onnxopt does not load models this large"
            )


# ONNX's shape inference and ONNX Runtime both stop at a function call depth of 100.
MAX_FUNCTION_DEPTH = 100


def _check_functions(where: str, proto: onnx.ModelProto) -> None:
    """Local functions may not call themselves (directly or not) or nest over MAX_FUNCTION_DEPTH,
    and their bodies must be well formed graphs (SSA, every value read is defined, no cycle).

    Walking such a call chain recurses without bound in onnx-ir; refuse it up front.
    """
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    if not functions:
        return

    def callees(func: onnx.FunctionProto) -> list[tuple[str, str, str]]:
        found: list[tuple[str, str, str]] = []
        stack = [list(func.node)]
        while stack:
            for node in stack.pop():
                key = (node.domain, node.op_type, node.overload)
                if key in functions and key not in found:
                    found.append(key)
                for attr in node.attribute:
                    if attr.HasField("g"):
                        stack.append(list(attr.g.node))
                    stack.extend(list(g.node) for g in attr.graphs)
        return found

    calls = {key: callees(func) for key, func in functions.items()}
    depth: dict[tuple[str, str, str], int] = {}
    for root in functions:
        if root in depth:
            continue
        # Iterative DFS: (function, index of the next callee to visit); the path is the stack.
        path: list[tuple[tuple[str, str, str], int]] = [(root, 0)]
        on_path = {root}
        while path:
            key, index = path[-1]
            if index < len(calls[key]):
                path[-1] = (key, index + 1)
                callee = calls[key][index]
                if callee in on_path:
                    raise ModelLoadError(
                        f"{where}: local function '{callee[0]}.{callee[1]}' calls itself "
                        f"(through {' -> '.join(k[1] for k, _ in path)}); that never ends"
                    )
                if callee not in depth:
                    path.append((callee, 0))
                    on_path.add(callee)
                continue
            depth[key] = 1 + max((depth[c] for c in calls[key]), default=0)
            if depth[key] > MAX_FUNCTION_DEPTH:
                raise ModelLoadError(
                    f"{where}: local function '{key[0]}.{key[1]}' starts a chain of calls {depth[key]} deep; "
                    f"ONNX and ONNX Runtime allow {MAX_FUNCTION_DEPTH}"
                )
            path.pop()
            on_path.discard(key)
    for func in functions.values():
        # A body is a graph of its own: every value it reads is an input of the function or made
        # by an earlier node of it (inlining a body that reads an undefined name cannot work).
        body = onnx.helper.make_graph(
            list(func.node),
            func.name,
            [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in func.input],
            [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in func.output],
        )
        _check_graph_structure(where, body, (), f"local function '{func.domain}.{func.name}': ")


def _first_default_domain_node(graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """The first node of the default domain in ``graph`` or its subgraphs (iterative: no recursion)."""
    stack = [graph]
    while stack:
        current = stack.pop()
        for node in current.node:
            if node.domain in ("", "ai.onnx"):
                return node
            for attr in node.attribute:
                if attr.HasField("g"):
                    stack.append(attr.g)
                stack.extend(attr.graphs)
    return None


def _iter_graph_tensors(
    graph: onnx.GraphProto, where: str
) -> Iterator[tuple[str, onnx.TensorProto]]:
    for t in graph.initializer:
        yield f"{where}initializer '{t.name}'", t
    for sparse in graph.sparse_initializer:
        yield f"{where}sparse initializer '{sparse.values.name}'", sparse.values
        yield f"{where}sparse initializer '{sparse.values.name}' indices", sparse.indices
    for node in graph.node:
        yield from _iter_node_tensors(node, where)


def _iter_node_tensors(node: onnx.NodeProto, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    label = f"{where}node '{node.name or node.op_type}'"
    for attr in node.attribute:
        if attr.HasField("t"):
            yield f"{label} attribute '{attr.name}'", attr.t
        for t in attr.tensors:
            yield f"{label} attribute '{attr.name}'", t
        if attr.HasField("g"):
            yield from _iter_graph_tensors(attr.g, f"{label}/{attr.name}: ")
        for g in attr.graphs:
            yield from _iter_graph_tensors(g, f"{label}/{attr.name}: ")


def _all_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield from _iter_graph_tensors(proto.graph, "")
    for func in proto.functions:
        for node in func.node:
            yield from _iter_node_tensors(node, f"function '{func.name}': ")


def _check_external_data(
    where: str,
    proto: onnx.ModelProto,
    base_dir: Path | None,
    model_file: Path | None = None,
    own_mapped: frozenset[str] = frozenset(),
) -> tuple[Path, ...]:
    """Refuse external data that could read outside the model's folder; return the files used.

    Every tensor's data is also checked against its dtype and dims (``_check_tensor_data``).
    ``model_file``: external data may not point into the model file itself, except the tensors
    labelled in ``own_mapped`` (the loader's own ``MappedTensor``s).
    """
    files: dict[Path, int] = {}
    root = base_dir.resolve() if base_dir is not None else None
    for label, tensor in _all_tensors(proto):
        expected = _check_tensor_data(where, label, tensor)
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        if len(info) != len(tensor.external_data):
            # Readers disagree on which one counts (onnx takes the last, ORT refuses): the one
            # checked here might not be the one read.
            keys = [entry.key for entry in tensor.external_data]
            twice = next(key for key in keys if keys.count(key) > 1)
            raise UnsafeModelError(f"{where}: {label} gives its external data '{twice}' twice")
        location = info.get("location", "")
        if label in own_mapped and model_file is not None:
            # The loader's own view into the model file it was given (which may be a symlink to
            # another folder or name): not external data, so not held to the folder rule.
            candidate = resolved = model_file.resolve()
        else:
            candidate, resolved = _checked_location(where, label, location, root, model_file)
        if resolved not in files:
            try:
                # The path as written: readers open it unresolved, so 'missing/../w.bin' must fail here.
                st = candidate.stat()
            except (FileNotFoundError, NotADirectoryError):
                raise ModelLoadError(
                    f"{where}: {label} external data file '{location}' does not exist"
                ) from None
            except OSError as exc:
                raise ModelLoadError(
                    f"{where}: {label} external data file '{location}' cannot be read ({exc.strerror})"
                ) from None
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeModelError(
                    f"{where}: {label} external data '{location}' is not a regular file"
                )
            files[resolved] = st.st_size
        size = files[resolved]
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise ModelLoadError(
                f"{where}: {label} has a non-numeric external data offset/length"
            ) from None
        if offset < 0 or (length is not None and length < 0):
            raise ModelLoadError(f"{where}: {label} has a negative external data offset/length")
        if length is not None and expected is not None and length != expected:
            stored = "raw_data" if label in own_mapped else "external data"
            raise ModelLoadError(
                f"{where}: {label} has {length} bytes of {stored}; {_describe_type(tensor)} need {expected}"
            )
        end = offset + (length if length is not None else expected or 0)
        if offset > size or end > size:
            raise ModelLoadError(
                f"{where}: {label} reads bytes {offset}..{end} of '{location}', which has only {size} bytes"
            )
    return tuple(files)


def _checked_location(
    where: str, label: str, location: str, root: Path | None, model_file: Path | None
) -> tuple[Path, Path]:
    """The path of a tensor's external data as written and resolved; refused when it could read
    outside the model's folder or from the model file itself."""
    if not location:
        raise ModelLoadError(f"{where}: {label} is external but names no location")
    if root is None:
        raise UnsafeModelError(
            f"{where}: {label} uses external data but the model has no folder to resolve it in"
        )
    if (
        "\x00" in location
        or os.path.isabs(location)
        or location.startswith(("\\", "/"))
        or ":" in location
    ):
        raise UnsafeModelError(
            f"{where}: {label} external data location '{location}' is absolute; it must be relative to the model's folder"
        )
    candidate = root / location
    resolved = candidate.resolve()
    if root != resolved and root not in resolved.parents:
        raise UnsafeModelError(
            f"{where}: {label} external data location '{location}' leads outside the model's folder"
        )
    if model_file is not None and same_file(candidate, model_file):
        raise UnsafeModelError(
            f"{where}: {label} external data location '{location}' is the model file itself"
        )
    return candidate, resolved


# A sparse tensor is made dense at load (onnx-ir has no sparse tensors); up to this many bytes.
SPARSE_DENSE_LIMIT = 64 * 1024 * 1024


def _densify_sparse(where: str, proto: onnx.ModelProto) -> None:
    """Replace sparse initializers and Constant ``sparse_value``s by the dense tensors they denote.

    onnx-ir drops sparse initializers, which would leave their users reading an undefined value.
    A tensor whose dense form is over ``SPARSE_DENSE_LIMIT``, or whose indices are out of range,
    is refused instead.
    """
    stack: list[tuple[onnx.GraphProto, str]] = [(proto.graph, "")]
    while stack:
        graph, label = stack.pop()
        if len(graph.sparse_initializer):
            for sparse in graph.sparse_initializer:
                what = f"{label}sparse initializer '{sparse.values.name}'"
                graph.initializer.append(_dense_from_sparse(where, what, sparse))
            del graph.sparse_initializer[:]
            logger.info("%s: %ssparse initializers stored dense", where, label)
        for index, node in enumerate(graph.node):
            node_label = f"{label}node '{node.name or '#' + str(index)}' ({node.op_type})"
            for attr in node.attribute:
                if attr.HasField("sparse_tensor") and node.op_type == "Constant":
                    dense = _dense_from_sparse(where, node_label, attr.sparse_tensor)
                    attr.name, attr.type = "value", onnx.AttributeProto.TENSOR
                    attr.ClearField("sparse_tensor")
                    attr.t.CopyFrom(dense)
                if attr.HasField("g"):
                    stack.append((attr.g, f"{node_label}/{attr.name}: "))
                for sub in attr.graphs:
                    stack.append((sub, f"{node_label}/{attr.name}: "))


def _dense_from_sparse(where: str, label: str, sparse: onnx.SparseTensorProto) -> onnx.TensorProto:
    from onnx import numpy_helper

    values, indices, dims = sparse.values, sparse.indices, [int(d) for d in sparse.dims]
    if onnx.TensorProto.EXTERNAL in (values.data_location, indices.data_location):
        raise ModelLoadError(f"{where}: {label} keeps its data externally; that is not supported")
    if values.data_type == onnx.TensorProto.STRING:
        raise ModelLoadError(f"{where}: {label} is a sparse STRING tensor; that is not supported")
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where}: {label} has a negative dimension in {dims}")
    count = int(np.prod(dims, dtype=object)) if dims else 1
    dense_bytes = count * ir.DataType(values.data_type).itemsize
    if dense_bytes > SPARSE_DENSE_LIMIT:
        raise ModelLoadError(
            f"{where}: {label} would take {dense_bytes} bytes dense; sparse tensors are stored "
            f"dense and only up to {SPARSE_DENSE_LIMIT} bytes"
        )
    flat_values = numpy_helper.to_array(values).reshape(-1)
    index_array = numpy_helper.to_array(indices).astype(np.int64)
    nnz = flat_values.size
    if index_array.shape == (nnz,):
        linear = index_array
        in_range = bool(np.all((linear >= 0) & (linear < count)))
    elif index_array.shape == (nnz, len(dims)):
        in_range = bool(np.all((index_array >= 0) & (index_array < np.array(dims, np.int64))))
        linear = (
            np.ravel_multi_index(index_array.T, dims) if in_range and nnz else index_array[:, 0]
        )
    else:
        raise ModelLoadError(
            f"{where}: {label} has indices of shape {list(index_array.shape)} for {nnz} values "
            f"of a {len(dims)}-d tensor"
        )
    if not in_range:
        raise ModelLoadError(f"{where}: {label} has an index outside its dims {dims}")
    dense = np.zeros(count, dtype=flat_values.dtype)
    dense[linear] = flat_values
    return numpy_helper.from_array(dense.reshape(dims), values.name)


def _describe_type(tensor: onnx.TensorProto) -> str:
    dtype = onnx.TensorProto.DataType.Name(tensor.data_type)
    return f"its type {dtype} and dims {list(tensor.dims)}"


def _check_tensor_data(where: str, label: str, tensor: onnx.TensorProto) -> int | None:
    """The tensor's dtype is known, its dims are not negative and its data fits them exactly.

    Returns the byte size its ``raw_data`` (or external data) must have, None for strings. A
    mismatch would otherwise surface later as a numpy error deep in a pass.
    """
    try:
        dtype = ir.DataType(tensor.data_type)
        field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except (ValueError, KeyError):
        dtype = ir.DataType.UNDEFINED
    if dtype == ir.DataType.UNDEFINED:
        raise ModelLoadError(
            f"{where}: {label} has no valid data type ({tensor.data_type}); it cannot be read"
        )
    count = 1
    for axis, dim in enumerate(tensor.dims):
        if dim < 0:
            raise ModelLoadError(
                f"{where}: {label} has a negative dimension ({dim}) at axis {axis}"
            )
        count *= dim
    if dtype == ir.DataType.STRING:
        expected_bytes = None
        typed = count
    else:
        bits = dtype.bitwidth
        expected_bytes = (count * bits + 7) // 8
        # Sub-byte types pack into bytes (one int32_data entry per byte); complex is (re, im) pairs.
        typed = (
            expected_bytes if bits < 8 else count * (2 if dtype.name.startswith("COMPLEX") else 1)
        )
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return expected_bytes
    if tensor.HasField("raw_data"):
        if expected_bytes is None:
            raise ModelLoadError(f"{where}: {label} is a STRING tensor with raw_data")
        if len(tensor.raw_data) != expected_bytes:
            raise ModelLoadError(
                f"{where}: {label} has {len(tensor.raw_data)} bytes of raw_data; "
                f"{_describe_type(tensor)} need {expected_bytes}"
            )
        return expected_bytes
    present = len(getattr(tensor, field))
    if present != typed:
        raise ModelLoadError(
            f"{where}: {label} holds {present} values in {field}; {_describe_type(tensor)} need {typed}"
        )
    return expected_bytes


def _check_graph_structure(
    where: str,
    graph: onnx.GraphProto,
    outer: tuple[frozenset[str], ...],
    label: str,
    opsets: Mapping[str, int] | None = None,
) -> None:
    """Names are unique (SSA) and UTF-8, every input is defined, dims are not negative, no cycle.

    With ``opsets`` (domain -> version), attributes of standard ops must have the schema's type.
    """
    defined: dict[str, str] = {}

    def define(name: str, what: str) -> None:
        _check_text(where, f"{label}the name of {what}", name)
        if not name:
            return
        if name in defined:
            raise ModelLoadError(
                f"{where}: {label}'{name}' is defined twice ({defined[name]} and {what})"
            )
        defined[name] = what

    for kind, values in (
        ("graph input", graph.input),
        ("graph output", graph.output),
        ("value_info", graph.value_info),
    ):
        for value in values:
            _check_text(where, f"{label}the name of a {kind}", value.name)
            _check_dims(where, f"{label}{kind} '{value.name}'", value.type)
    for value in graph.input:
        define(value.name, "graph input")
    initializer_names = set()
    for t in graph.initializer:
        _check_text(where, f"{label}the name of an initializer", t.name)
        if t.name in defined and t.name in initializer_names:
            raise ModelLoadError(f"{where}: {label}initializer '{t.name}' is defined twice")
        initializer_names.add(t.name)
        if t.name not in defined:
            defined[t.name] = "initializer"
    for sparse in graph.sparse_initializer:
        if sparse.values.name not in defined:
            defined[sparse.values.name] = "sparse initializer"
    producer_index: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        node_label = (
            f"node '{node.name}' ({node.op_type})"
            if node.name
            else f"node #{index} ({node.op_type})"
        )
        for what, text in (("name", node.name), ("op type", node.op_type), ("domain", node.domain)):
            _check_text(where, f"{label}the {what} of node #{index}", text)
        if not node.op_type:
            raise ModelLoadError(f"{where}: {label}node #{index} has no op type")
        for out in node.output:
            define(out, node_label)
            if out:
                producer_index[out] = index
    # Outer scopes stay separate sets: copying them into every subgraph's scope would be quadratic.
    scopes = (*outer, frozenset(defined))

    def is_known(name: str) -> bool:
        return any(name in scope for scope in scopes)

    for index, node in enumerate(graph.node):
        node_label = (
            f"node '{node.name}' ({node.op_type})"
            if node.name
            else f"node #{index} ({node.op_type})"
        )
        for name in node.input:
            _check_text(where, f"{label}an input name of {node_label}", name)
            if name and not is_known(name):
                raise ModelLoadError(
                    f"{where}: {label}{node_label} uses '{name}', which no node, input or initializer defines"
                )
        if opsets is not None:
            _check_attribute_types(where, f"{label}{node_label}", node, opsets)
        for attr in node.attribute:
            subgraphs = list(attr.graphs)
            if attr.HasField("g"):
                subgraphs.append(attr.g)
            for sub in subgraphs:
                _check_graph_structure(
                    where, sub, scopes, f"{label}{node_label}/{attr.name}: ", opsets
                )
    if not outer and not graph.output:
        raise ModelLoadError(f"{where}: the graph has no outputs; there is nothing to compute")
    for out in graph.output:
        if not is_known(out.name):
            raise ModelLoadError(
                f"{where}: {label}graph output '{out.name}' is not produced by anything"
            )
    _check_acyclic(where, graph, producer_index, label)


@functools.lru_cache(maxsize=1024)
def _attribute_types(op_type: str, domain: str, version: int) -> dict[str, int]:
    """The attribute types the op's schema declares (empty for ops onnx does not know)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return {}
    # AttrType's values are AttributeProto's; onnx's stubs do not say it converts to int.
    return {
        name: int(attr.type)  # type: ignore[call-overload]
        for name, attr in schema.attributes.items()
    }


@functools.lru_cache(maxsize=1024)
def _required_first_input(op_type: str, domain: str, version: int) -> str | None:
    """The name of the op's first input when its schema requires one (None for ops onnx does not
    know). Only the first: exporters leave some later required inputs empty (Resize-11's roi)
    and ONNX Runtime runs those models."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    if not schema.inputs:
        return None
    first = schema.inputs[0]
    optional = first.option == onnx.defs.OpSchema.FormalParameterOption.Optional
    return None if optional or schema.min_input == 0 else first.name


def _check_attribute_types(
    where: str, node_label: str, node: onnx.NodeProto, opsets: Mapping[str, int]
) -> None:
    """An attribute of a standard op with another type than its schema's would crash a pass, as
    would a required first input left out (an empty name means "absent")."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in ("", "ai.onnx.ml") or domain not in opsets:
        return
    first = _required_first_input(node.op_type, domain, opsets[domain])
    if first is not None and (not node.input or not node.input[0]):
        raise ModelLoadError(
            f"{where}: {node_label}: its first input ('{first}') is required and missing"
        )
    if node.op_type == "Constant" and domain == "" and len(node.attribute) != 1:
        raise ModelLoadError(
            f"{where}: {node_label}: a Constant needs exactly one value attribute; it has "
            f"{len(node.attribute)}"
        )
    declared = _attribute_types(node.op_type, domain, opsets[domain])
    names = onnx.AttributeProto.AttributeType.Name
    for attr in node.attribute:
        if attr.ref_attr_name:
            continue
        if attr.type == onnx.AttributeProto.UNDEFINED:
            raise ModelLoadError(f"{where}: {node_label}: attribute '{attr.name}' has no type")
        wanted = declared.get(attr.name)
        if wanted is not None and wanted != attr.type:
            raise ModelLoadError(
                f"{where}: {node_label}: attribute '{attr.name}' is {names(attr.type)}; "
                f"{node.op_type} takes {names(wanted)}"
            )
        if (
            wanted == onnx.AttributeProto.INT
            and attr.name in _DATA_TYPE_ATTRIBUTES
            and attr.i not in _DATA_TYPES
        ):
            raise ModelLoadError(
                f"{where}: {node_label}: attribute '{attr.name}' is {attr.i}, which is no ONNX data type"
            )


# The standard ops' INT attributes that hold a TensorProto.DataType (Cast's 'to', EyeLike's
# 'dtype', QuantizeLinear's 'output_dtype', the window ops' 'output_datatype', LayerNorm's
# 'stash_type'): passes read them as ir.DataType, which an unknown number makes raise.
_DATA_TYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype", "output_datatype", "stash_type"})
_DATA_TYPES = frozenset(t.value for t in ir.DataType)  # 0 too: output_dtype's "infer it"


def _check_text(where: str, what: str, text: str | bytes) -> None:
    """protobuf hands back ``bytes`` for a string field that is not valid UTF-8: refuse those."""
    if isinstance(text, bytes):
        raise ModelLoadError(f"{where}: {what} is not valid UTF-8 ({text[:40]!r})")


def _check_dims(where: str, what: str, type_proto: onnx.TypeProto) -> None:
    if not type_proto.HasField("tensor_type"):
        return
    for axis, dim in enumerate(type_proto.tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value < 0:
            raise ModelLoadError(
                f"{where}: {what} has a negative dimension ({dim.dim_value}) at axis {axis}"
            )
        if dim.HasField("dim_param"):
            _check_text(where, f"a dimension name of {what}", dim.dim_param)


def _check_model_strings(where: str, proto: onnx.ModelProto) -> None:
    for what, text in (
        ("producer_name", proto.producer_name),
        ("producer_version", proto.producer_version),
        ("domain", proto.domain),
        ("doc_string", proto.doc_string),
        ("graph name", proto.graph.name),
        ("graph doc_string", proto.graph.doc_string),
    ):
        _check_text(where, f"the model's {what}", text)
    for entry in proto.metadata_props:
        _check_text(where, "a metadata key", entry.key)
        _check_text(where, f"metadata '{entry.key}'", entry.value)
    for opset in proto.opset_import:
        _check_text(where, "an opset domain", opset.domain)


def _check_acyclic(
    where: str, graph: onnx.GraphProto, producer_index: dict[str, int], label: str
) -> None:
    in_order = all(
        producer_index.get(name, -1) < index
        for index, node in enumerate(graph.node)
        for name in node.input
        if name
    )
    if in_order:
        return
    # Kahn's algorithm over node indices; nodes left over are on a cycle.
    count = len(graph.node)
    indegree = [0] * count
    users: list[list[int]] = [[] for _ in range(count)]
    for index, node in enumerate(graph.node):
        for producer in {producer_index[name] for name in node.input if name in producer_index}:
            indegree[index] += 1
            users[producer].append(index)
    ready = [i for i in range(count) if indegree[i] == 0]
    visited = 0
    while ready:
        current = ready.pop()
        visited += 1
        for user in users[current]:
            indegree[user] -= 1
            if indegree[user] == 0:
                ready.append(user)
    if visited != count:
        stuck = next(i for i in range(count) if indegree[i] > 0)
        node = graph.node[stuck]
        raise ModelLoadError(
            f"{where}: {label}the graph has a cycle through node '{node.name or '#' + str(stuck)}' ({node.op_type})"
        )


# --- weights stored inline in the .onnx file, read in place ------------------------------------------
#
# A single-file model holds its weights in ``raw_data`` fields. Parsing it whole costs the file twice
# (the bytes read, then the parsed copy) and a serialized copy again on save. Instead the loader
# walks the protobuf wire format of the memory-mapped file, parses everything except large
# ``graph.initializer[i].raw_data`` fields, and points those tensors at their bytes in the file
# itself (``MappedTensor``). The saver does the reverse: it serializes the model with the large
# tensors left out and streams their bytes into the output one tensor at a time.

# Initializers at least this big are mapped from the source file / streamed into the output.
MAPPED_MIN_BYTES = 4096

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
_TENSOR_EXTERNAL_DATA = 13  # TensorProto.external_data
_TENSOR_DATA_LOCATION = 14  # TensorProto.data_location


class _FileMap:
    """One read-only memory map of a file, made on first use, shared by the tensors stored in it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: mmap.mmap | None = None

    def mapped(self) -> mmap.mmap | None:
        """The map when it was made, else None (without making it)."""
        return self._map

    def get(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map


class MappedTensor(ir.ExternalTensor):
    """An initializer stored inline in the source .onnx file, read through a memory map of it.

    To onnx-ir it is external data (the "external" file is the model file itself); to onnxopt it
    is an inline weight: saving writes it back inline, and ``has_external_tensors`` ignores it.

    The tensors of one file share one map of it (``file_map``). onnx-ir maps the whole file once
    per tensor, and each map holds a file descriptor: validating a model of 20k such weights
    failed with "Too many open files" (at the common limit of 1024, past a thousand).
    """

    def __init__(self, *args: Any, file_map: _FileMap, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.file_map = file_map

    def _load(self) -> None:
        if self.dtype.bitwidth < 8 or self.size == 0:
            super()._load()  # packed 2/4/6-bit values are unpacked into a copy anyway
            return
        self._check_validity()
        # The loader named the file itself (a regular file of one link, resolved): no containment
        # check to repeat per tensor.
        self.raw = self.file_map.get()
        dtype = np.dtype(self.dtype.numpy()).newbyteorder("<")
        array = np.frombuffer(self.raw, dtype=dtype, offset=self.offset or 0, count=self.size)
        self._array = array.reshape(self.shape.numpy())

    def release(self) -> None:
        """Let go of the data, and of the map's pages that hold it (read again from the file if
        the tensor is read again): a pass that replaced this weight (a merge writes a new one)
        would otherwise keep both resident. The shared map closes once nothing uses it."""
        mapped = self.file_map.mapped()
        advise = getattr(mmap, "MADV_DONTNEED", None)
        if self._array is not None and mapped is not None and advise is not None:
            start = (self.offset or 0) // mmap.PAGESIZE * mmap.PAGESIZE
            end = min((self.offset or 0) + self._array.nbytes, len(mapped))
            if end > start:
                with contextlib.suppress(OSError):  # only advice: the pages may simply stay
                    mapped.madvise(advise, start, end - start)
        self._array = None
        self.raw = None


class _NotMappable(Exception):
    """The file uses protobuf features the wire-format walk does not handle: parse it whole."""


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _NotMappable("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, payload start, payload end) for each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            _, pos = _read_varint(buf, pos)
            yield field, wire, field_start, pos, pos
            continue
        if wire == _WIRE_LEN:
            length, payload = _read_varint(buf, pos)
            pos = payload + length
        elif wire == _WIRE_I64:
            payload, pos = pos, pos + 8
        elif wire == _WIRE_I32:
            payload, pos = pos, pos + 4
        else:
            raise _NotMappable(f"wire type {wire}")
        if pos > end:
            raise _NotMappable("field runs past its message")
        yield field, wire, field_start, payload, pos


def _strip_tensor(buf: memoryview, start: int, end: int) -> tuple[bytes, int, int] | None:
    """The tensor's fields without a large ``raw_data``, and where that data lies; None to keep it."""
    raw: tuple[int, int, int] | None = None
    for field, wire, field_start, payload, field_end in _fields(buf, start, end):
        if field in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            return None  # already external (or oddly marked): leave it to the normal path
        if field == _TENSOR_RAW_DATA and wire == _WIRE_LEN:
            raw = (field_start, payload, field_end)
    if raw is None or raw[2] - raw[1] < MAPPED_MIN_BYTES:
        return None
    field_start, payload, field_end = raw
    kept = bytes(buf[start:field_start]) + bytes(buf[field_end:end])
    return kept, payload, field_end - payload


def _parse_mapped(buf: memoryview) -> tuple[onnx.ModelProto, list[tuple[int, int, int]]]:
    """Parse a model without its large initializers' bytes: (proto, [(index, offset, length)])."""
    pieces: list[bytes] = []
    mapped: list[tuple[int, int, int]] = []
    graphs = 0
    for field, wire, field_start, payload, field_end in _fields(buf, 0, len(buf)):
        if field != _MODEL_GRAPH or wire != _WIRE_LEN:
            pieces.append(bytes(buf[field_start:field_end]))
            continue
        graphs += 1
        if graphs > 1:
            raise _NotMappable("the graph field appears twice")
        graph: list[bytes] = []
        index = 0
        for g_field, g_wire, g_start, g_payload, g_end in _fields(buf, payload, field_end):
            if g_field == _GRAPH_INITIALIZER and g_wire == _WIRE_LEN:
                stripped = _strip_tensor(buf, g_payload, g_end)
                if stripped is not None:
                    kept, offset, length = stripped
                    graph += [_tag(g_field, g_wire), _varint(len(kept)), kept]
                    mapped.append((index, offset, length))
                    index += 1
                    continue
                index += 1
            graph.append(bytes(buf[g_start:g_end]))
        body = b"".join(graph)
        pieces += [_tag(field, wire), _varint(len(body)), body]
    proto = onnx.ModelProto()
    proto.ParseFromString(b"".join(pieces))
    return proto, mapped


def _read_proto_mapped(path: Path) -> tuple[onnx.ModelProto, list[tuple[int, int, int]]] | None:
    """Parse ``path`` leaving large inline weights in the file; None when that cannot be done safely."""
    try:
        st = path.stat()
        resolved = path.resolve()
    except OSError:
        return None
    # onnx-ir refuses to map a file with several hard links; a name with ':' reads as a drive.
    if not stat.S_ISREG(st.st_mode) or st.st_size < 16 or st.st_nlink != 1 or ":" in resolved.name:
        return None
    try:
        with path.open("rb") as f:
            head = f.read(16)
            _sniff(path, head)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped_file:
                view = memoryview(mapped_file)
                try:
                    proto, mapped = _parse_mapped(view)
                finally:
                    view.release()
    except (_NotMappable, DecodeError, RecursionError, OSError, ValueError, BufferError):
        return None  # the whole-file parser gives the precise error, or succeeds
    if not proto.HasField("graph") or not mapped:
        return None
    for index, offset, length in mapped:
        tensor = proto.graph.initializer[index]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", resolved.name), ("offset", offset), ("length", length)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    return proto, mapped


def _adopt_mapped(model: ir.Model, source: Path) -> None:
    """Turn the initializers that point into the model file itself into ``MappedTensor``s."""
    resolved = source.resolve()
    file_map = _FileMap(str(resolved))
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if (
            isinstance(tensor, ir.ExternalTensor)
            and not isinstance(tensor, MappedTensor)
            and os.fspath(tensor.location) == resolved.name
        ):
            value.const_value = MappedTensor(
                resolved.name,
                tensor.offset,
                tensor.length,
                tensor.dtype,
                shape=tensor.shape,
                name=tensor.name,
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props),
                base_dir=str(resolved.parent),
                file_map=file_map,
            )


def load_model(path: str | os.PathLike[str]) -> LoadedModel:
    """Load and check an ONNX model file; weights are memory-mapped in their files, never copied.

    External data stays in its files; large initializers stored inline stay in the model file
    (see ``MappedTensor``), so loading costs about the graph's size, not the weights'.
    """
    model_path = Path(path)
    lazy = _read_proto_mapped(model_path)
    proto = lazy[0] if lazy is not None else _read_proto(model_path)
    where = str(model_path)
    _check_model_strings(where, proto)
    repairs = _drop_repeated_imports(where, proto)
    _check_versions(where, proto)
    _check_node_count(where, proto)
    repairs += _import_implied_domains(proto)
    unknown = _minus_one_dims_unknown(proto)
    if unknown:
        repairs += (
            f"{unknown} values have dims written as -1 (paddle2onnx's and some older converters' "
            "way to say unknown): read as unknown dims, as ONNX Runtime reads them",
        )
    trimmed = _drop_empty_trailing_outputs(proto)
    if trimmed:
        repairs += (
            f"{trimmed} nodes ended their outputs with empty names (absent outputs): dropped them, "
            "as ONNX Runtime can crash on them",
        )
    own_mapped = (
        frozenset(f"initializer '{proto.graph.initializer[index].name}'" for index, _, _ in lazy[1])
        if lazy is not None
        else frozenset()
    )
    external_files = _check_external_data(where, proto, model_path.parent, model_path, own_mapped)
    _densify_sparse(where, proto)
    _check_functions(where, proto)
    _check_graph_structure(where, proto.graph, (), "", _opsets(proto))
    model = _deserialize(where, proto)
    del proto
    renamed = unique_node_names(model)
    unique_value_names(model)  # sibling If branches may share names; keyed facts need them apart
    if renamed:
        repairs += (
            f"{renamed} nodes renamed: their names repeated another node's, "
            "which ONNX Runtime refuses to load",
        )
    ir.external_data.set_base_dir(model.graph, str(model_path.parent.resolve()))
    if lazy is not None:
        _adopt_mapped(model, model_path)
    size = model_path.stat().st_size
    return LoadedModel(model, model_path, size, external_files, renamed, repairs, trimmed)


def model_from_proto(proto: onnx.ModelProto, where: str = "<model>") -> ir.Model:
    """Check and convert an in-memory proto (external data is refused: it has no folder)."""
    _check_model_strings(where, proto)
    _drop_repeated_imports(where, proto)
    _check_versions(where, proto)
    _check_node_count(where, proto)
    _import_implied_domains(proto)
    _minus_one_dims_unknown(proto)
    _drop_empty_trailing_outputs(proto)
    _check_external_data(where, proto, None)
    _densify_sparse(where, proto)
    _check_functions(where, proto)
    _check_graph_structure(where, proto.graph, (), "", _opsets(proto))
    model = _deserialize(where, proto)
    unique_node_names(model)
    unique_value_names(model)
    return model


def unique_node_names(model: ir.Model) -> int:
    """Rename nodes whose name repeats an earlier node's (graph order, subgraphs included).

    ONNX Runtime refuses a graph with two nodes of one name ("two nodes with same node name"),
    while onnx's checker and many exporters and hand edits allow it. The first node keeps the
    name, later ones get ``name_1``, ``name_2``... (skipping names in use). Empty names are left
    alone (ORT accepts any number of them). A name repeated in another graph (the two branches of
    optimum's merged decoders) is legal, but renamed too, so that names stay unique once
    rewrites move work between scopes. Returns how many nodes repeated a name in their own graph.
    """
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    taken = {node.name for node in nodes if node.name}
    seen: set[str] = set()
    seen_in_graph: set[tuple[int, str]] = set()
    renamed = 0
    for node in nodes:
        name = node.name
        if not name:
            continue
        key = (id(node.graph), name)
        if key in seen_in_graph:
            renamed += 1
        seen_in_graph.add(key)
        if name not in seen:
            seen.add(name)
            continue
        node.name = free_name(name, taken)
        seen.add(node.name)
    return renamed


def unique_value_names(model: ir.Model) -> int:
    """Rename subgraph values whose name is already used elsewhere in the model.

    ONNX forbids a subgraph value to shadow a name of an enclosing scope (ONNX Runtime then
    reports "the graph is not acyclic"), but onnx-ir names new values per graph (``val_5`` in the
    main graph and in an If branch). The main graph keeps its names; subgraphs are visited outer
    scopes first and a repeated name becomes ``name_1``, ``name_2``... (skipping names in use).
    Returns how many values were renamed.
    """
    subgraphs = nested_graphs(model.graph)
    if not subgraphs:
        return 0
    graphs = [model.graph, *subgraphs]
    taken = {str(v.name) for graph in graphs for v in graph_values(graph) if v.name}
    seen = {str(v.name) for v in graph_values(model.graph) if v.name}
    renamed = 0
    for graph in subgraphs:
        for value in graph_values(graph):
            name = value.name
            if not name:
                continue
            if name in seen:
                value.name = free_name(name, taken)
                renamed += 1
            seen.add(str(value.name))
    return renamed


def free_name(name: str, taken: set[str]) -> str:
    """``name`` if ``taken`` lacks it, else ``name_1``, ``name_2``...: the first not in ``taken``,
    which it joins."""
    free, suffix = name, 1
    while free in taken:
        free = f"{name}_{suffix}"
        suffix += 1
    taken.add(free)
    return free


def graph_values(graph: ir.Graph) -> Iterator[ir.Value]:
    """The values a graph defines: its inputs, initializers and node outputs (renaming an
    initializer re-keys the graph's dict, so it is read as a list)."""
    yield from graph.inputs
    yield from list(graph.initializers.values())
    for node in graph:
        yield from node.outputs


def holds_map(kind: onnx.TypeProto) -> bool:
    """A map type, or a sequence / optional of one (ZipMap's ``seq(map(int64, float))``)."""
    while True:
        if kind.HasField("map_type"):
            return True
        if kind.HasField("sequence_type"):
            kind = kind.sequence_type.elem_type
        elif kind.HasField("optional_type"):
            kind = kind.optional_type.elem_type
        else:
            return False


MAP_TYPE = "onnxopt.map_type"  # a graph output's meta: its TypeProto, serialized


def type_text(kind: onnx.TypeProto) -> str:
    """``seq(map(int64, float))``: a type as inspect shows it (a tensor by its element type)."""
    if kind.HasField("tensor_type"):
        return onnx.TensorProto.DataType.Name(kind.tensor_type.elem_type).lower()
    if kind.HasField("sequence_type"):
        return f"seq({type_text(kind.sequence_type.elem_type)})"
    if kind.HasField("optional_type"):
        return f"optional({type_text(kind.optional_type.elem_type)})"
    if kind.HasField("map_type"):
        key = onnx.TensorProto.DataType.Name(kind.map_type.key_type).lower()
        return f"map({key}, {type_text(kind.map_type.value_type)})"
    return "?"


def _set_aside_map_types(where: str, proto: onnx.GraphProto) -> dict[str, bytes]:
    """Take map types out of the graph, which onnx-ir cannot hold; return the outputs' to restore.

    A classifier converted by skl2onnx (or onnxmltools) ends in a ZipMap whose output is a
    ``seq(map(int64, float))``: that output's type is kept aside (the value is typeless inside
    onnxopt, and :func:`serialize` writes the type back), and value_info entries of map types
    (annotations) are dropped. A map-typed graph input (DictVectorizer's) or a subgraph's
    interface is refused: validation cannot make such inputs.
    """
    kept: dict[str, bytes] = {}
    for current in _graph_protos(proto):
        assert isinstance(current, onnx.GraphProto)
        main = current is proto
        refused = [("input", info) for info in current.input]
        if not main:
            refused += [("subgraph output", info) for info in current.output]
        for label, info in refused:
            if holds_map(info.type):
                raise ModelLoadError(
                    f"{where}: {label} '{info.name}' is a map or a sequence of maps; a map-typed "
                    f"{label} is not supported (onnx-ir holds no map types)"
                )
        if main:
            for info in current.output:
                if holds_map(info.type):
                    kept[info.name] = info.type.SerializeToString()
                    info.ClearField("type")
        annotations = [info for info in current.value_info if not holds_map(info.type)]
        if len(annotations) != len(current.value_info):
            del current.value_info[:]
            current.value_info.extend(annotations)
    return kept


def _deserialize(where: str, proto: onnx.ModelProto) -> ir.Model:
    map_types = _set_aside_map_types(where, proto.graph)
    try:
        model = ir.serde.deserialize_model(proto)
    except RecursionError:
        raise ModelLoadError(f"{where}: the model nests subgraphs too deeply") from None
    except Exception as exc:  # onnx-ir rejects malformed protos with assorted exception types
        # onnx-ir wraps the cause in one "Error calling ..." per level; the innermost says what.
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        first_line = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise ModelLoadError(f"{where}: cannot read the graph: {first_line}") from exc
    if map_types:
        # on each output value (which a renaming keeps) and by name on the graph (which holds
        # when a pass puts another value in the output's place: inlining a function)
        model.graph.meta[MAP_TYPE] = map_types
        for output in model.graph.outputs:
            if output.name in map_types:
                output.meta[MAP_TYPE] = map_types[output.name]
    return model


def serialize(model: ir.Model) -> onnx.ModelProto:
    """The model's proto, with the map types of its outputs that loading set aside."""
    proto = ir.serde.serialize_model(model)
    for value, info in zip(model.graph.outputs, proto.graph.output, strict=True):
        kept = kept_map_type(model, value)
        if kept is not None:
            info.type.ParseFromString(kept)
    return proto


def kept_map_type(model: ir.Model, output: ir.Value) -> bytes | None:
    """The map type loading set aside for this graph output (serialized), if any."""
    kept: bytes | None = output.meta.get(MAP_TYPE)
    if kept is None and output.type is None:
        kept = model.graph.meta.get(MAP_TYPE, {}).get(str(output.name))
    return kept


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return serialize(model)


def parameter_bytes(model: ir.Model) -> int:
    total = 0
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            if value.const_value is not None:
                total += value.const_value.nbytes
    return total


def has_external_tensors(model: ir.Model) -> bool:
    """Whether weights live in external-data files (weights mapped from the model file do not count)."""
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and not isinstance(tensor, MappedTensor):
                return True
    return False


def has_mapped_tensors(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, MappedTensor) for v in model.graph.initializers.values())


_STREAM_CHUNK_BYTES = 16 * 1024 * 1024
_PLACEHOLDER = "onnxopt-streamed"


def _streamed(tensor: ir.TensorProtocol | None) -> bool:
    """Whether a main-graph initializer is written by streaming (large, or data in another file)."""
    if tensor is None or tensor.dtype == ir.DataType.STRING:
        return False
    return isinstance(tensor, ir.ExternalTensor) or tensor.nbytes >= MAPPED_MIN_BYTES


def tensor_bytes(tensor: ir.TensorProtocol) -> tuple[int, Iterator[bytes | memoryview]]:
    """The tensor's ``raw_data`` bytes: their count, then the bytes in bounded pieces.

    External data is read from its file in 16 MiB pieces, never mapped or copied whole; an array
    in memory is viewed, not copied.
    """
    if isinstance(tensor, ir.ExternalTensor) and tensor.length is not None:
        path, offset, length = tensor.path, tensor.offset or 0, tensor.length

        def from_file() -> Iterator[bytes]:
            with open(path, "rb") as f:
                f.seek(offset)
                remaining = length
                while remaining > 0:
                    piece = f.read(min(_STREAM_CHUNK_BYTES, remaining))
                    if not piece:
                        raise ModelLoadError(f"{path}: external data ended early")
                    remaining -= len(piece)
                    yield piece

        return length, from_file()
    if isinstance(tensor, ir.Tensor):
        array = tensor.numpy()
        if (
            array.dtype.itemsize * 8 == tensor.dtype.bitwidth
            and array.dtype.byteorder in "<=|"
            and array.flags.c_contiguous
        ):
            flat = array.reshape(-1).view("uint8").data
            return flat.nbytes, iter([flat])
    data = tensor.tobytes()
    return len(data), iter([data])


def _write_single_file(model: ir.Model, f: BinaryIO) -> None:
    """Write ``model`` as one protobuf file, streaming the large initializers' bytes.

    The graph is serialized with each large initializer replaced by a metadata-only stand-in;
    the file is then assembled field by field (protobuf allows any field order), each large
    tensor's ``raw_data`` written from its source (memory map, external file or array) in turn.
    Memory stays at one serialized graph plus one tensor, instead of the model twice.
    """
    # rare and small: load subgraph external data in memory
    for graph in nested_graphs(model.graph):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                value.const_value = ir.Tensor(
                    value.const_value.numpy(), name=value.const_value.name
                )
    graph_proto_values = [v for v in model.graph.initializers.values() if _streamed(v.const_value)]
    tensors: list[ir.TensorProtocol] = []
    for index, value in enumerate(graph_proto_values):
        tensor = value.const_value
        assert tensor is not None
        tensors.append(tensor)
        value.const_value = _reference_to(tensor, value, _PLACEHOLDER, index, None)
    try:
        proto = serialize(model)
    finally:
        for value, tensor in zip(graph_proto_values, tensors, strict=True):
            value.const_value = tensor
    initializers: list[tuple[bytes, ir.TensorProtocol | None]] = []
    for init in proto.graph.initializer:
        info = {entry.key: entry.value for entry in init.external_data}
        if init.data_location == onnx.TensorProto.EXTERNAL and info.get("location") == _PLACEHOLDER:
            tensor = tensors[int(info["offset"])]
            init.ClearField("external_data")
            init.ClearField("data_location")
            initializers.append((init.SerializeToString(), tensor))
        else:
            initializers.append((init.SerializeToString(), None))
    proto.graph.ClearField("initializer")
    graph_bytes = proto.graph.SerializeToString()
    proto.ClearField("graph")
    model_bytes = proto.SerializeToString()
    del proto

    raw_tag = _tag(_TENSOR_RAW_DATA, _WIRE_LEN)
    init_tag = _tag(_GRAPH_INITIALIZER, _WIRE_LEN)
    # (header, tensor streamed after it or None, its byte count, the initializer's length)
    entries: list[tuple[bytes, ir.TensorProtocol | None, int, int]] = []
    graph_length = len(graph_bytes)
    for header, tensor in initializers:
        if tensor is None:
            count, body = 0, len(header)
        else:
            count = _raw_size(tensor)
            body = len(header) + len(raw_tag) + len(_varint(count)) + count
        entries.append((header, tensor, count, body))
        graph_length += len(init_tag) + len(_varint(body)) + body
    f.write(model_bytes)
    f.write(_tag(_MODEL_GRAPH, _WIRE_LEN) + _varint(graph_length))
    f.write(graph_bytes)
    for header, tensor, count, body in entries:
        if tensor is None:
            f.write(init_tag + _varint(body) + header)
            continue
        f.write(init_tag + _varint(body) + header + raw_tag + _varint(count))
        _stream_tensor(tensor, f, count)


def _reference_to(
    tensor: ir.TensorProtocol, value: ir.Value, location: str, offset: int, length: int | None
) -> ir.ExternalTensor:
    """A stand-in for ``tensor`` (its type, name and metadata, no data) that serializes as a
    reference to ``length`` bytes at ``offset`` of ``location``."""
    return ir.ExternalTensor(
        location,
        offset,
        length,
        tensor.dtype,
        shape=ir.Shape(list(tensor.shape.numpy())),
        name=tensor.name or value.name or "",
        doc_string=tensor.doc_string,
        metadata_props=dict(tensor.metadata_props),
    )


def _raw_size(tensor: ir.TensorProtocol) -> int:
    """The byte count of the tensor's raw data: an in-memory tensor knows it, an external one is
    measured without reading it."""
    return tensor_bytes(tensor)[0] if isinstance(tensor, ir.ExternalTensor) else tensor.nbytes


def _stream_tensor(tensor: ir.TensorProtocol, f: BinaryIO, count: int) -> None:
    """Write the tensor's ``count`` bytes of raw data at ``f``'s position, one bounded piece at a
    time (file to file in the kernel where it can)."""
    if isinstance(tensor, ir.ExternalTensor) and _copy_in_kernel(tensor, f):
        return
    size, pieces = tensor_bytes(tensor)
    if size != count:
        raise ModelSaveError(f"tensor '{tensor.name}': {size} bytes, expected {count}")
    for piece in pieces:
        f.write(piece)


# Initializers over this many bytes go to the external data file (smaller ones stay inline, where
# shape inference and folding read them).
EXTERNAL_MIN_BYTES = 1024


def _write_with_external_data(model: ir.Model, f: BinaryIO, data: BinaryIO, location: str) -> None:
    """Write ``model`` to ``f`` and its initializers over ``EXTERNAL_MIN_BYTES`` to ``data``,
    which the model names ``location`` (relative to the model's folder).

    The tensors are streamed one at a time, packed in graph order (main graph, then subgraphs);
    small tensors whose data is external are read in, so the written model needs no other file.
    The model is left as it was.
    """
    values = [v for graph in all_graphs(model) for v in graph.initializers.values()]
    tensors = [v.const_value for v in values]
    offset = 0
    try:
        for value, tensor in zip(values, tensors, strict=True):
            if tensor is None or tensor.dtype == ir.DataType.STRING:
                continue
            if tensor.nbytes > EXTERNAL_MIN_BYTES:
                length = _raw_size(tensor)
                _stream_tensor(tensor, data, length)
                value.const_value = _reference_to(tensor, value, location, offset, length)
                offset += length
            elif isinstance(tensor, ir.ExternalTensor):
                value.const_value = _read_in(tensor)
        f.write(serialize(model).SerializeToString())
    finally:
        for value, tensor in zip(values, tensors, strict=True):
            value.const_value = tensor


def _read_in(tensor: ir.ExternalTensor) -> ir.TensorProtocol:
    """A copy in memory of a (small) external tensor, read from its file rather than mapped: a
    mapping per tensor holds a file descriptor each."""
    _, pieces = tensor_bytes(tensor)
    proto = onnx.TensorProto(
        name=tensor.name or "",
        data_type=tensor.dtype.value,
        dims=list(tensor.shape.numpy()),
        raw_data=b"".join(pieces),
        doc_string=tensor.doc_string or "",
    )
    return ir.serde.deserialize_tensor(proto)


# copy_file_range errors that are the target's (a full disk, a quota, a file size limit), not
# a sign the kernel cannot copy between the two files: those once read "external data ended early".
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _copy_in_kernel(tensor: ir.ExternalTensor, f: BinaryIO) -> bool:
    """Copy an external tensor's bytes file to file without passing them through Python.

    Returns False, having written nothing, where the kernel cannot do it (no ``copy_file_range``,
    another file system type, a pipe); the caller then copies through a buffer.
    """
    copy = getattr(os, "copy_file_range", None)
    if copy is None or tensor.length is None:
        return False
    f.flush()
    with open(tensor.path, "rb") as source:
        offset, remaining = tensor.offset or 0, tensor.length
        copied = 0
        while remaining > 0:
            try:
                done = copy(source.fileno(), f.fileno(), remaining, offset + copied)
            except OSError as exc:
                if exc.errno in _WRITE_ERRORS:
                    raise  # the target is full: save_model says so ("cannot write")
                done = 0  # the kernel cannot copy between these files
            if done <= 0:
                if copied == 0:
                    return False
                raise ModelSaveError(f"{tensor.path}: external data ended early")
            copied += done
            remaining -= done
    return True


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (any spelling, symlink or hard link)."""
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
    protected: tuple[Path, ...] = (),
) -> Path:
    """Write the model atomically: temp files in the target folder, fsync, then rename.

    ``external_data``: True always writes weights to ``<name>.data`` beside the model, False never
    does, None decides by size (past ~1.8 GB, the protobuf limit). ``protected`` lists files (the
    input model and its external data) that must never be overwritten.

    With external data both files are written under temp names, synced, and renamed data first,
    then model: a failure (a full disk, Ctrl-C) leaves neither a partial file nor a temp file,
    and an earlier output pair as it was.
    """
    target = Path(path)
    for keep in protected:
        if same_file(target, keep):
            raise UsageError(
                f"{target}: refusing to overwrite the input model's file '{keep}' (--overwrite allows it)"
            )
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise ModelSaveError(f"{target}: folder '{folder}' does not exist")
    if external_data is None:
        # Keep weights external when they came that way, and whenever the protobuf limit demands it.
        use_external = (
            has_external_tensors(model) or parameter_bytes(model) > EXTERNAL_DATA_AUTO_THRESHOLD
        )
    else:
        use_external = external_data
    data_name = target.name + ".data"
    data_target = folder / data_name
    if use_external:
        for keep in protected:
            if same_file(data_target, keep):
                raise UsageError(
                    f"{target}: its external data file '{data_name}' would overwrite an input file"
                )
    elif parameter_bytes(model) > EXTERNAL_DATA_AUTO_THRESHOLD:
        raise ModelSaveError(
            f"{target}: weights exceed the 2 GiB protobuf limit; external data is required"
        )
    renamed = [target, data_target] if use_external else [target]
    for file in renamed:
        with contextlib.suppress(FileNotFoundError):
            mode = file.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                # The temp file is renamed over it: that would replace a device or a FIFO.
                raise ModelSaveError(f"{file}: exists and is not a regular file")
    temps: list[Path] = []
    try:
        tmp = _temp_file(folder, target.name, temps)
        if use_external:
            data_tmp = _temp_file(folder, data_name, temps)
            with tmp.open("wb") as out, data_tmp.open("wb") as data:
                _write_with_external_data(model, out, data, data_name)
                _sync(data)
                _sync(out)
        else:
            with tmp.open("wb") as out:
                _write_single_file(model, out)
                _sync(out)
        _pin_mapped_sources(model, renamed)
        # Data first: the model that names it appears only once it is complete.
        for temp, file in reversed(list(zip(temps, renamed, strict=True))):
            os.replace(temp, file)
        _sync_folder(folder)
    except (OSError, ValueError) as exc:
        raise ModelSaveError(f"{target}: cannot write ({exc})") from exc
    finally:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
    return target


def _temp_file(folder: Path, name: str, made: list[Path]) -> Path:
    """A new empty file ``.NAME.*.tmp`` in ``folder``, added to ``made`` (for the cleanup)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    made.append(Path(tmp_name))
    leave_no_trace(tmp_name)
    # mkstemp makes the file private (0600); the output should get the mode any new file gets.
    os.chmod(tmp_name, 0o666 & ~_current_umask())
    return Path(tmp_name)


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def _sync_folder(folder: Path) -> None:
    """Make the renames durable (where the platform lets a folder be opened and synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pin_mapped_sources(model: ir.Model, targets: list[Path]) -> None:
    """Map now the weights that live in ``targets``, which are about to be replaced (``--overwrite``).

    A mapping keeps the old file's contents after the rename; a tensor mapped only later would
    read the new file at the old offsets.
    """
    existing = [t for t in targets if t.exists()]
    if not existing:
        return
    replaced: dict[str, bool] = {}  # per source path: whether it is one of ``existing``
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            source = tensor.path
            if source not in replaced:
                replaced[source] = any(same_file(Path(source), t) for t in existing)
            if replaced[source]:
                tensor.numpy()


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mapped_arrays(model: ir.Model) -> dict[str, np.ndarray]:
    """The main graph's weights mapped from the source file, by name, as read-only array views.

    Only those a node (of any graph) or a graph output reads: ORT drops an unread initializer
    before it takes the buffers, and a buffer named for a dropped one fails the session's load.

    Empty when one of them has a type numpy lacks (bfloat16, float8, int4: ml_dtypes arrays,
    which ``OrtValue.ortvalue_from_numpy`` refuses): the caller then hands ORT a file instead.
    """
    mapped = {
        str(value.name): value.const_value
        for value in model.graph.initializers.values()
        if isinstance(value.const_value, MappedTensor) and (value.uses() or value.is_graph_output())
    }
    if any(tensor.dtype.numpy().type.__module__ != "numpy" for tensor in mapped.values()):
        return {}
    return {name: tensor.numpy() for name, tensor in mapped.items()}


@contextlib.contextmanager
def ort_model_source(model: ir.Model, *, mapped_in_memory: bool = False) -> Iterator[bytes | str]:
    """Something ``onnxruntime.InferenceSession`` accepts: serialized bytes, or a temp path for big models.

    ``mapped_in_memory``: the caller hands ORT the ``mapped_arrays`` itself (SessionOptions'
    ``add_external_initializers``), so the bytes may reference them without their data.
    """
    external = has_external_tensors(model) or parameter_bytes(model) >= EXTERNAL_DATA_AUTO_THRESHOLD
    if not external and (mapped_in_memory or not has_mapped_tensors(model)):
        yield to_proto(model).SerializeToString()
        return
    with temp_folder("onnxopt-") as tmp:
        path = Path(tmp) / "model.onnx"
        if external:
            with path.open("wb") as out, (path.parent / "model.onnx.data").open("wb") as data:
                _write_with_external_data(model, out, data, "model.onnx.data")
        else:  # weights mapped from the source file: one streamed file, never a bytes copy
            with path.open("wb") as out:
                _write_single_file(model, out)
        yield str(path)


_T = TypeVar("_T")

# Initializers past this many bytes travel to an onnx C++ call as typed inputs, without data.
_ONNX_API_TENSOR_LIMIT = 1000


def call_onnx_api(
    func: Callable[[onnx.ModelProto], _T],
    model: ir.Model,
    *,
    vectors_without_data: bool = False,
    subgraph_weights: bool = False,
) -> _T:
    """``func`` on the model's protobuf with weights over 1 kB as typed inputs; the model is left
    as it was.

    ``vectors_without_data`` (for shape inference): such a weight that is 1-D and not of an
    integer type goes in as an initializer with its dims and no data instead. ONNX's data
    propagation turns every 1-D *input* an Add, Mul, Concat... reads into a shape of that many
    unknown dims (about 80 bytes each): 20k biases of 512 floats took 800 MB. It never reads a
    float initializer's data, and a float vector is never a shape.

    ``subgraph_weights`` (for shape inference): a large initializer of an If/Loop body goes in
    the same way, as one of the main graph (the body sees it as an outer-scope value), so that
    a branch's weights are not copied into the protobuf either.

    onnx-ir's ``_c_api_utils.call_onnx_api`` does this too, but tests each initializer against the
    input list: quadratic, 12 s per call for 20k initializers (a Concat of 20k constants), 4 calls
    per shape inference round.
    """
    graphs = all_graphs(model) if subgraph_weights else [model.graph]
    initializers = [(graph, value) for graph in graphs for value in graph.initializers.values()]
    tensors = [v.const_value for _, v in initializers]
    original_inputs = tuple(model.graph.inputs)
    is_input = set(original_inputs)
    dataless: list[onnx.TensorProto] = []
    for graph, value in initializers:
        tensor = value.const_value
        if tensor is not None:
            if value.shape is None:
                value.shape = tensor.shape  # type: ignore[assignment]
            if value.dtype is None:
                value.dtype = tensor.dtype
        large = tensor is None or tensor.nbytes > _ONNX_API_TENSOR_LIMIT
        if graph is not model.graph and not large:
            continue  # small ones stay in their body, with their data
        if large:
            value.const_value = None
            graph.initializers.pop(str(value.name))
        if (
            vectors_without_data
            and large
            and tensor is not None
            and value not in is_input
            and len(tensor.shape) == 1
            and not tensor.dtype.is_integer()
        ):
            dataless.append(
                onnx.TensorProto(
                    name=value.name, data_type=tensor.dtype.value, dims=list(tensor.shape.numpy())
                )
            )
        elif value not in is_input:
            model.graph.inputs.append(value)
    try:
        proto = serialize(model)
        proto.graph.initializer.extend(dataless)
        return func(proto)
    finally:
        model.graph.inputs.clear()
        model.graph.inputs.extend(original_inputs)
        for (graph, value), tensor in zip(initializers, tensors, strict=True):
            value.const_value = tensor
            if str(value.name) not in graph.initializers:
                graph.initializers.add(value)


def convert_opset(model: ir.Model, version: int) -> ir.Model:
    """The model with its default-domain opset raised to ``version`` by onnx.version_converter.

    Weights do not travel through protobuf: large initializers become typed inputs for the
    conversion (the converter reads op signatures, not weights) and are put back afterwards, so
    external data stays memory-mapped. Raises UsageError when ``version`` is below the model's
    opset or beyond what the installed onnx knows, or when the converter fails.
    """
    from onnx import version_converter

    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if current is None:
        raise UsageError(f"--opset {version}: the model imports no default-domain opset")
    if version < current:
        raise UsageError(
            f"--opset {version}: the model already uses opset {current}; opsets can only be raised"
        )
    if version > MAX_OPSET:
        raise UsageError(
            f"--opset {version}: onnx {onnx.__version__} converts up to opset {MAX_OPSET}"
        )
    if version == current:
        return model
    inputs = {v.name for v in model.graph.inputs}
    weights = {name: v.const_value for name, v in model.graph.initializers.items()}

    def convert(proto: onnx.ModelProto) -> onnx.ModelProto:
        return version_converter.convert_version(proto, version)

    try:
        converted_proto = call_onnx_api(convert, model)
    except Exception as exc:  # the converter raises assorted C++ errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"--opset {version}: onnx.version_converter cannot convert this model from opset "
            f"{current}: {first}"
        ) from exc
    converted = _deserialize("<converted model>", converted_proto)
    # The small ones went in with their data, or, stored as external data, as a reference to the
    # file that reads back relative to no folder: those are the original tensors again.
    for name, value in converted.graph.initializers.items():
        if isinstance(value.const_value, ir.ExternalTensor) and weights.get(name) is not None:
            value.const_value = weights[name]
    # Every initializer went in as an input too (the big ones without their data): undo both.
    for value in list(converted.graph.inputs):
        name = value.name or ""
        if name in inputs or name not in weights:
            continue
        converted.graph.inputs.remove(value)
        if name not in converted.graph.initializers:
            value.const_value = weights[name]
            converted.graph.register_initializer(value)
    return converted
