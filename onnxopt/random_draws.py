"""Validate a model that draws random numbers: run the optimized model on the original's draws.

A model with an unseeded random op (VITS / Piper text-to-speech: ``RandomNormalLike`` noise scaled
by ``noise_scale``; a VAE's sampling; a Dropout in training mode, as an export with
``training=TrainingMode.TRAINING`` writes it) gives other outputs on every run, so its outputs
cannot be compared as they are. Each random op left in the optimized model is pinned instead:

- the original runs with each such op's output, and each of its inputs, as extra graph outputs;
- the optimized model runs with each op replaced by graph inputs (one per output read), fed what
  the original drew on the same feeds, and with the op's inputs as extra outputs (but constants
  equal in both), compared with the original's like any output: what decides the draw (a
  ``...Like`` op's input shape, Bernoulli's probabilities, a Multinomial's logits, what a Dropout
  drops from) is checked, and everything computed from the draw is.

An op is pinned only where the optimized model keeps it with the same op and attributes as an op
of the original's main graph, found by its output's name or else its own name (a pass may give the
output a graph output's name: the passes never rewrite a random op itself); else the model cannot
be validated, and the reason says why.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxopt import io
from onnxopt.ops import NONDETERMINISTIC_OPS, all_graphs, const_array, is_op

logger = logging.getLogger(__name__)

_PREFIX = "onnxopt.draw"


def draws(node: ir.Node) -> bool:
    """Whether ``node`` draws random numbers (with a seed or without): a random op, or a Dropout
    whose ``training_mode`` is true or not a constant."""
    if not is_op(node, node.op_type):
        return False
    if node.op_type in NONDETERMINISTIC_OPS:
        return True
    if node.op_type != "Dropout" or len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    training = const_array(node.inputs[2])
    return training is None or bool(np.any(training))


def unseeded_draws(model: ir.Model) -> list[ir.Node]:
    """The model's random ops without a ``seed`` (any graph), in graph order. A seeded one draws
    the same numbers in every session, run by run, so two models' runs still pair up."""
    return [
        node
        for node in ir.traversal.RecursiveGraphIterator(model.graph)
        if draws(node) and "seed" not in node.attributes
    ]


def seed_draws(model: ir.Model) -> int:
    """Give every unseeded random op a ``seed`` made from its name (else its first output's);
    return how many. Twin ops of two models (an export and its optimized file, whose passes keep
    node names but may rename a random op's output) then draw the same numbers run by run."""
    nodes = unseeded_draws(model)
    for node in nodes:
        name = str(node.name or node.outputs[0].name or node.op_type)
        # (a float attribute: integers below 2**24 are exact, and ORT casts it to its seed)
        node.attributes["seed"] = ir.AttrFloat32(
            "seed", float(zlib.crc32(name.encode()) % (1 << 24))
        )
    return len(nodes)


def describe(nodes: list[ir.Node]) -> str:
    """``RandomNormalLike '/m/RandomNormalLike', ...`` (the first three)."""
    named = [f"{n.op_type} '{n.name}'" if n.name else n.op_type for n in nodes]
    return ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")


@dataclass(frozen=True)
class PinnedDraws:
    """Copies of both models with their random ops pinned (see the module's docstring)."""

    reference: ir.Model  # the original, with the draws and the ops' inputs as extra outputs
    candidate: ir.Model  # the optimized model, each draw a graph input; the inputs as outputs
    feeds: tuple[tuple[str, str], ...]  # (the original's draw output, the candidate's input)
    # The ops' inputs: extra outputs of both copies, (name, words for the report).
    checks: tuple[tuple[str, str], ...]
    added: tuple[str, ...]  # every output the reference has that the original has not
    ops: str  # the pinned ops, in words

    def type_feeds(self, drawn: Mapping[str, np.ndarray]) -> None:
        """Type each of the candidate's draw inputs as the array the original drew there (``drawn``:
        one run's fetches by name), before its session is made. Neither model need record the
        type (an intermediate's, after drop-shape-annotations), and the array is what it is fed."""
        inputs = {str(v.name): v for v in self.candidate.graph.inputs}
        for drawn_name, input_name in self.feeds:
            dtype = ir.DataType.from_numpy(np.asarray(drawn[drawn_name]).dtype)
            inputs[input_name].type = ir.TensorType(dtype)


