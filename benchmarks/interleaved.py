"""The timing loop the CPU benchmarks share: every step warmed up once, then all of them timed
in turn, round after round, so that load from elsewhere on the machine falls on all alike; each
step's figure is the median over the rounds of ``torch.utils.benchmark``'s blocked medians."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable

from torch.utils import benchmark

from posenc_cli.allocator import keep_freed_memory

keep_freed_memory()  # time the layers as `posenc` runs them (posenc_cli/allocator.py)


def medians(
    steps: dict[Hashable, Callable[[], None]],
    rounds: int,
    seconds: float,
    before_each: Callable[[], None] | None = None,
) -> dict[Hashable, float]:
    """Seconds per call of each step; ``before_each`` runs before every measurement."""
    for step in steps.values():
        step()  # warm-up (also fills the caches a training step would have filled)
    times: dict[Hashable, list[float]] = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            if before_each is not None:
                before_each()
            timer = benchmark.Timer("step()", globals={"step": step}, num_threads=2)
            times[key].append(timer.blocked_autorange(min_run_time=seconds).median)
    return {key: statistics.median(t) for key, t in times.items()}


def against_none(seconds: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each encoding's seconds and its ratio to ``none`` measured in the same rounds."""
    return {n: {"seconds": s, "ratio": s / seconds["none"]} for n, s in seconds.items()}
