"""Timing and summary helpers shared by the benchmarks (stdlib only).

Micro-benchmarks interleave their cases: every round times each case once, in
a rotated order, so slow phases of a noisy machine hit every case alike and a
ratio can be taken inside each round.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import timeit
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Summary = dict[str, float]


def calls_per_sample(func: Callable[[], Any], target_s: float) -> int:
    """How many calls of ``func`` last about ``target_s`` (at least one)."""
    timer = timeit.Timer(func)
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= target_s / 4 or number >= 1 << 24:
            return max(1, round(number * target_s / max(elapsed, 1e-9)))
        number *= 4


def interleaved_samples(
    cases: Mapping[str, Callable[[], Any]], rounds: int, target_s: float
) -> dict[str, list[float]]:
    """Seconds per call of each case, one sample per round, rounds interleaved."""
    names = list(cases)
    for func in cases.values():  # warm caches and lazily built state
        func()
    numbers = {name: calls_per_sample(cases[name], target_s) for name in names}
    timers = {name: timeit.Timer(cases[name]) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed = timers[name].timeit(numbers[name])
            samples[name].append(elapsed / numbers[name])
    return samples


def summarize(values: Sequence[float], scale: float = 1.0) -> Summary:
    """Median with the 10th-90th percentile spread (and extremes), scaled."""
    scaled = sorted(value * scale for value in values)
    if len(scaled) >= 2:
        deciles = statistics.quantiles(scaled, n=10, method="inclusive")
        low, high = deciles[0], deciles[-1]
    else:
        low = high = scaled[0]
    return {
        "median": statistics.median(scaled),
        "p10": low,
        "p90": high,
        "min": scaled[0],
        "max": scaled[-1],
        "n": float(len(scaled)),
    }


def paired(
    numerators: Sequence[float],
    denominators: Sequence[float],
    operation: Callable[[float, float], float],
) -> list[float]:
    """``operation`` applied to the samples of the same round."""
    return [operation(a, b) for a, b in zip(numerators, denominators, strict=True)]


def ratio(a: float, b: float) -> float:
    return a / b


def difference(a: float, b: float) -> float:
    return a - b


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values``.

    The order statistics ``x(k)`` and ``x(n + 1 - k)`` around the median, with
    ``k`` the largest rank that keeps the binomial(n, 1/2) tails within
    ``1 - confidence``. With too few values for that, the whole range.
    """
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - confidence) / 2
    k, below = 0, 0.0
    # below = P(Binomial(n, 1/2) < k + 1), the chance the median lies below x(k+1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    if k == 0:
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def host_description() -> str:
    """The host a run measured on, and how busy it was when the run started."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()}-core {platform.machine()} host, Python "
        f"{platform.python_version()}, load average {load:.1f} at start"
    )
