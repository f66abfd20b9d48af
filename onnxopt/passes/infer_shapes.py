from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator

import onnx
import onnx_ir as ir

from onnxopt import io
from onnxopt.guard import doing
from onnxopt.ops import all_graphs, static_shape
from onnxopt.passes._contrib_shapes import graph_protos, with_stand_ins
from onnxopt.passes._refine_shapes import (
    EXPRESSION,
    GENERATED_DIM_PREFIX,
    dim_names,
    interface_names,
    refine_shapes,
)
from onnxopt.passes.base import Pass, PassResult

logger = logging.getLogger(__name__)


def _known_dims(shape: ir.Shape | None) -> int:
    if shape is None:
        return -1
    return sum(isinstance(d, int) for d in shape)


def _precision(dim: int | ir.SymbolicDim) -> int:
    """3 for a size, 2 for a named dim, 1 for ONNX's placeholder name ("unk__3": a dim it could
    not tell, whose name a later inference may find), 0 for an unknown one."""
    if isinstance(dim, int):
        return 3
    if dim.value is None:
        return 0
    return 1 if str(dim.value).startswith(GENERATED_DIM_PREFIX) else 2


def _more_precise(old: ir.Shape | None, new: ir.Shape) -> ir.Shape | None:
    """``old`` with each dim ``new`` knows better (a size, or a name for an unknown dim); None if
    ``new`` adds nothing.

    Both describe the same value, so they can be merged dim by dim. A recorded shape whose dim is
    unknown (an exporter's annotation, or one inferred before a rewrite exposed more) learns the
    name inference now finds; else a later run, inferring from scratch, would see what this one
    did not, and the optimized file would not be a fixed point.
    """
    if old is None or len(old) != len(new):
        return new if _known_dims(new) > _known_dims(old) else None
    better = [_precision(b) > _precision(a) for a, b in zip(old, new, strict=True)]
    if not any(better):
        return None
    return ir.Shape([b if up else a for a, b, up in zip(old, new, better, strict=True)])


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


