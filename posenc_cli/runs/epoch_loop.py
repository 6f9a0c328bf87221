"""The epoch loop the image and detection tasks share; a task hands in what differs.

Per epoch: the task's batches for this rank, one optimiser step per batch (the task's
``train_step`` returns the loss and how many images it saw), then on rank 0 the task's
validation score, one log line (and its curves), ``best.pt`` when the score improved and
``last.pt`` always, while the other ranks wait at a barrier. A Ctrl-C or SIGTERM leaves
``last.pt`` at the end of the last finished epoch (the partial one is redone on resume); a lost
rank becomes one line (``distributed.lost``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from posenc_cli.runs import distributed
from posenc_cli.runs.curves import Curves
from posenc_cli.runs.distributed import World
from posenc_cli.runs.epochs import log_epoch
from posenc_cli.runs.progress import progress_bar


@dataclass
class EpochTask:
    """What one task's epoch loop does differently."""

    batches: Callable[[int], Iterable[Any]]  # epoch -> this rank's batches
    train_step: Callable[[int, int, Any], tuple[float, int]]  # (step, epoch, batch) -> loss, images
    score: Callable[[], tuple[dict[str, float], float]]  # -> (validation figures, the score)
    checkpoint: Callable[[Path, int, float], None]  # (path, finished epochs, best score)
    optimizer: Any  # its first group's learning rate is logged
    score_name: str  # the score on the progress bar: "val top-1 %", "val AP"
    begin_epoch: Callable[[int], None]  # epoch -> None: train mode, the epoch's learning rate


def run_epochs(
    task: EpochTask,
    out: Path,
    world: World,
    train: Any,
    per_epoch: int,
    start_epoch: int,
    best: float,
    console: Console,
    interrupt_at: int | None = None,
) -> float:
    """Train from ``start_epoch`` to ``train.epochs`` (a task's train section, which also says
    ``tensorboard``); returns the best score. ``interrupt_at`` simulates a Ctrl-C before that
    global step (tests use it)."""
    epochs = train.epochs
    log_path = out / "metrics.jsonl"
    curves = Curves(out, train.tensorboard and world.main, resumed_at=start_epoch * per_epoch)
    progress = progress_bar(console, world.main)
    t0, images_seen = time.perf_counter(), 0
    try:
        with progress:
            total = epochs * per_epoch
            bar = progress.add_task(
                out.name, total=total, completed=start_epoch * per_epoch, stats=""
            )
            for epoch in range(start_epoch, epochs):
                task.begin_epoch(epoch)
                losses = []
                for i, batch in enumerate(task.batches(epoch)):
                    step = epoch * per_epoch + i
                    if interrupt_at is not None and step == interrupt_at:
                        raise KeyboardInterrupt
                    value, images = task.train_step(step, epoch, batch)
                    losses.append(value)
                    images_seen += images * world.size
                    progress.update(bar, completed=step + 1)
                if not world.main:  # rank 0 scores, logs and saves; the others wait
                    world.barrier()
                    continue
                val, score = task.score()
                rate = images_seen / (time.perf_counter() - t0)
                lr = task.optimizer.param_groups[0]["lr"]
                row = log_epoch(log_path, epoch, per_epoch, lr, losses, rate, val)
                curves.add(row)
                if score > best:
                    best = score
                    task.checkpoint(out / "best.pt", epoch + 1, best)
                task.checkpoint(out / "last.pt", epoch + 1, best)
                stats = f"loss {row['train_loss']:.3f}  {task.score_name} {score:.1f}"
                progress.update(bar, stats=f"{stats}  {row['images_per_s']:.0f} img/s")
                world.barrier()
    except RuntimeError as err:
        if not distributed.peer_failure(err, world):
            raise
        raise distributed.lost(err, world, out) from None
    finally:
        curves.close()
    return best
