"""Sizes for symbolic input dims: trial plans, dims written as expressions, and relations between dims.

A decoder exported with a KV cache takes ``input_ids [batch, seq]``, ``attention_mask [batch, total]``
and per layer ``past_key [batch, heads, past, d]``; it runs only when total = past + seq. Some
exporters write the relation into the dim (optimum's ``past_sequence_length + sequence_length``,
torch.export's ``s15 + s70``): such a dim is computed from the others here. Others name three
independent dims (``torch.onnx.export(dynamic_axes=...)``); then :meth:`DimSymbols.relations` lists
candidate relations (a dim that the model's outputs name as an expression, then each dim as the
sum of two others) for the caller to try on the model itself.

Expressions are read with :mod:`ast` and evaluated here (names, integers, ``+ - * //``), never with
``eval``; a dim whose names are not all dims of the inputs stays one opaque name (``seq-len``).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Sizes tried for every symbolic dim at once, after 1 and the distinct-per-dim plan.
FALLBACK_SIZES = (2, 8, 16, 32, 64, 128, 224)
# Then, for a signal's length (a dim only float inputs of rank <= 3 carry past their batch dim:
# raw audio [batch, samples], features [batch, mels, frames]): wav2vec2's front end needs >= 400
# samples. Each plan sizes only those dims; the others stay at 1.
SIGNAL_SIZES = (1000, 1600, 4000, 16000)
# Relations tried at most (each costs one run of the original model that may fail).
MAX_RELATIONS = 64
# No dim is generated larger than this (an expression like ``seq * 100000000`` is not a plan).
MAX_DIM = 1 << 24
_MAX_TEXT = 200  # longer dim names are not parsed as expressions

_BINARY = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}


class HasDims(Protocol):
    @property
    def dims(self) -> tuple[int | str | None, ...]: ...


def names_in(tree: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]


def _arithmetic(tree: ast.AST) -> bool:
    """Only names, non-negative int literals and ``+ - * //`` (unary minus too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY and not isinstance(node.op, ast.FloorDiv):
                return False
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                return False
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return False
        elif not isinstance(node, (ast.Name, ast.Expression, ast.Load, ast.operator, ast.unaryop)):
            return False
    return True


def _arithmetic_text(text: str) -> ast.Expression | None:
    """``text`` parsed as arithmetic (not one plain name); None otherwise."""
    if len(text) > _MAX_TEXT:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if isinstance(tree.body, ast.Name) or not _arithmetic(tree):
        return None
    return tree


def parse_expression(text: str, atoms: Iterable[str]) -> ast.Expression | None:
    """``text`` as arithmetic over ``atoms`` only; None when it is a plain name or anything else."""
    tree = _arithmetic_text(text)
    known = set(atoms)
    if tree is None or not all(name in known for name in names_in(tree)):
        return None
    return tree


def evaluate(tree: ast.AST, sizes: Mapping[str, int]) -> int | None:
    """The value of an expression from :func:`parse_expression`; None if it is not a valid size."""
    if isinstance(tree, ast.Expression):
        return evaluate(tree.body, sizes)
    if isinstance(tree, ast.Name):
        return sizes.get(tree.id)
    if isinstance(tree, ast.Constant) and type(tree.value) is int:
        return tree.value if tree.value <= MAX_DIM else None
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.USub):
        inner = evaluate(tree.operand, sizes)
        return None if inner is None else -inner
    if isinstance(tree, ast.BinOp):
        left, right = evaluate(tree.left, sizes), evaluate(tree.right, sizes)
        if left is None or right is None:
            return None
        if isinstance(tree.op, ast.FloorDiv):
            return left // right if right != 0 else None
        value = _BINARY[type(tree.op)](left, right)
        return value if abs(value) <= MAX_DIM else None
    return None


@dataclass(frozen=True)
class Relation:
    """``target`` is sized as ``expression`` of the other dims (``total = past + seq``)."""

    target: str
    expression: ast.AST = field(compare=False)
    text: str

    def __str__(self) -> str:
        return f"{self.target} = {self.text}"


@dataclass(frozen=True)
class SizePlan:
    """One size per named dim (``sizes``) and one for every unnamed dim."""

    sizes: Mapping[str, int]
    unnamed: int
    relations: tuple[Relation, ...] = ()

    def with_relation(self, relation: Relation) -> SizePlan | None:
        value = evaluate(relation.expression, self.sizes)
        if value is None or value < 0:
            return None
        return SizePlan(
            {**self.sizes, relation.target: value}, self.unnamed, (*self.relations, relation)
        )


