"""Differential fuzzing: random valid graphs must compute the same thing after optimization."""

from __future__ import annotations

import onnx
import pytest
from fuzz_graphs import check_model, random_model

QUICK_SEEDS = range(16)


def test_generator_makes_valid_models() -> None:
    for seed in range(5):
        onnx.checker.check_model(random_model(seed), full_check=True)


@pytest.mark.parametrize("seed", QUICK_SEEDS)
def test_optimized_random_graph_matches_original(seed: int) -> None:
    assert check_model(random_model(seed)) is None


@pytest.mark.slow
def test_long_fuzz_run() -> None:
    """Thousands of graphs; failures are listed by seed (rerun one with tests/fuzz_graphs.py)."""
    failures = [
        (seed, problem)
        for seed in range(1000, 3000)
        if (problem := check_model(random_model(seed))) is not None
    ]
    assert not failures, failures[:10]
