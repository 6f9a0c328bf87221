"""Latency with ``torch.utils.benchmark``, interleaved so that ratios hold on a noisy machine.

Every subject is warmed up, then the subjects take turns: each round times every subject for a
short block (``Timer.blocked_autorange``), so a burst of load from elsewhere falls on all of
them alike. The median and the interquartile range are taken over all blocks of a subject.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

# torch.utils.benchmark imports cpp_extension, which warns about a missing CUDA runtime on
# machines without one; that warning says nothing about timing.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402


@dataclass
class Latency:
    median: float  # seconds per step
    iqr: float  # interquartile range of the per-step times, seconds
    blocks: int  # timed blocks the figures come from


def _quantile(values: list[float], q: float) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q))


def interleaved_latency(
    steps: dict[str, Callable[[], object]],
    rounds: int = 3,
    min_time: float = 0.1,
    warmup: int = 2,
    synchronize: Callable[[], None] = lambda: None,
) -> dict[str, Latency]:
    """Median step time of each named step, measured in ``rounds`` alternating rounds."""

    def timed(step: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            step()
            synchronize()

        return run

    runs = {name: timed(step) for name, step in steps.items()}
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            timer = benchmark.Timer(
                stmt="run()", globals={"run": run}, num_threads=torch.get_num_threads()
            )
            times[name].extend(timer.blocked_autorange(min_run_time=min_time).times)
    return {
        name: Latency(
            median=_quantile(values, 0.5),
            iqr=_quantile(values, 0.75) - _quantile(values, 0.25),
            blocks=len(values),
        )
        for name, values in times.items()
    }