@dataclass(frozen=True)
class DimSymbols:
    """The symbolic dims of a model's inputs: plain names (``atoms``) and expressions over them."""

    atoms: tuple[str, ...]
    expressions: Mapping[str, ast.Expression]
    uses: Mapping[str, int]  # inputs each name appears in
    leading: frozenset[str]  # names seen as an input's first (batch) dim
    # Names only ever seen as the first dim of an input of rank 2 or more: a batch. The fallback
    # sizes leave it at 1 (a ViT whose image size must be 224 does not need 224 images).
    batch: frozenset[str] = frozenset()
    axis_of: Mapping[str, int] = field(default_factory=dict)  # the axis a name is first seen at

    @staticmethod
    def of(specs: Sequence[HasDims]) -> DimSymbols:
        texts = [d for s in specs for d in s.dims if isinstance(d, str)]
        # First the names that stand alone somewhere: an expression may only use those.
        plain = [t for t in texts if _arithmetic_text(t) is None]
        names = list(dict.fromkeys(plain))
        expressions = {}
        for text in dict.fromkeys(texts):
            tree = parse_expression(text, names)
            if tree is not None:
                expressions[text] = tree
            elif text not in names:
                names.append(text)  # an expression over unknown names: one opaque name
        uses: dict[str, int] = dict.fromkeys(names, 0)
        leading: set[str] = set()
        batched: set[str] = set()
        elsewhere: set[str] = set()
        axis_of: dict[str, int] = {}
        for spec in specs:
            seen: set[str] = set()
            for axis, dim in enumerate(spec.dims):
                if not isinstance(dim, str):
                    continue
                found = names_in(expressions[dim]) if dim in expressions else [dim]
                seen.update(found)
                for name in found:
                    axis_of.setdefault(name, axis)
                if axis == 0:
                    leading.update(found)
                if axis == 0 and len(spec.dims) >= 2 and dim not in expressions:
                    batched.update(found)
                else:
                    elsewhere.update(found)
            for name in seen:
                uses[name] += 1
        return DimSymbols(
            tuple(names),
            expressions,
            uses,
            frozenset(leading),
            frozenset(batched - elsewhere),
            axis_of,
        )

    def size(self, dim: int | str | None, plan: SizePlan) -> int | None:
        if isinstance(dim, int):
            return dim
        if dim is None:
            return plan.unnamed
        tree = self.expressions.get(dim)
        value = evaluate(tree, plan.sizes) if tree is not None else plan.sizes.get(dim)
        return value if value is not None and 0 <= value <= MAX_DIM else None

    def shapes(self, specs: Sequence[HasDims], plan: SizePlan) -> list[tuple[int, ...]] | None:
        """Each input's shape under ``plan``; None if a dim comes out negative or too large."""
        shapes = []
        for spec in specs:
            dims = [self.size(d, plan) for d in spec.dims]
            if any(d is None for d in dims):
                return None
            shapes.append(tuple(d for d in dims if d is not None))
        return shapes

    def constant(self, size: int) -> SizePlan:
        """Every name at ``size``; a batch at 1 above size 2 (its activations grow with it)."""
        return SizePlan({a: 1 if size > 2 and a in self.batch else size for a in self.atoms}, size)

    def distinct(self, given: Mapping[str, int] | None = None) -> SizePlan:
        """3, 5, 7, ... per name (mixed-up dims are caught), or the ``given`` size of a name."""
        sizes = {a: 3 + 2 * i for i, a in enumerate(self.atoms)}
        sizes.update({k: v for k, v in (given or {}).items() if k in sizes})
        return SizePlan(sizes, 3)

    def one_batch(self, plan: SizePlan) -> SizePlan:
        """``plan`` with every leading (batch) name sized as the first one: exporters that name
        each input's batch dim apart (torch.export's ``s56``, ``s43``) still need them equal."""
        leading = [a for a in self.atoms if a in self.leading]
        if len(leading) < 2:
            return plan
        size = plan.sizes[leading[0]]
        return SizePlan(
            {**plan.sizes, **dict.fromkeys(leading, size)}, plan.unnamed, plan.relations
        )

    def by_axis(self) -> SizePlan:
        """3, 5, 7, ... per axis: every name first seen at one axis gets one size. Exporters that
        name each input's dims apart (tf2onnx's ``unk__301``) still need input_ids [B, S] and
        attention_mask [B, S] to agree, at sizes other than 1 and 2."""
        sizes = {a: 3 + 2 * self.axis_of.get(a, 0) for a in self.atoms}
        return SizePlan(sizes, 3)

    def base_plans(self, given: Mapping[str, int] | None = None) -> list[SizePlan]:
        """The plans tried first: the ``given`` sizes (and twice them), 1, distinct (with one
        batch size, then one size per axis), then each fallback size for every dim."""
        plans = []
        if given and any(k in self.atoms for k in given):
            plans += [self.distinct(given), self.distinct({k: 2 * v for k, v in given.items()})]
        plans += [self.constant(1), self.distinct(), self.one_batch(self.distinct())]
        plans.append(self.by_axis())
        plans += [self.constant(s) for s in FALLBACK_SIZES]
        return plans

    def signal_plans(self, signal: Iterable[str]) -> list[SizePlan]:
        """The :data:`SIGNAL_SIZES` for the ``signal`` names, every other name at 1."""
        names = set(signal)
        if not names.intersection(self.atoms):
            return []
        return [
            SizePlan({a: size if a in names else 1 for a in self.atoms}, 1) for size in SIGNAL_SIZES
        ]

    def relations(self, hints: Iterable[str] = ()) -> list[Relation]:
        """Candidate relations, likeliest first, at most :data:`MAX_RELATIONS`.

        First each expression the model itself names (``hints``: its output dims, e.g. a present
        key's ``past + seq``) as the size of an input dim outside it, then each name as the sum of
        two others, then each name equal to another (an encoder length named twice). Names used by
        few inputs and not a batch dim come first as targets; batch dims come last as terms.
        """
        targets = sorted(
            self.atoms, key=lambda a: (a in self.leading, self.uses.get(a, 0), self.atoms.index(a))
        )
        found: list[Relation] = []
        for text in dict.fromkeys(hints):
            tree = parse_expression(text, self.atoms)
            if tree is None:
                continue
            inside = set(names_in(tree))
            found += [Relation(t, tree, text) for t in targets if t not in inside]
        equal: list[Relation] = []
        for target in targets:
            others = sorted(
                (a for a in self.atoms if a != target),
                key=lambda a: (a in self.leading, self.atoms.index(a)),
            )
            for a, b in itertools.combinations(others, 2):
                tree = ast.Expression(ast.BinOp(ast.Name(a), ast.Add(), ast.Name(b)))
                found.append(Relation(target, tree, f"{a} + {b}"))
            equal += [Relation(target, ast.Expression(ast.Name(a)), a) for a in others]
        return list(dict.fromkeys([*found, *equal]))[:MAX_RELATIONS]
