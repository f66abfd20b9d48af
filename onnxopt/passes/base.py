"""Pass, PassResult, Pipeline and FixedPoint: the pass runner with per-pass counts and timings.

onnx-ir's own pass manager drops the statistics we report, so we run passes ourselves. A pass is an
onnx-ir ``InPlacePass`` that returns a :class:`PassResult` carrying a ``Counter`` of what it changed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import onnx_ir as ir

from onnxopt.io import unique_node_names, unique_value_names
from onnxopt.passes.options import PassOptions
from onnxopt.rewrite.driver import apply_rules
from onnxopt.rewrite.rule import Rule

logger = logging.getLogger(__name__)


@dataclass
class PassResult(ir.passes.PassResult):
    """What a pass did: ``stats`` counts each kind of change, e.g. ``{"conv+bn->conv": 12}``."""

    stats: Counter[str] = field(default_factory=Counter)
    # Why candidate rewrites were not applied, as "rule: where: reason" lines (feeds --explain).
    notes: list[str] = field(default_factory=list)
    # Running the pass again on its own output would change nothing: the pipeline then skips
    # that run, as after a run that changed nothing (see Pipeline).
    settled: bool = False


class Pass(ir.passes.InPlacePass):
    """An in-place rewrite of the whole model, configured by :class:`PassOptions`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # The pass only removes what nothing reads (nodes, initializers, functions, opset imports):
    # every value left keeps the nodes it is computed from.
    removes_unread_only: ClassVar[bool] = False
    # What the pass finds depends only on values and the nodes they are computed from, never on
    # what reads them, so a pass that removes unread parts cannot give it more to do (see
    # Pipeline).
    reads_producers_only: ClassVar[bool] = False

    def __init__(self, options: PassOptions | None = None) -> None:
        self.options = options or PassOptions()

    def call(self, model: ir.Model) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, model_or_result: ir.Model | ir.passes.PassResult, /) -> PassResult:
        result = super().__call__(model_or_result)
        assert isinstance(result, PassResult)
        return result


class RulePass(Pass):
    """A pass that applies its ``rules`` through the rewrite driver: most fusions and cleanups."""

    rules: ClassVar[Sequence[Rule]]

    def call(self, model: ir.Model) -> PassResult:
        stats, notes = apply_rules(model, self.rules, self.options)
        return PassResult(model, modified=bool(stats), stats=Counter(stats), notes=notes)


@dataclass(frozen=True)
class PassRecord:
    """One execution of one pass inside a pipeline."""

    name: str
    modified: bool
    seconds: float
    stats: dict[str, int]
    notes: tuple[str, ...] = ()
    iteration: int = 0


class Instrument(Protocol):
    def before_pass(self, pass_: Pass, model: ir.Model) -> None: ...

    def after_pass(self, pass_: Pass, model: ir.Model, record: PassRecord) -> None: ...


@dataclass(frozen=True)
class PipelineResult:
    model: ir.Model
    records: tuple[PassRecord, ...]
    warnings: tuple[str, ...] = ()
    # Runs left out because they could only repeat that pass's last run (see Pipeline).
    skipped: int = 0

    @property
    def modified(self) -> bool:
        return any(r.modified for r in self.records)

    def totals(self) -> dict[str, dict[str, int]]:
        """Stats summed per pass name, in first-run order."""
        out: dict[str, Counter[str]] = {}
        for record in self.records:
            out.setdefault(record.name, Counter()).update(record.stats)
        return {name: dict(sorted(c.items())) for name, c in out.items()}


class FixedPoint:
    """Repeat a group of passes until none changes the model, at most ``max_iterations`` times."""

    # 16: each round of the cleanup can resolve one more link of a chain of placeholder dims;
    # SAM2's TorchScript export (its Hiera stages' window views) settles after 10.
    def __init__(self, passes: Sequence[Pass], max_iterations: int = 16) -> None:
        self.passes = list(passes)
        self.max_iterations = max_iterations

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]


Step = Pass | FixedPoint


