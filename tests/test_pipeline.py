from __future__ import annotations

from collections import Counter

import onnx_ir as ir
import pytest
from graphs import parse_model

from onnxopt.errors import UsageError
from onnxopt.passes.base import FixedPoint, Pass, PassResult, Pipeline
from onnxopt.passes.levels import ALL_PASSES, LEVELS, build_steps
from onnxopt.passes.options import PassOptions

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) { a = Relu(x) b = Relu(x) y = Add(a, b) }
"""


class _AlwaysChanges(Pass):
    name = "always-changes"
    summary = "test pass that claims a change every time"

    def call(self, model: ir.Model) -> PassResult:
        return PassResult(model, modified=True, stats=Counter({"claimed": 1}))


def test_pipeline_records_every_pass_with_stats_and_time() -> None:
    steps = build_steps(passes=["eliminate-common-subexpressions", "eliminate-dead-code"])
    result = Pipeline(steps)(parse_model(TEXT))
    assert [r.name for r in result.records] == [
        "eliminate-common-subexpressions",
        "eliminate-dead-code",
    ]
    assert result.records[0].stats == {"nodes merged": 1}
    assert all(r.seconds >= 0 for r in result.records)
    assert result.totals()["eliminate-common-subexpressions"] == {"nodes merged": 1}


def test_fixed_point_cap_is_reported_not_silent() -> None:
    result = Pipeline([FixedPoint([_AlwaysChanges()], max_iterations=3)])(parse_model(TEXT))
    assert len(result.records) == 3
    assert result.warnings and "still changed the model after 3 rounds" in result.warnings[0]


def test_fixed_point_stops_when_nothing_changes() -> None:
    steps = build_steps(passes=["eliminate-dead-code"])
    result = Pipeline([FixedPoint(steps, max_iterations=5)])(parse_model(TEXT))
    assert len(result.records) == 1
    assert not result.warnings


def test_disable_and_unknown_names() -> None:
    names = [type(s).__name__ for s in build_steps(1, disable=["infer-shapes"])]
    assert "InferShapesPass" not in names
    with pytest.raises(UsageError, match="unknown pass 'nope'"):
        build_steps(passes=["nope"])
    with pytest.raises(UsageError, match="unknown pass"):
        build_steps(disable=["nope"])
    with pytest.raises(UsageError, match="unknown level"):
        build_steps(9)


def test_every_pass_has_a_unique_kebab_name_and_summary() -> None:
    names = [cls.name for cls in ALL_PASSES]
    assert len(names) == len(set(names))
    for cls in ALL_PASSES:
        assert cls.name == cls.name.lower() and " " not in cls.name
        assert cls.summary
    for spec in LEVELS.values():
        for entry in spec:
            for cls in entry if isinstance(entry, tuple) else (entry,):
                assert cls in ALL_PASSES


class _CountsRuns(Pass):
    name = "counts-runs"
    summary = "test pass that changes nothing and counts its runs"
    runs = 0

    def call(self, model: ir.Model) -> PassResult:
        type(self).runs += 1
        return PassResult(model, modified=False)


class _ChangesOnce(Pass):
    name = "changes-once"
    summary = "test pass that claims a change on its first run only"

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def call(self, model: ir.Model) -> PassResult:
        changed, self.done = not self.done, True
        return PassResult(model, modified=changed)


def test_a_pass_that_found_nothing_is_not_run_again_on_the_same_model() -> None:
    _CountsRuns.runs = 0
    options = PassOptions()
    idle, again = _CountsRuns(options), _CountsRuns(options)
    result = Pipeline([idle, again, FixedPoint([_CountsRuns(options)])])(parse_model(TEXT))
    assert _CountsRuns.runs == 1 and result.skipped == 2
    assert [r.name for r in result.records] == ["counts-runs"]
    # Another pass's change in between: it runs again, and the fixed point's second round
    # (nothing changed since the first found nothing) leaves it out.
    _CountsRuns.runs = 0
    steps = [idle, FixedPoint([_ChangesOnce(), _CountsRuns(options)])]
    result = Pipeline(steps)(parse_model(TEXT))
    assert _CountsRuns.runs == 2 and result.skipped == 1
    assert [(r.name, r.iteration) for r in result.records] == [
        ("counts-runs", 0),
        ("changes-once", 0),
        ("counts-runs", 0),
        ("changes-once", 1),
    ]
    # Other options are another configuration: it runs.
    _CountsRuns.runs = 0
    Pipeline([idle, _CountsRuns(PassOptions(target="onnx"))])(parse_model(TEXT))
    assert _CountsRuns.runs == 2


class _SettlesOnFirstRun(Pass):
    """Changes the model on its first run and says a second run would find nothing."""

    name = "settles"
    summary = "test pass whose first run changes the model and is settled"
    reads_producers_only = True
    runs = 0

    def call(self, model: ir.Model) -> PassResult:
        type(self).runs += 1
        first = type(self).runs == 1
        return PassResult(model, modified=first, settled=True)


class _RemovesOnce(_ChangesOnce):
    name = "removes-once"
    summary = "test pass that claims to remove something unread on its first run only"
    removes_unread_only = True


def test_a_settled_run_is_not_repeated_until_something_else_changes_the_model() -> None:
    _SettlesOnFirstRun.runs = 0
    result = Pipeline([FixedPoint([_SettlesOnFirstRun(PassOptions())])])(parse_model(TEXT))
    # The first round changed the model, so a second round runs, but the settled pass is left out.
    assert _SettlesOnFirstRun.runs == 1 and result.skipped == 1
    # A change by another pass that adds to the model: it runs again.
    _SettlesOnFirstRun.runs = 0
    options = PassOptions()
    steps = [_SettlesOnFirstRun(options), _ChangesOnce(), _SettlesOnFirstRun(options)]
    assert Pipeline(steps)(parse_model(TEXT)).skipped == 0 and _SettlesOnFirstRun.runs == 2


def test_removing_unread_parts_does_not_rerun_a_pass_that_reads_producers_only() -> None:
    _SettlesOnFirstRun.runs = 0
    options = PassOptions()
    steps = [_SettlesOnFirstRun(options), _RemovesOnce(), _SettlesOnFirstRun(options)]
    result = Pipeline(steps)(parse_model(TEXT))
    assert _SettlesOnFirstRun.runs == 1 and result.skipped == 1
    # Any other pass still sees the removal: it may have made a merge or fold possible.
    _CountsRuns.runs = 0
    steps = [_CountsRuns(options), _RemovesOnce(), _CountsRuns(options)]
    assert Pipeline(steps)(parse_model(TEXT)).skipped == 0 and _CountsRuns.runs == 2


def test_shape_inference_is_settled_only_when_onnx_inference_alone_changed_the_model() -> None:
    from onnxopt.passes.infer_shapes import InferShapesPass

    inferred = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x) => (float[2, 3] y) { t = Relu(x) y = Neg(t) }
    """)
    first = InferShapesPass()(inferred)
    assert (
        first.modified
        and first.settled
        and first.stats == {"shapes inferred": 1, "types inferred": 1}
    )
    assert not InferShapesPass()(inferred).modified  # what "settled" promises
    # A Slice along axis 0 from a start read at run time: ONNX infers only its rank, the dim it
    # leaves alone is copied from the input by the pass's own refinement, which a second run's
    # inference can carry further: not settled.
    refined = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, int64[1] s) => (float[M, 4] y) {
        e = Constant<value = int64[1] {9}>()
        a = Constant<value = int64[1] {0}>()
        t = Slice(x, s, e, a)
        y = Relu(t)
    }
    """)
    result = InferShapesPass()(refined)
    assert result.stats["shapes refined"] >= 1 and not result.settled


def test_merging_passes_are_not_rerun_after_a_removal() -> None:
    from onnxopt.passes.deduplicate_initializers import DeduplicateInitializersPass
    from onnxopt.passes.eliminate_common_subexpressions import EliminateCommonSubexpressionsPass
    from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
    from onnxopt.passes.eliminate_noops import EliminateNoopsPass

    # Equal nodes and equal tensors are equal whoever reads them: once the merging passes found
    # nothing, removing an unread node cannot give them more; another pass runs again.
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x) => (float[2, 3] y) {
        a = Relu(x)
        unread = Neg(a)
        y = Abs(a)
    }
    """)
    options = PassOptions()
    passes = [
        EliminateCommonSubexpressionsPass(options),
        DeduplicateInitializersPass(options),
        EliminateNoopsPass(options),
    ]
    result = Pipeline([*passes, EliminateDeadCodePass(options), *passes])(model)
    assert [r.name for r in result.records] == [
        "eliminate-common-subexpressions",
        "deduplicate-initializers",
        "eliminate-noops",
        "eliminate-dead-code",
        "eliminate-noops",
    ]
    assert result.skipped == 2 and result.records[3].stats == {"nodes removed": 1}
