"""The pieces the tasks' loop hooks are made of: the optimiser step (all three tasks), and for
the epoch tasks (images, detection) the seeding, each epoch's data order and ``epoch_hooks``:
the batches from a step on, the end-of-epoch report with its log line, the progress bar's
figures."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from posenc_cli.runs.directory import TrainingStopped, append_metrics
from posenc_cli.runs.distributed import World
from posenc_cli.runs.loop import TrainingHooks
from posenc_cli.runs.schedule import Schedule


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch, numpy and random (timm's augmentations and Mixup use all three); returns a
    generator for the data order."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    return torch.Generator().manual_seed(seed)


def epoch_loader(
    dataset: Dataset,
    batch_size: int,
    world: World,
    seed: int,
    epoch: int,
    workers: int = 0,
    drop_last: bool = False,
    collate_fn: Any = None,
) -> DataLoader:
    """The epoch's batches for this process, every random draw seeded from (seed, epoch, rank).
    Under torchrun every process shuffles alike and takes a disjoint share."""
    order = seed_everything(seed * 1_000_003 + epoch + 7919 * world.rank)
    sampler = None
    if world.size > 1:
        sampler = DistributedSampler(
            dataset, world.size, world.rank, seed=seed, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=drop_last,
        generator=order if sampler is None else None,
        collate_fn=collate_fn,
        num_workers=workers,
    )


def epoch_batches(
    loader: Callable[[int], Iterable[Any]], per_epoch: int
) -> Callable[[int], Iterator[Any]]:
    """The loop's ``batches`` hook for an epoch task: from a step on (an epoch's first step, where
    an epoch task resumes), each epoch's loader in turn."""

    def batches(first: int) -> Iterator[Any]:
        for epoch in itertools.count(first // per_epoch):
            count = 0
            for batch in loader(epoch):
                count += 1
                yield batch
            if count != per_epoch:  # epochs would drift off the loop's count (or never end)
                raise RuntimeError(
                    f"epoch {epoch} gave {count} batches; the loop counts {per_epoch}"
                )

    return batches


def optimize(
    loss: torch.Tensor, model, optimizer, grad_clip: float, stopped: str | Callable[[], str]
) -> float:
    """One step on ``loss`` for every task; returns its value. A loss that is not finite stops
    training before it touches the weights, with ``stopped`` (where the last good checkpoint
    is, and the fix; a callable when saying so costs a read)."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingStopped(f"loss became {value} {stopped() if callable(stopped) else stopped}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        # foreach: the CPU would otherwise take one norm and one scale per tensor in Python
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=True)
    optimizer.step()
    return value


def log_epoch(
    log_path: Path, epoch: int, per_epoch: int, lr: float, losses: list[float], rate: float, val
) -> dict[str, Any]:
    """Append the line of a finished epoch (0-based ``epoch``) to the metrics log; returns it."""
    row = {
        "step": (epoch + 1) * per_epoch,
        "epoch": epoch + 1,
        "lr": lr,
        "train_loss": sum(losses) / len(losses),
        "images_per_s": rate,
        **{f"val_{k}": v for k, v in val.items()},
    }
    append_metrics(log_path, row)
    return row


def epoch_report(
    score: Callable[[], tuple[dict[str, float], float]], optimizer, per_epoch: int, log_path: Path
):
    """The loop's ``report`` hook for an epoch task: ``score`` (validation figures, the score),
    then the epoch's line with the throughput so far, validation included."""

    def report(done: int, losses: list[float], per_second: Callable[[], float]):
        val, value = score()
        lr = optimizer.param_groups[0]["lr"]
        row = log_epoch(log_path, done // per_epoch - 1, per_epoch, lr, losses, per_second(), val)
        return row, value

    return report


def epoch_stats(score_name: str) -> Callable[[dict[str, Any], float], str]:
    """The progress bar's figures after an epoch: ``score_name`` says what the score is."""

    def stats(row: dict[str, Any], score: float) -> str:
        figures = f"loss {row['train_loss']:.3f}  {score_name} {score:.1f}"
        return f"{figures}  {row['images_per_s']:.0f} img/s"

    return stats


def epoch_hooks(
    per_epoch: int,
    loader: Callable[[int], Iterable[Any]],
    train_step: Callable[[int, Any], tuple[float, int]],
    score: Callable[[], tuple[dict[str, float], float]],
    score_name: str,
    checkpoint: Callable[[Path, dict[str, int], float], None],
    schedule: Schedule,
    *,
    optimizer,
    log_path: Path,
) -> TrainingHooks:
    """The loop's hooks for an epoch task, from its loader of an epoch's batches, its step, its
    validation score (``score_name`` on the progress bar) and its checkpoint; ``optimizer``
    gives the rate each log line records."""
    return TrainingHooks(
        batches=epoch_batches(loader, per_epoch),
        train_step=train_step,
        report=epoch_report(score, optimizer, per_epoch, log_path),
        checkpoint=checkpoint,
        stats=epoch_stats(score_name),
        schedule=schedule,
    )
