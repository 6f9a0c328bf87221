"""Buffers the tiles of a blocked kernel write their ``(B, H, rows, keys)`` intermediates into,
reused from tile to tile. A fresh tensor of that size per tile costs page faults: glibc hands
blocks of megabytes back to the system when they are freed, and the next one is faulted in
again. With B=4, H=8 and 256 x 256 tiles (8 MB each) the matmul that fills a tile took 6.4 ms
into a fresh tensor and 3.5 ms into a reused one. (``posenc`` also keeps freed memory in the
process, ``posenc_cli/allocator.py``; these buffers serve the library without it.)"""

from __future__ import annotations

import math

from torch import Tensor


class Scratch:
    """``count`` flat buffers of ``like``'s dtype and device, grown on demand."""

    def __init__(self, like: Tensor, count: int = 2) -> None:
        self.like = like
        self.flat: list[Tensor | None] = [None] * count

    def take(self, which: int, shape: tuple[int, ...]) -> Tensor:
        """A contiguous ``shape`` view of buffer ``which``; what the last take wrote is lost."""
        size = math.prod(shape)
        flat = self.flat[which]
        if flat is None or flat.numel() < size:
            flat = self.flat[which] = self.like.new_empty(size)
        return flat[:size].view(shape)