class CannotPin(Exception):
    """The random ops cannot be pinned; the message says why."""


def pin_draws(original: ir.Model | Path, optimized: ir.Model) -> PinnedDraws:
    """Pin the unseeded random ops of ``optimized`` to those of ``original`` (a model, or the
    file it was loaded from). Neither argument is changed."""
    drawing = unseeded_draws(optimized)
    nested = [n for n in drawing if n.graph is not optimized.graph]
    if nested:
        raise CannotPin(f"{describe(nested)} draws inside a subgraph")
    source = io.load_model(original).model if isinstance(original, Path) else original.clone()
    drawing_ops = [node for node in source.graph if draws(node)]
    by_output = {str(out.name): node for node in drawing_ops for out in node.outputs if out.name}
    # A pass may rename an op's output (to the graph output a removed no-op wrote): the node's
    # name, where it names one op only, finds the twin then.
    names = Counter(node.name for node in drawing_ops if node.name)
    by_name = {node.name: node for node in drawing_ops if node.name and names[node.name] == 1}
    candidate = optimized.clone()
    pinned = unseeded_draws(candidate)
    taken = {
        str(v.name)
        for model in (source, candidate)
        for graph in all_graphs(model)
        for v in io.graph_values(graph)
        if v.name
    }
    feeds: list[tuple[str, str]] = []
    checks: list[tuple[str, str]] = []
    added: list[str] = []
    for index, node in enumerate(pinned):
        twin = by_output.get(str(node.outputs[0].name)) or by_name.get(node.name or "")
        if twin is None or not _same_op(twin, node):
            raise CannotPin(
                f"the optimized model's {describe([node])} has no same op in the original's "
                "main graph under its output's name or its own"
            )
        for position, (theirs, ours) in enumerate(zip(twin.inputs, node.inputs, strict=True)):
            if theirs is None or ours is None or _same_constant(theirs, ours):
                continue  # (a Dropout's ratio and training flag)
            name = io.free_name(f"{_PREFIX}{index}.input{position}", taken)
            _expose(source.graph, theirs, name)
            _expose(candidate.graph, ours, name)
            checks.append((name, f"{describe([twin])} input {position}"))
            added.append(name)
        for position, out in enumerate(node.outputs):
            if not out.name or not (out.uses() or out.is_graph_output()):
                continue  # (a Dropout's mask no one reads)
            drawn = twin.outputs[position]
            if not drawn.is_graph_output():
                source.graph.outputs.append(drawn)
                added.append(str(drawn.name))
            # (typed by type_feeds, as the array the original draws)
            feed = ir.Value(name=io.free_name(f"{_PREFIX}{index}.output{position}", taken))
            candidate.graph.inputs.append(feed)
            copy = ir.Node("", "Identity", [feed])  # (unnamed: two unnamed draws would clash)
            candidate.graph.insert_before(node, copy)
            ir.convenience.replace_all_uses_with(out, copy.outputs[0], replace_graph_outputs=True)
            copy.outputs[0].name = out.name
            out.name = None
            feeds.append((str(drawn.name), str(feed.name)))
        candidate.graph.remove(node, safe=True)
    return PinnedDraws(
        source, candidate, tuple(feeds), tuple(checks), tuple(added), describe(pinned)
    )


def _same_op(a: ir.Node, b: ir.Node) -> bool:
    def attributes(node: ir.Node) -> dict[str, object]:
        return {name: attr.value for name, attr in node.attributes.items()}

    return (
        a.op_type == b.op_type
        and is_op(a, b.op_type, b.domain)
        and len(a.inputs) == len(b.inputs)
        and attributes(a) == attributes(b)
    )


def _same_constant(a: ir.Value, b: ir.Value) -> bool:
    left, right = const_array(a), const_array(b)
    return left is not None and right is not None and np.array_equal(left, right)


def _expose(graph: ir.Graph, value: ir.Value, name: str) -> None:
    """Add ``Identity(value)`` as a graph output named ``name``."""
    node = ir.Node("", "Identity", [value])
    node.outputs[0].name = name
    node.outputs[0].type = value.type
    graph.append(node)
    graph.outputs.append(node.outputs[0])
