"""The interleaved timing loop: every variant once per round, so paired ratios cancel machine noise.

A round runs all variants back to back in a fresh random order (seeded), so that no variant always
runs first, last, or right after a particular other one (a fixed A B C, C B A alternation would run A
and C twice in a row every other round, with their caches warm). The loop stops at the first of: every
watched speed-up's confidence interval is within ``±ci_target`` of its median (after ``min_rounds``),
the time budget is spent, or ``max_rounds`` is reached.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxopt.bench.stats import median_interval, paired_speedup


@dataclass(frozen=True)
class Runner:
    """A loaded variant: ``run()`` is one timed inference, ``outputs()`` runs once and returns host arrays."""

    name: str
    device: str  # cpu, cuda
    create_seconds: float  # session creation / module preparation
    run: Callable[[], object]
    outputs: Callable[[], list[np.ndarray]]
    keepalive: object = None  # e.g. device buffers bound to a session
    run_options: Any = (
        None  # ORT's RunOptions of every run: setting .terminate stops the one running
    )


@dataclass(frozen=True)
class TimingResult:
    samples: tuple[tuple[float, ...], ...]  # per variant, per round, seconds
    blocks: tuple[int, ...]  # per round: the generation of sessions it ran on
    rounds: int
    seconds: float
    stop_reason: str


CLOCKS: dict[str, Callable[[], float]] = {
    # Latency as a user sees it.
    "wall": time.perf_counter,
    # CPU seconds of the whole process (every thread; spinning is off, so this is work done). On a
    # shared, oversubscribed machine it leaves out the time the benchmark waited for a core.
    "cpu": time.process_time,
}


def warm_up(
    runs: Sequence[Callable[[], object]],
    *,
    count: int,
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Run each variant ``count`` times, or fewer when ``seconds`` run out (at least once each)."""
    start = clock()
    for _ in range(count):
        for run in runs:
            run()
        if clock() - start > seconds:
            return


def _tight(
    samples: Sequence[list[float]],
    pairs: Sequence[tuple[int, int]],
    target: float,
    confidence: float,
    blocks: Sequence[int],
) -> bool:
    if pairs:
        return all(
            paired_speedup(samples[a], samples[b], confidence, blocks).relative_half_width <= target
            for a, b in pairs
        )
    return all(median_interval(s, confidence).relative_half_width <= target for s in samples)


def interleave(
    runs: Sequence[Callable[[], object]],
    pairs: Sequence[tuple[int, int]],
    *,
    budget_seconds: float,
    min_rounds: int = 10,
    max_rounds: int = 100_000,
    ci_target: float = 0.01,
    confidence: float = 0.95,
    clock: Callable[[], float] = time.perf_counter,
    timer: Callable[[], float] = time.perf_counter,
    seed: int = 0,
    reload: Callable[[list[Callable[[], object]]], None] | None = None,
    sessions: int = 1,
) -> TimingResult:
    """Time ``runs`` round-robin; ``pairs`` (baseline index, candidate index) are the speed-ups watched.

    ``timer`` measures each run (wall or CPU time); ``clock`` measures the budget (wall time).
    With ``reload`` (which replaces the runs in the list it is given with freshly created ones), the
    budget is cut into ``2 * sessions`` blocks with new sessions each, and the loop may stop early
    only after ``sessions`` blocks, so that intervals include the session-to-session variation.
    """
    runs = list(runs)
    samples: list[list[float]] = [[] for _ in runs]
    blocks: list[int] = []
    block = 0
    reloading = reload is not None and sessions > 1
    block_seconds = budget_seconds / (2 * sessions) if reloading else math.inf
    order = list(range(len(runs)))
    shuffler = random.Random(seed)
    start = block_start = clock()
    rounds = 0
    next_check = min_rounds
    stop_reason = f"reached --max-rounds {max_rounds}"
    while rounds < max_rounds:
        shuffler.shuffle(order)
        for index in order:
            begin = timer()
            runs[index]()
            samples[index].append(timer() - begin)
        rounds += 1
        blocks.append(block)
        elapsed = clock() - start
        if elapsed >= budget_seconds and rounds >= min(min_rounds, 3):
            stop_reason = f"time budget of {budget_seconds:g} s spent"
            break
        if rounds >= next_check and block + 1 >= (sessions if reloading else 1):
            # Geometric schedule: checking costs O(rounds), so check O(log rounds) times.
            next_check = max(rounds + 1, int(rounds * 1.1))
            if _tight(samples, pairs, ci_target, confidence, blocks):
                stop_reason = f"{confidence:.0%} intervals within ±{ci_target:.1%}"
                break
        if reload is not None and clock() - block_start >= block_seconds:
            if budget_seconds - elapsed < block_seconds / 2:
                continue  # too little time left for a useful block: finish on these sessions
            reload(runs)
            warm_up(runs, count=2, seconds=block_seconds / 4, clock=clock)
            block += 1
            block_start = clock()
    return TimingResult(
        tuple(tuple(s) for s in samples), tuple(blocks), rounds, clock() - start, stop_reason
    )