def _value_infos(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """Inferred types by value name, over the graph and its subgraphs; names seen twice are dropped."""
    found: dict[str, onnx.ValueInfoProto] = {}
    ambiguous: set[str] = set()
    for current in graph_protos(graph):
        for info in (*current.value_info, *current.output):
            if io.holds_map(info.type):  # ZipMap's output: onnx-ir holds no map types
                continue
            if info.name in found and found[info.name].type != info.type:
                ambiguous.add(info.name)
            found[info.name] = info
    for name in ambiguous:
        del found[name]
    return found


# ONNX's data propagation holds every element of a 1-D tensor value it meets (not an initializer)
# as a dim (80-200 bytes each) whatever its dtype: a [50_000_000] float input took 8 GB and a
# minute, and 20k [512] values 800 MB. Shape tensors are far smaller than either limit.
MAX_DATA_PROP_ELEMENTS = 65536
MAX_DATA_PROP_TOTAL = 1 << 21
_NO_DATA_PROP = (
    f"shape inference ran without data propagation: the model's 1-D tensors have over "
    f"{MAX_DATA_PROP_ELEMENTS} elements in one or {MAX_DATA_PROP_TOTAL} in all, and ONNX's "
    "propagation would hold each as a dim"
)


def _vector_sizes(proto: onnx.ModelProto) -> tuple[int, int]:
    """The largest and the total static size of the 1-D tensor values in ``proto`` (inferred
    without data propagation). Initializers are left out: propagation reads only an integer
    one's data, and those travel inline only up to 1 kB."""
    longest = total = 0
    for graph in graph_protos(proto.graph):
        for info in (*graph.input, *graph.value_info, *graph.output):
            dims = info.type.tensor_type.shape.dim
            if len(dims) == 1 and dims[0].HasField("dim_value"):
                longest = max(longest, dims[0].dim_value)
                total += dims[0].dim_value
    return longest, total


# An outer-scope initializer at most this large is copied into a branch inferred on its own (its
# values can feed data propagation: shape constants); a larger one is given as a typed input.
_BRANCH_CONSTANT_BYTES = 1024


def _reinfer_if_branches(
    proto: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> int:
    """Infer each If branch of the inferred ``proto`` again as a model of its own; return how many.

    ONNX infers a subgraph with its outer scope's types but propagates no data into it, so a
    branch holding a whole decoder (optimum's merged decoders: ``If(use_cache_branch)``) gets
    "unk" dims after its first Reshape, and no fusion there can prove a shape. On its own, with
    the outer values it reads as typed inputs (small outer constants as initializers), the branch
    gets the main graph's data propagation. Its value_info and output types are replaced in place.
    """
    graphs = list(graph_protos(proto.graph))
    branching = [
        node
        for graph in graphs
        for node in graph.node
        if node.op_type == "If" and node.domain in ("", "ai.onnx")
    ]
    if not branching:  # (the type tables below cost more than inference on a graph without Ifs)
        return 0
    types: dict[str, onnx.TypeProto] = {}
    constants: dict[str, onnx.TensorProto] = {}
    used: set[str] = set()  # every dim name of the model
    for graph in graphs:
        for info in (*graph.input, *graph.value_info, *graph.output):
            types.setdefault(info.name, info.type)
            used.update(d.dim_param for d in info.type.tensor_type.shape.dim if d.dim_param)
        for tensor in graph.initializer:
            constants.setdefault(tensor.name, tensor)
    done = 0
    for node in branching:
        for attr in node.attribute:
            if attr.HasField("g") and _reinfer_branch(
                attr.g, types, constants, proto, infer, f"if{done}", used
            ):
                done += 1
    return done


def _reinfer_branch(
    branch: onnx.GraphProto,
    types: dict[str, onnx.TypeProto],
    constants: dict[str, onnx.TensorProto],
    proto: onnx.ModelProto,
    infer: Callable[[onnx.ModelProto], onnx.ModelProto],
    tag: str,
    used: set[str],
) -> bool:
    defined: set[str] = set()
    read: dict[str, None] = {}  # in order of first use: the inputs' order is deterministic
    for graph in graph_protos(branch):
        defined.update(i.name for i in graph.input)
        defined.update(t.name for t in graph.initializer)
        for node in graph.node:
            defined.update(node.output)
            read.update(dict.fromkeys(node.input))
    outer = [name for name in read if name and name not in defined]
    if any(name not in types and name not in constants for name in outer):
        return False
    alone = onnx.GraphProto(name=branch.name or "branch")
    alone.node.extend(branch.node)
    alone.initializer.extend(branch.initializer)
    alone.output.extend(branch.output)
    alone.value_info.extend(branch.value_info)  # inferred as recorded, like the main graph
    for name in outer:
        tensor = constants.get(name)
        if tensor is not None and tensor.ByteSize() <= _BRANCH_CONSTANT_BYTES:
            alone.initializer.append(tensor)
        else:
            alone.input.append(onnx.ValueInfoProto(name=name, type=types[name]))
    model = onnx.ModelProto(
        ir_version=proto.ir_version, opset_import=proto.opset_import, graph=alone
    )
    model.functions.extend(proto.functions)
    try:
        inferred = infer(model)
    except Exception:  # best effort: the branch keeps what the whole-model run found
        return False
    # A run of its own makes up dim names (unk__0 ...) that other runs (the main graph's, another
    # branch's, an earlier pass's) also made up for other dims: each name this run made up is
    # renamed to one no graph of the model uses, so that no two dims share a name.
    known = {
        dim.dim_param
        for info in (*alone.input, *alone.value_info, *alone.output)
        for dim in info.type.tensor_type.shape.dim
    }
    fresh: dict[str, str] = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        for dim in info.type.tensor_type.shape.dim:
            name = dim.dim_param
            if not name.startswith(GENERATED_DIM_PREFIX) or name in known:
                continue
            if name not in fresh:
                index = len(fresh)
                while f"{GENERATED_DIM_PREFIX}{tag}_{index}" in used:
                    index += 1
                fresh[name] = f"{GENERATED_DIM_PREFIX}{tag}_{index}"
                used.add(fresh[name])
            dim.dim_param = fresh[name]
    outer_names = set(outer)
    del branch.value_info[:]
    branch.value_info.extend(i for i in inferred.graph.value_info if i.name not in outer_names)
    for output, found in zip(branch.output, inferred.graph.output, strict=False):
        if found.name == output.name:
            output.type.CopyFrom(found.type)
    for info in (*branch.value_info, *branch.output):
        types[info.name] = info.type
    return True


# onnxruntime-genai's builder annotates every intermediate dim it cannot tell "unk": one name for
# many different dims, so not a claim that they are equal (ONNX inference, which keeps a name it
# finds recorded, then kept [unk, unk] where it could prove [sequence_length, sequence_length],
# and the second optimize run, the annotation gone, shared shape reads the first had not).
ANONYMOUS_DIM = "unk"


def _unname_anonymous_dims(model: ir.Model) -> int:
    """Make every intermediate dim named ``ANONYMOUS_DIM`` an unknown one; return how many."""
    unnamed = 0
    for graph in all_graphs(model):
        for node in graph:
            for value in node.outputs:
                shape = value.shape
                if shape is None or value.is_graph_output():
                    continue
                anonymous = [
                    isinstance(d, ir.SymbolicDim) and d.value == ANONYMOUS_DIM for d in shape
                ]
                if any(anonymous):
                    dims = [None if a else d for a, d in zip(anonymous, shape, strict=True)]
                    value.shape = ir.Shape(dims)
                    unnamed += sum(anonymous)
    return unnamed


def _made_up(name: str, interface: frozenset[str]) -> bool:
    """A name a shape inference made up ("unk__N"), or an exporter's expression for an
    intermediate dim that the model's inputs and outputs do not use."""
    return name.startswith(GENERATED_DIM_PREFIX) or (
        EXPRESSION.search(name) is not None and name not in interface
    )


def _is_placeholder(dim: object, interface: frozenset[str]) -> bool:
    """A dim under a made-up name (see ``_made_up``)."""
    name = getattr(dim, "value", None)
    return isinstance(name, str) and _made_up(name, interface)


def _placeholder_dims(
    graph: onnx.GraphProto, interface: frozenset[str]
) -> Iterator[onnx.TensorShapeProto.Dimension]:
    """The dims under made-up names in ``graph``'s value_info and its subgraphs'."""
    for current in graph_protos(graph):
        for info in current.value_info:
            for dim in info.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and _made_up(dim.dim_param, interface):
                    yield dim


def _resolved_placeholders(
    model: ir.Model, fresh: dict[str, onnx.ValueInfoProto], interface: frozenset[str]
) -> dict[str, int | str]:
    """Made-up names that inference without them proves to be a declared symbol, a size, or the
    same dim as another made-up name.

    ONNX inference keeps a name it finds recorded: a placeholder recorded for ``Cast(Reshape(mask))``
    ([unk__0, unk__3]) survives the rewrite to ``Cast(mask)``, whose dims are [batch, sequence].
    Inferred afresh, the dim reads "batch"; every dim named unk__0 is that same dim, so the name
    can be replaced everywhere (the first proof, in graph order, wins). Two recorded placeholders
    that the fresh run names alike (``InstanceNormalization(x)`` recorded as [b, c, unk__1] after
    its input's Reshape went, x as [b, c, unk__0]) are one dim: both take the name seen first.
    """
    found: dict[str, int | str] = {}
    order: dict[str, int] = {}  # recorded placeholders in graph order
    parent: dict[str, str] = {}  # union-find over recorded placeholders; the root is seen first
    first_as: dict[str, str] = {}  # fresh placeholder -> the recorded one first inferred as it

    def root(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    for graph in all_graphs(model):
        for value in _graph_values(graph):
            info = fresh.get(value.name or "")
            if info is None or value.shape is None:
                continue
            if not any(_is_placeholder(dim, interface) for dim in value.shape):
                continue  # (most values: skipped before the costlier read of the fresh shape)
            shape = ir.serde.deserialize_type_proto_for_shape(info.type)
            if shape is None or len(shape) != len(value.shape):
                continue
            for before, after in zip(value.shape, shape, strict=True):
                if not _is_placeholder(before, interface):
                    continue
                old = str(before.value)  # type: ignore[union-attr]
                order.setdefault(old, len(order))
                if isinstance(after, int):
                    found.setdefault(old, after)
                elif after.value is not None and not _is_placeholder(after, interface):
                    found.setdefault(old, str(after.value))
                elif after.value is not None and old.startswith(GENERATED_DIM_PREFIX):
                    # (an exporter's expression is renamed only where a dim is proved to be it)
                    a, b = root(first_as.setdefault(str(after.value), old)), root(old)
                    if a != b:
                        a, b = sorted((a, b), key=order.__getitem__)
                        parent[b] = a
    # A class of equal placeholders takes the first proof any member has, else its first name.
    proofs: dict[str, int | str] = {}
    for name in order:  # graph order
        if name in found:
            proofs.setdefault(root(name), found[name])
    resolved: dict[str, int | str] = {}
    for name in order:
        target = proofs.get(root(name), root(name))
        if target != name:
            resolved[name] = target
    return resolved


def _rename_placeholders(
    model: ir.Model, names: dict[str, int | str], interface: frozenset[str]
) -> int:
    renamed = 0
    for graph in all_graphs(model):
        for value in _graph_values(graph):
            shape = value.shape
            if shape is None or not any(
                _is_placeholder(d, interface) and str(d.value) in names  # type: ignore[union-attr]
                for d in shape
            ):
                continue
            dims: list[int | ir.SymbolicDim] = []
            for dim in shape:
                target = names.get(str(dim.value)) if _is_placeholder(dim, interface) else None  # type: ignore[union-attr]
                if target is None:
                    dims.append(dim)
                else:
                    dims.append(target if isinstance(target, int) else ir.SymbolicDim(target))
            value.shape = ir.Shape(dims)
            renamed += 1
    return renamed


def _graph_values(graph: ir.Graph) -> list[ir.Value]:
    values = [*graph.inputs]
    for node in graph:
        values.extend(node.outputs)
    return values


def _known(value: ir.Value) -> bool:
    """Whether ``value`` has a type and a static shape: nothing inference finds is more precise."""
    return value.type is not None and static_shape(value) is not None


def _fully_known(model: ir.Model) -> bool:
    """Whether every value a graph defines (inputs, node outputs) is ``_known``."""
    return all(_known(value) for graph in all_graphs(model) for value in _graph_values(graph))


# The stats of a run that only recorded what ONNX inference itself found: a second run would infer
# the same again from the same inputs (settled). A refined dim or a renamed placeholder can let it
# infer more downstream: on the regression set, 26 of the 68 runs that made either were followed
# by a run that changed more; none of the 365 that made neither.
_ONNX_INFERENCE_ONLY = frozenset({"shapes inferred", "types inferred"})


class InferShapesPass(Pass):
    """Run ONNX shape inference (with data propagation) and record every value's type and shape.

    Symbolic dims stay symbolic; dims are pinned only for inputs named with ``--input-shape``.
    A value only gains information: a shape already known is never replaced by a less precise one,
    and a more precise one is merged in dim by dim (a size, or a name for an unknown dim).
    """

    name = "infer-shapes"
    summary = "ONNX shape/type inference with data propagation; symbolic dims stay symbolic"
    # ONNX inference visits nodes in order, each from its inputs; the refinements and placeholder
    # proofs read a node's inputs and outputs, or a value's shape as inferred from its inputs.
    reads_producers_only = True

    def call(self, model: ir.Model) -> PassResult:
        stats: Counter[str] = Counter()
        if self.options.input_shapes:
            pinned = pin_input_shapes(model, self.options.input_shapes)
            if pinned:
                stats["inputs pinned"] = pinned
        if _fully_known(model):
            # Every value has a type and a static shape: inference could only find them again,
            # and nothing is more precise (most CNN exports, annotated by the exporter or by
            # onnxsim/onnxslim, and kept so by the rewrites).
            settled = set(stats) <= _ONNX_INFERENCE_ONLY
            return PassResult(model, modified=bool(stats), stats=stats, settled=settled)

        data_prop = True
        interface = interface_names(model)
        if ANONYMOUS_DIM not in interface:
            unnamed = _unname_anonymous_dims(model)
            if unnamed:
                stats["dims named 'unk' unnamed"] = unnamed

        def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
            with doing("onnx's shape inference ran on the model"):
                return onnx.shape_inference.infer_shapes(
                    proto, check_type=False, strict_mode=False, data_prop=data_prop
                )

        def infer_both(
            proto: onnx.ModelProto,
        ) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
            """Inference as recorded, then a second run without the made-up names (one
            serialization of the model for both: it costs more than either inference)."""
            nonlocal data_prop
            # ORT's ops are unknown to ONNX inference: shape-preserving ones become Identity here
            # (this proto is a throwaway copy), so the values after them keep their shapes.
            with_stand_ins(proto)
            with doing("onnx's shape inference ran on the model"):
                longest, total = _vector_sizes(
                    onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False)
                )
            if longest > MAX_DATA_PROP_ELEMENTS or total > MAX_DATA_PROP_TOTAL:
                data_prop = False
                logger.info(
                    "1-D tensors of %d elements (%d in one): shape inference runs without "
                    "data propagation",
                    total,
                    longest,
                )
            inferred = infer(proto)
            _reinfer_if_branches(inferred, infer)
            if next(_placeholder_dims(proto.graph, interface), None) is None:
                return inferred, inferred  # (nothing to forget: a second run would repeat this one)
            bare = onnx.ModelProto()
            bare.CopyFrom(proto)
            for dim in _placeholder_dims(bare.graph, interface):
                dim.ClearField("dim_param")
            try:
                afresh = infer(bare)
                _reinfer_if_branches(afresh, infer)
            except Exception:  # the first run succeeded; this one only adds names
                return inferred, None
            return inferred, afresh

        try:
            inferred, afresh = io.call_onnx_api(
                infer_both, model, vectors_without_data=True, subgraph_weights=True
            )
        except (
            Exception
        ) as exc:  # inference is best-effort: a model it cannot handle stays as it is
            logger.warning(
                "shape inference failed, shapes left as they were: %s", str(exc).splitlines()[0]
            )
            return PassResult(
                model, modified=bool(stats), stats=stats, notes=[f"shape inference failed: {exc}"]
            )
        # The made-up names the second run resolves are renamed everywhere.
        if afresh is not None:
            resolved = _resolved_placeholders(model, _value_infos(afresh.graph), interface)
            if resolved:
                stats["placeholder dims resolved"] += _rename_placeholders(
                    model, resolved, interface
                )
        # Read only the inferred types (deserializing the whole inferred model costs more than inference).
        infos = _value_infos(inferred.graph)
        for graph in all_graphs(model):
            for value in _graph_values(graph):
                if _known(value):
                    continue
                info = infos.get(value.name or "")
                if info is None:
                    continue
                dtype_type = ir.serde.deserialize_type_proto_for_type(info.type)
                shape = ir.serde.deserialize_type_proto_for_shape(info.type)
                if value.type is None and dtype_type is not None:
                    value.type = dtype_type
                    stats["types inferred"] += 1
                merged = _more_precise(value.shape, shape) if shape is not None else None
                if merged is not None:
                    value.shape = merged
                    stats["shapes inferred"] += 1
        refined = refine_shapes(model)  # dims ONNX loses though an op provably copies them
        if refined:
            stats["shapes refined"] += refined
        notes = [] if data_prop else [_NO_DATA_PROP]
        settled = set(stats) <= _ONNX_INFERENCE_ONLY
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes, settled=settled)


def declared_output_dims(model: ir.Model) -> dict[str, tuple[int | str | None, ...] | None]:
    """The main graph's outputs' dims as the file declares them, as plain values (a size, a
    name, None), for :func:`keep_declared_outputs`."""
    return {
        str(value.name): None
        if value.shape is None
        else tuple(dim if isinstance(dim, int) else dim.value for dim in value.shape)
        for value in model.graph.outputs
    }


# Output dims set aside by forget_private_output_names: (output name, axis) -> declared name.
PrivateNames = dict[tuple[str, int], str]


def forget_private_output_names(model: ir.Model) -> PrivateNames:
    """Clear the main graph's output dims whose names appear nowhere else (on no input, on no
    other output dim) and are not made up (ONNX's "unk__", an exporter's expression, which
    refinement already replaces). TorchScript names an output's dynamic axes itself
    (``LayerNormalizationencoder_last_hidden_state_dim_0``): such a name says nothing about
    other tensors, yet inference keeps it over the name it would find ("batch"), and an
    encoder's output read inside the model (an encoder-decoder's cross-attention mask) then
    matches nothing. Cleared, inference names the dim; :func:`restore_private_output_names`
    writes the declared names back. Returns what was cleared."""
    inputs = set(dim_names(model.graph.inputs))
    counts = Counter(dim_names(model.graph.outputs))
    cleared: PrivateNames = {}
    for value in model.graph.outputs:
        if value.shape is None or value.is_graph_input():
            continue
        dims = list(value.shape)
        for axis, dim in enumerate(dims):
            name = dim.value if isinstance(dim, ir.SymbolicDim) else None
            if (
                name is None
                or str(name) in inputs
                or counts[str(name)] != 1
                or _made_up(str(name), frozenset())
            ):
                continue
            cleared[(str(value.name), axis)] = str(name)
            dims[axis] = ir.SymbolicDim(None)
        if len(dims) == len(value.shape) and dims != list(value.shape):
            value.shape = ir.Shape(dims)
    return cleared


def restore_private_output_names(model: ir.Model, cleared: PrivateNames) -> None:
    """Write back the names :func:`forget_private_output_names` set aside (unless inference
    proved a size there): the optimized file declares the names the original did."""
    for value in model.graph.outputs:
        if value.shape is None:
            continue
        dims = list(value.shape)
        for axis, dim in enumerate(dims):
            name = cleared.get((str(value.name), axis))
            if name is not None and not isinstance(dim, int):
                dims[axis] = ir.SymbolicDim(name)
        if dims != list(value.shape):
            value.shape = ir.Shape(dims)


def keep_declared_outputs(
    model: ir.Model, declared: dict[str, tuple[int | str | None, ...] | None]
) -> int:
    """Give back the anonymous dims of the outputs where inference only made a name up.

    ONNX names a dim it cannot tell "unk__0"; written into an output it changes the model's
    declared interface for a placeholder, not a fact (a size, or a name an input declares, is one
    and stays). Returns how many dims were given back.
    """
    cleared = 0
    for value in model.graph.outputs:
        old = declared.get(str(value.name))
        new = value.shape
        if new is None or (old is not None and len(old) != len(new)):
            continue
        made_up = [
            isinstance(dim, ir.SymbolicDim)
            and str(dim.value).startswith(GENERATED_DIM_PREFIX)
            and (old is None or old[index] != dim.value)
            for index, dim in enumerate(new)
        ]
        if any(made_up):
            value.shape = ir.Shape(
                [
                    ir.SymbolicDim(None) if gone else dim
                    for dim, gone in zip(new, made_up, strict=True)
                ]
            )
            cleared += sum(made_up)
    return cleared
