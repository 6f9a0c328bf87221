"""The training loop every task runs: optimiser steps in periods, with the task's hooks for what
differs.

Per step: the schedule's rate, the task's train step on its next batch (which calls
``epochs.optimize``), the progress bar. When a period ends (``Cadence``: an epoch, or
``train.eval_every`` text steps) rank 0 has the task report (validation, one log line), adds
the line to the curves and keeps ``best.pt`` when the score improved, and every rank hears
rank 0's decision to stop early (text's ``train.stop_at``). Rank 0 saves ``last.pt`` on the
cadence and at a stop.

The loop counts steps rather than epochs because a text run has no epochs and resumes at any
step, while an epoch is only a number of steps; the hooks take the step and work out their
epoch. What a stop leaves follows from what a checkpoint can say: a step-counting run saves
``last.pt`` where Ctrl-C, SIGTERM or a lost rank stopped it, an epoch-counting run keeps the
save of its last finished epoch (``Cadence.saves_anywhere``). A lost rank becomes one line
(``distributed.lost``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from posenc_cli.runs import distributed
from posenc_cli.runs.cadence import Cadence
from posenc_cli.runs.curves import Curves
from posenc_cli.runs.distributed import World
from posenc_cli.runs.progress import progress_bar
from posenc_cli.runs.schedule import Schedule

Row = dict[str, Any]  # one metrics.jsonl line


def never(row: Row) -> bool:
    return False


@dataclass
class TrainingHooks:
    """What one task's training does its own way."""

    batches: Callable[[int], Iterable[Any]]  # first step -> this rank's batches, one a step
    train_step: Callable[[int, Any], tuple[float, int]]  # (step, batch) -> loss, items seen
    # rank 0 at a period's end: (steps done, the period's losses, items/s so far) -> the line
    # it logged and its score; it decides when to read the clock (before or after validating)
    report: Callable[[int, list[float], Callable[[], float]], tuple[Row, float]]
    checkpoint: Callable[[Path, dict[str, int], float], None]  # (path, position, best), rank 0
    stats: Callable[[Row, float], str]  # (line, score) -> the progress bar's figures
    schedule: Schedule
    lower_is_better: bool = False  # text keeps its lowest validation loss
    stop_early: Callable[[Row], bool] = never  # after a report: the run has done its job


@dataclass(frozen=True)
class Trained:
    steps: int  # finished steps, fewer than the cadence's total after an early stop
    best: float


def no_score_yet(lower_is_better: bool) -> float:
    """The best score before the first report: any score improves on it."""
    return math.inf if lower_is_better else -math.inf


def improves(score: float, best: float, lower_is_better: bool) -> bool:
    return score < best if lower_is_better else score > best


def train_loop(
    hooks: TrainingHooks,
    cadence: Cadence,
    out: Path,
    world: World,
    start: int,
    best: float,
    console: Console,
    tensorboard: bool,
    interrupt_at: int | None = None,
) -> Trained:
    """Train from step ``start`` (``best`` so far) to the cadence's end or an early stop.
    ``interrupt_at`` simulates a Ctrl-C before that step (tests use it)."""
    curves = Curves(out, tensorboard and world.main, resumed_at=start)
    progress = progress_bar(console, world.main)
    done, losses, seen, t0 = start, [], 0, time.perf_counter()

    def per_second() -> float:
        return seen / (time.perf_counter() - t0)

    def save(name: str) -> None:
        if world.main:
            hooks.checkpoint(out / name, cadence.position(done), best)

    def end_period(bar) -> bool:
        """Rank 0: the task's report, its curves, best.pt; whether the run stops early."""
        nonlocal best
        row, score = hooks.report(done, losses, per_second)
        curves.add(row)
        if improves(score, best, hooks.lower_is_better):
            best = score
            save("best.pt")
        progress.update(bar, stats=hooks.stats(row, score))
        return hooks.stop_early(row)

    try:
        with progress:
            bar = progress.add_task(out.name, total=cadence.total, completed=start, stats="")
            batches = iter(hooks.batches(start))
            for step in range(start, cadence.total):
                if step == interrupt_at:
                    raise KeyboardInterrupt
                hooks.schedule.before_step(step)
                loss, items = hooks.train_step(step, next(batches))
                hooks.schedule.after_step(step)
                done = step + 1
                losses.append(loss)
                seen += items * world.size
                progress.update(bar, completed=done)
                reports = cadence.reports(done)
                stop = reports and world.main and end_period(bar)
                if reports:
                    losses = []
                if cadence.saves(done) or stop:
                    save("last.pt")
                if reports and world.broadcast_flag(stop):  # every rank waits for rank 0 here
                    break
    except KeyboardInterrupt:
        if cadence.saves_anywhere:
            save("last.pt")
        raise
    except RuntimeError as err:
        if not distributed.peer_failure(err, world):
            raise
        if cadence.saves_anywhere:  # this rank's weights are whole: the failed step never ran
            save("last.pt")
        raise distributed.lost(err, world, out) from None
    finally:
        curves.close()
    return Trained(done, best)
