"""The batch every task returns, the ``Task`` protocol, and the size rules the tasks share.

Conventions:
- Every tensor is built on the CPU from the caller's ``torch.Generator`` (never the global RNG),
  so the same generator state gives the same batch; ``Batch.to`` moves it to the model's device.
- ``split="train"`` draws one problem size per example, uniformly in the task's inclusive
  ``train_lengths`` range, and ignores ``length``; ``split="test"`` uses ``length`` for every
  example. Mixed sizes are padded on the right, and ``key_mask`` marks the real tokens; a batch
  with one size has no padding and ``key_mask=None``.
- LM targets follow the usual shift: the logits at position ``t`` predict token ``t + 1``, so
  ``targets[t]`` is ``tokens[t + 1]`` where a loss is wanted and ``IGNORE`` (-100, the default
  ``ignore_index`` of ``F.cross_entropy``) elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from posenc_cli.errors import UsageError

IGNORE = -100  # target id that carries no loss (F.cross_entropy's default ignore_index)
Split = Literal["train", "test"]


@dataclass
class Batch:
    tokens: Tensor  # (B, T) long
    targets: Tensor  # lm: (B, T) long, IGNORE where no loss; classify: (B,) long labels
    key_mask: Tensor | None = None  # (B, T) bool, True = real token; None when nothing is padded

    def to(self, device: torch.device | str) -> Batch:
        mask = None if self.key_mask is None else self.key_mask.to(device)
        return Batch(self.tokens.to(device), self.targets.to(device), mask)


@runtime_checkable
class Task(Protocol):
    kind: Literal[
        "lm", "classify"
    ]  # lm: causal decoder predicts targets; classify: encoder + label
    vocab_size: int  # includes every special token the task uses
    num_classes: int  # classify only (0 for lm)

    def batch(
        self, batch_size: int, length: int, generator: torch.Generator, split: Split
    ) -> Batch: ...

    def tokens(self, length: int) -> int: ...  # tokens in one sequence of problem size length


def length_range(value: Sequence[int], minimum: int) -> tuple[int, int]:
    """``data.train_lengths`` as an inclusive ``(lo, hi)``; a UsageError names the key."""
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise UsageError(f"data.train_lengths: expected two integers [min, max], got {value!r}")
    lo, hi = value
    if lo < minimum or lo > hi:
        raise UsageError(
            f"data.train_lengths: need {minimum} <= min <= max, got [{lo}, {hi}]; "
            f"fix the range in the recipe"
        )
    return lo, hi


def problem_sizes(
    batch_size: int,
    length: int,
    train_lengths: tuple[int, int],
    generator: torch.Generator,
    split: Split,
) -> Tensor:
    """One problem size per example, ``(B,)`` long: drawn in training (uniform over the range),
    ``length`` in test."""
    if split == "train":
        lo, hi = train_lengths
        return torch.randint(lo, hi + 1, (batch_size,), generator=generator)
    if split == "test":
        return torch.full((batch_size,), length, dtype=torch.long)
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def curriculum_largest(step: int, train_lengths: tuple[int, int], steps: int) -> int:
    """The largest problem size drawn at ``step`` (from 0) under a curriculum of ``steps``: it
    grows evenly from just above the smallest to the largest size, reached at the last step of
    the curriculum; with ``steps`` 0, the largest from the start. A function of the step alone,
    so a resumed run draws what the uninterrupted one drew."""
    lo, hi = train_lengths
    if steps <= 0:
        return hi
    return min(hi, lo + -(-(hi - lo) * (step + 1) // steps))


def size_groups(sizes: Tensor) -> list[tuple[int, Tensor]]:
    """``(size, row indices)`` per distinct size, in increasing size (a fixed sampling order)."""
    return [(n, (sizes == n).nonzero().squeeze(1)) for n in sizes.unique(sorted=True).tolist()]


def key_mask_for(lengths: Tensor, width: int) -> Tensor | None:
    """``(B, width)`` bool mask of real tokens, or None when every row fills the width."""
    if bool((lengths == width).all()):
        return None
    return torch.arange(width)[None, :] < lengths[:, None]  # (B, width)
