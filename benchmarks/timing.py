"""Timing side by side: ratios of medians over interleaved repetitions."""

from __future__ import annotations

import gc
import statistics
import time

import jax


def timed(fn, reps: int) -> float:
    # The garbage of the candidate before is not charged to this one.
    gc.collect()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def side_by_side(candidates: dict, reps: int, rounds: int = 5, summary=statistics.median) -> dict[str, float]:
    """Time of each candidate (median of rounds by default), rounds interleaved.

    One-shot costs (tracing, lowering) use the minimum instead: noise on a
    shared machine only ever adds time, and a single call cannot be averaged.
    """
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            times[name].append(timed(fn, reps))
    return {name: summary(ts) for name, ts in times.items()}


def block(out):
    jax.block_until_ready(out)


def row(label: str, value: str, ratio: float | None = None, target: str = "") -> None:
    ratio_text = f"{ratio:6.3f}x" if ratio is not None else ""
    print(f"  {label:<52} {value:>14} {ratio_text:>9}  {target}")
