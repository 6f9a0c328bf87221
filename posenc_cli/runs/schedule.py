"""Learning-rate schedules behind one interface: the loop calls ``before_step`` and
``after_step`` around every optimiser step, and each task builds its curve here with its own
numbers (``warmup_cosine`` for text, ``timm_cosine`` for images, ``step_decay`` for detection).

Two hooks, not one, because the tasks set the rate at different moments and the moment shows
in ``metrics.jsonl``: text and detection set step s's rate before step s, so a log line holds
the rate just used; timm's scheduler is stepped after each update to the next step's rate, so
an image log line holds the rate the next step will use. timm's scheduler is kept as it is, not
rewritten: it also records ``initial_lr`` in the optimiser's state, which checkpoints carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


def _unchanged(step: int) -> None:
    return None


@dataclass(frozen=True)
class Schedule:
    """What the loop calls around step ``step`` (0-based) to set the learning rate."""

    before_step: Callable[[int], None] = _unchanged
    after_step: Callable[[int], None] = _unchanged


def warmup_cosine_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1, then cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def warmup_cosine(optimizer: torch.optim.Optimizer, lr: float, warmup: int, total: int) -> Schedule:
    """``lr`` times ``warmup_cosine_factor`` for every group, set before each step."""

    def before(step: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr * warmup_cosine_factor(step, warmup, total)

    return Schedule(before_step=before)


def timm_cosine(
    optimizer: torch.optim.Optimizer, total: int, warmup: int, min_lr: float, warmup_lr: float
) -> Schedule:
    """timm's ``CosineLRScheduler`` counted in updates: linear warm-up from ``warmup_lr`` over
    ``warmup`` steps, cosine to ``min_lr`` at ``total``. Build it before a resume loads the
    optimiser: it reads the groups' starting rates now."""
    from timm.scheduler import CosineLRScheduler

    scheduler = CosineLRScheduler(
        optimizer,
        t_initial=total,
        lr_min=min_lr,
        warmup_t=warmup,
        warmup_lr_init=warmup_lr,
        t_in_epochs=False,
    )
    return Schedule(after_step=lambda step: scheduler.step_update(step + 1))


def step_decay(
    optimizer: torch.optim.Optimizer, base_lrs: list[float], drop_at: int, factor: float
) -> Schedule:
    """Each group at its ``base_lrs`` rate, times ``factor`` from step ``drop_at`` on (never when
    ``drop_at`` is 0)."""

    def before(step: int) -> None:
        scale = factor if drop_at and step >= drop_at else 1.0
        for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = lr * scale

    return Schedule(before_step=before)
