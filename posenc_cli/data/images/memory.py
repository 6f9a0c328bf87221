"""Labelled images held in memory (the digits tensor, CIFAR's arrays) as a map-style data set."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset


class MemoryImages(Dataset):
    """Item ``i`` is ``(transform(decode(images[i])), int(labels[i]))``. ``decode`` turns one
    stored image into what the transform takes: CIFAR's HWC uint8 arrays become PIL images
    (``Image.fromarray``); the digits are float tensors already and pass as they are."""

    def __init__(
        self,
        images: Sequence[Any],
        labels: Sequence[Any],
        transform: Callable[[Any], Tensor],
        classes: list[str],
        decode: Callable[[Any], Any] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.transform = transform
        self.classes = classes
        self.decode = decode

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.images[index]
        if self.decode is not None:
            image = self.decode(image)
        return self.transform(image), int(self.labels[index])
