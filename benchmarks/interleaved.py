"""The timing loop the CPU benchmarks share: every step warmed up once, then all of them timed
in turn, round after round, so that load from elsewhere on the machine falls on all alike; each
round's figure is ``torch.utils.benchmark``'s blocked median, and a ratio between two steps is
the median of their ratios within each round."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable

from torch.utils import benchmark

from posenc_cli.allocator import keep_freed_memory

keep_freed_memory()  # time the layers as `posenc` runs them (posenc_cli/allocator.py)


def per_round(
    steps: dict[Hashable, Callable[[], None]],
    rounds: int,
    seconds: float,
    before_each: Callable[[], None] | None = None,
) -> dict[Hashable, list[float]]:
    """Seconds per call of each step in every round; ``before_each`` runs before every
    measurement."""
    for step in steps.values():
        step()  # warm-up (also fills the caches a training step would have filled)
    times: dict[Hashable, list[float]] = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            if before_each is not None:
                before_each()
            timer = benchmark.Timer("step()", globals={"step": step}, num_threads=2)
            times[key].append(timer.blocked_autorange(min_run_time=seconds).median)
    return times


def round_ratios(top: list[float], bottom: list[float]) -> list[float]:
    """``top``'s time over ``bottom``'s within each round: a machine whose speed drifts between
    rounds moves both sides of each ratio alike."""
    return [a / b for a, b in zip(top, bottom, strict=True)]


def ratios_per_round(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each encoding's median seconds and its ratio to ``none`` taken round by round: the
    median ratio and the lowest and highest."""
    out = {}
    for name, t in times.items():
        ratios = round_ratios(t, times["none"])
        out[name] = {
            "seconds": statistics.median(t),
            "ratio": statistics.median(ratios),
            "lowest": min(ratios),
            "highest": max(ratios),
        }
    return out


def spread(result: dict[str, float]) -> str:
    """``1.07x (1.02-1.15)``: the median ratio, then the lowest and highest round's."""
    return f"{result['ratio']:.2f}x ({result['lowest']:.2f}-{result['highest']:.2f})"
