"""What the training loops share: seeding, the data order and resuming from the last finished
epoch (images, detection), the optimiser step (all three tasks) and the end-of-epoch log line."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from posenc_cli.runs.checkpoint import load_checkpoint
from posenc_cli.runs.directory import TrainingStopped, append_metrics, truncate_metrics
from posenc_cli.runs.distributed import World


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


def resume_from(
    last: Path, model, optimizer, world: World, log_path: Path, per_epoch: int
) -> tuple[int, float, dict[str, Any]]:
    """Load ``last`` into model and optimizer: ``(finished epochs, best score, the state)``;
    ``(0, -inf, {})`` when there is nothing to resume. Log lines past it are dropped."""
    if not last.is_file():
        return 0, -math.inf, {}
    state = load_checkpoint(last)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    epoch = int(state["epoch"])
    if world.main:
        truncate_metrics(log_path, epoch * per_epoch)
    return epoch, float(state["best"]), state


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
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
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
