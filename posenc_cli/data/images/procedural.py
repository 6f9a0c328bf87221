"""The frame every procedural image set shares: item ``i`` of a split is drawn on access from
``numpy.random.default_rng(SeedSequence([seed, split, i]))`` (split 0 = train, 1 = val), so it
is the same in every run with that seed, costs no memory, and the splits never share a stream.
Labels cycle ``i % classes``: a split of a multiple of the class count is exactly balanced."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

import numpy as np
from torch import Tensor
from torch.utils.data import Dataset

from posenc_cli.errors import UsageError

SPLITS = {"train": 0, "val": 1}


class ProceduralImages(Dataset, ABC):
    """``count`` items of one split; a subclass draws one with ``draw(rng, label)``."""

    classes: list[str] = []
    name = "procedural"

    def __init__(
        self,
        count: int,
        seed: int,
        split: Literal["train", "val"],
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        if seed < 0:
            raise UsageError(f"data.seed: {self.name} needs a seed >= 0, got {seed}")
        self.count, self.seed, self.split, self.transform = count, seed, split, transform

    def __len__(self) -> int:
        return self.count

    @abstractmethod
    def draw(self, rng: np.random.Generator, label: int) -> Tensor:
        """One item of class ``label``, in [0, 1], from ``rng`` alone."""

    def rng(self, index: int) -> np.random.Generator:
        """The generator item ``index`` is drawn from."""
        if not 0 <= index < self.count:
            raise IndexError(f"item {index} out of range for {self.count} items")
        return np.random.default_rng(np.random.SeedSequence([self.seed, SPLITS[self.split], index]))

    def image(self, index: int) -> Tensor:
        """Item ``index`` in [0, 1], before any transform."""
        return self.draw(self.rng(index), index % len(self.classes))

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.image(index)
        if self.transform is not None:
            image = self.transform(image)
        return image, index % len(self.classes)