class Pipeline:
    """Run steps in order, recording every pass's time and changes; instruments observe each pass.

    A pass is not run again while the model is as it was when that pass (same class, same
    options) last ran and changed nothing: passes are deterministic functions of the model and
    their options, so the run could only find nothing again. This drops the last round of each
    fixed point's passes that no other pass disturbed since, and the repeated shape inference at
    the ends of consecutive groups (most of the optimizer's time on small convolutional models).
    The same holds after a run that changed the model but says it is ``settled`` (a second run
    would find nothing), and, for a pass that ``reads_producers_only``, across passes that
    ``removes_unread_only``: shape inference after a fusion round is not repeated because
    dead-code elimination then removed the nodes the fusions left unread.
    """

    def __init__(self, steps: Sequence[Step], instruments: Sequence[Instrument] = ()) -> None:
        self.steps = list(steps)
        self.instruments = list(instruments)
        # Per call: how many runs changed the model so far, how many of them did more than remove
        # unread parts, the count (of the kind the pass heeds) when each pass (by class and
        # options) last had nothing left to do, and the runs left out.
        self._changes = 0
        self._growth = 0
        self._idle_at: dict[tuple[type[Pass], int], int] = {}
        self._skipped = 0

    def __call__(
        self, model: ir.Model, progress: Callable[[str], None] | None = None
    ) -> PipelineResult:
        records: list[PassRecord] = []
        warnings: list[str] = []
        self._changes, self._growth, self._idle_at, self._skipped = 0, 0, {}, 0
        for step in self.steps:
            if isinstance(step, FixedPoint):
                for iteration in range(step.max_iterations):
                    changed = False
                    for pass_ in step.passes:
                        record = self._run_one(pass_, model, iteration, progress)
                        if record is not None:
                            records.append(record)
                            changed |= record.modified
                    if not changed:
                        break
                else:
                    message = f"passes {', '.join(step.names)} still changed the model after {step.max_iterations} rounds"
                    logger.warning("%s", message)
                    warnings.append(message)
            else:
                record = self._run_one(step, model, 0, progress)
                if record is not None:
                    records.append(record)
        # onnx-ir names new nodes per graph too: ORT refuses a name repeated in a graph, and the
        # loader would rename them, so the output would not be a fixed point.
        unique_node_names(model)
        return PipelineResult(model, tuple(records), tuple(warnings), self._skipped)

    def _run_one(
        self, pass_: Pass, model: ir.Model, iteration: int, progress: Callable[[str], None] | None
    ) -> PassRecord | None:
        key = (type(pass_), id(pass_.options))
        if self._idle_at.get(key) == self._heeded(pass_):
            self._skipped += 1
            return None
        if progress is not None:
            progress(pass_.name)
        for instrument in self.instruments:
            instrument.before_pass(pass_, model)
        start = time.perf_counter()
        result = pass_(model)
        # onnx-ir names new values per graph: a subgraph's may repeat another graph's, and
        # name-keyed facts (shape inference's) would drop both. Kept unique after every pass.
        renamed = unique_value_names(model)
        if result.modified or renamed:
            self._changes += 1
            if renamed or not pass_.removes_unread_only:
                self._growth += 1
        if not (result.modified or renamed) or (result.settled and not renamed):
            self._idle_at[key] = self._heeded(pass_)
        seconds = time.perf_counter() - start
        record = PassRecord(
            name=pass_.name,
            modified=result.modified,
            seconds=seconds,
            stats=dict(sorted(result.stats.items())),
            notes=tuple(result.notes),
            iteration=iteration,
        )
        logger.debug(
            "pass %s: modified=%s in %.3fs %s", pass_.name, result.modified, seconds, record.stats
        )
        for instrument in self.instruments:
            instrument.after_pass(pass_, model, record)
        return record

    def _heeded(self, pass_: Pass) -> int:
        """The count of changes that can give ``pass_`` more to do."""
        return self._growth if pass_.reads_producers_only else self._changes


class VerifyEach:
    """Check graph invariants after every pass (``--verify-each``); raise naming the pass that broke them."""

    def before_pass(self, pass_: Pass, model: ir.Model) -> None:
        return None

    def after_pass(self, pass_: Pass, model: ir.Model, record: PassRecord) -> None:
        from onnxopt.analysis.verify import verify_graph

        problems = verify_graph(model.graph)
        if problems:
            from onnxopt.errors import OnnxoptError

            raise OnnxoptError(f"pass '{pass_.name}' broke the graph: {problems[0]}")
