"""Latency statistics and the confidence interval of a median, without distributional assumptions.

The speed-up of B over A is the median of the paired ratios ``t_A[i] / t_B[i]`` over rounds in which
A and B ran back to back, so that slow phases of a noisy machine hit both sides of a pair. Its
interval is the distribution-free order-statistic interval of a median: with ``n`` sorted values,
the true median lies in ``[x_(k), x_(n+1-k)]`` with probability ``1 - 2 P(X <= k-1)``,
``X ~ Binomial(n, 1/2)``, where ``k`` is the largest rank that keeps this at the wanted confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    """Steady-state latency of one variant, in seconds."""

    runs: int
    median: float
    p90: float
    p99: float
    mean: float
    minimum: float
    runs_per_second: float  # 1 / mean: the rate of back-to-back single requests

    @staticmethod
    def of(samples: Sequence[float]) -> LatencyStats:
        values = np.asarray(samples, dtype=np.float64)
        if values.size == 0:
            raise ValueError("no latency samples")
        mean = float(values.mean())
        return LatencyStats(
            runs=int(values.size),
            median=float(np.median(values)),
            p90=float(np.percentile(values, 90)),
            p99=float(np.percentile(values, 99)),
            mean=mean,
            minimum=float(values.min()),
            runs_per_second=1.0 / mean if mean > 0 else math.inf,
        )


@dataclass(frozen=True)
class Interval:
    """A median and its confidence interval (``low``/``high`` are None when n is too small)."""

    median: float
    low: float | None
    high: float | None
    confidence: float
    count: int
    blocks: int = 1  # > 1: a block bootstrap over session generations

    @property
    def relative_half_width(self) -> float:
        if self.low is None or self.high is None or self.median == 0:
            return math.inf
        return (self.high - self.low) / (2 * abs(self.median))

    def overlaps(self, other: Interval) -> bool:
        if None in (self.low, self.high, other.low, other.high):
            return False
        return self.low <= other.high and other.low <= self.high  # type: ignore[operator]


def median_rank(count: int, confidence: float = 0.95) -> tuple[int, float] | None:
    """Largest 1-based rank ``k`` with ``2 P(X <= k-1) <= 1 - confidence``, and its exact coverage.

    None when even ``[min, max]`` covers less than ``confidence`` (fewer than 6 values at 95%).
    """
    alpha = 1.0 - confidence
    log_half = count * math.log(0.5)
    cumulative = 0.0
    log_comb = 0.0  # log C(count, i)
    for i in range(count + 1):
        probability = math.exp(log_comb + log_half)
        if 2 * (cumulative + probability) > alpha:
            # P(X <= i) is too large, P(X <= i-1) = cumulative was fine: k - 1 = i - 1
            return (i, 1.0 - 2 * cumulative) if i >= 1 else None
        cumulative += probability
        log_comb += math.log(count - i) - math.log(i + 1) if i < count else 0.0
    return None


def median_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    count = int(ordered.size)
    if count == 0:
        raise ValueError("no values")
    median = float(np.median(ordered))
    rank = median_rank(count, confidence)
    if rank is None:
        return Interval(median, None, None, confidence, count)
    k, coverage = rank
    return Interval(median, float(ordered[k - 1]), float(ordered[count - k]), coverage, count)


BOOTSTRAP_RESAMPLES = 1000


def block_bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    blocks: Sequence[int],
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Median of ``values`` with a two-level (blocks, then values within them) bootstrap interval.

    Values from one block share something the order-statistic interval would wrongly treat as
    independent noise (here: the sessions they were timed on, whose memory placement can shift a
    run by a few percent); resampling whole blocks puts that variation into the interval.
    """
    data = np.asarray(values, dtype=np.float64)
    labels = np.asarray(blocks)
    groups = [data[labels == label] for label in dict.fromkeys(labels.tolist())]
    median = float(np.median(data))
    if len(groups) < 2:
        return median_interval(data, confidence)
    rng = np.random.default_rng(seed)
    medians = np.empty(BOOTSTRAP_RESAMPLES)
    for i in range(BOOTSTRAP_RESAMPLES):
        chosen = rng.integers(0, len(groups), len(groups))
        medians[i] = np.median(
            np.concatenate(
                [groups[g][rng.integers(0, groups[g].size, groups[g].size)] for g in chosen]
            )
        )
    alpha = 1.0 - confidence
    low, high = np.quantile(medians, [alpha / 2, 1 - alpha / 2])
    return Interval(median, float(low), float(high), confidence, int(data.size), len(groups))


def paired_speedup(
    baseline: Sequence[float],
    candidate: Sequence[float],
    confidence: float = 0.95,
    blocks: Sequence[int] | None = None,
) -> Interval:
    """Median of ``baseline[i] / candidate[i]`` (> 1: the candidate is faster) with its interval.

    With ``blocks`` (the session generation of each round) the interval is a block bootstrap.
    """
    if len(baseline) != len(candidate):
        raise ValueError("paired samples differ in length")
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    ratios = a / np.maximum(b, 1e-12)
    if blocks is not None and len(set(blocks)) > 1:
        return block_bootstrap_interval(ratios, blocks, confidence)
    return median_interval(ratios, confidence)
