"""Motion: a procedural video task whose label is the direction an object moves.

A clip of ``frames`` frames (``side`` px square, 3 channels) shows one bright square on a noisy
dark background, moving ``step`` px per frame ``left``, ``right``, ``up`` or ``down``
(``CLASSES``, in that order). The clip reaches the model as one image with the frames stacked
along the rows, ``(3, frames * side, side)`` (``models/clip_layout.py``).

Why order in time is the signal: the square's size, colour, the background and the start are
drawn before the label and independently of it, and the start is uniform over the places from
which the whole path fits. So a clip moving right is, frame for frame, a clip moving left played
backwards: the set of frames (and so any bag of patches, or of patches with their place inside
their frame) is the same distribution for left and right, and likewise for up and down. Without
knowing which frame comes first a model can tell the axis of motion but not its sign: at most
50%. Reading the frame of each patch (a 1D index over the clip, an absolute table over the clip,
or a time axis) solves it.

Sizes scale with ``side``: ``step = max(1, side // 8)``, square side from ``side // 4`` to
``side // 2`` (at least 2), so the path (``(frames - 1) * step`` px) leaves room for the start to
vary. Nothing is downloaded; items are made on access (``procedural.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.images.procedural import ProceduralImages
from posenc_cli.errors import UsageError

CLASSES = ["left", "right", "up", "down"]
# (row, col) change per frame of each class
VELOCITY = {0: (0, -1), 1: (0, 1), 2: (-1, 0), 3: (1, 0)}
NOISE_STD = 0.04
MIN_SIDE = 8


def motion_geometry(side: int, frames: int) -> tuple[int, int, int]:
    """``(step, smallest square, largest square)``; UsageError where the path does not fit."""
    step = max(1, side // 8)
    low, high = max(2, side // 4), max(2, side // 2)
    if side < MIN_SIDE or frames < 2 or high + (frames - 1) * step > side:
        raise UsageError(
            f"data: motion needs frames >= 2 and a side of at least {MIN_SIDE} px that holds "
            f"the square's path ({frames} frames of {step} px steps), got side {side}, "
            f"frames {frames}; use more px (data.image_size) or fewer data.frames"
        )
    return step, low, high


class MotionClips(ProceduralImages):
    """``count`` clips of one split, each made on access from (seed, split, index)."""

    classes = CLASSES
    name = "motion"

    def __init__(self, count, side, frames, seed, split, transform=None) -> None:
        super().__init__(count, seed, split, transform)
        self.side, self.frames = side, frames
        self.step, self.smallest, self.largest = motion_geometry(side, frames)

    def draw(self, rng: np.random.Generator, label: int) -> Tensor:
        size = int(rng.integers(self.smallest, self.largest + 1))
        colours = rng.uniform([0.0] * 3 + [0.55] * 3, [0.3] * 3 + [1.0] * 3)  # background, square
        travel = (self.frames - 1) * self.step
        along = int(rng.integers(0, self.side - size - travel + 1))  # start on the moving axis
        across = int(rng.integers(0, self.side - size + 1))
        d_row, d_col = VELOCITY[label]
        if d_row == 0:  # horizontal: a left-mover starts where a right-mover ends
            row, col = across, along + (travel if d_col < 0 else 0)
        else:
            row, col = along + (travel if d_row < 0 else 0), across
        shape = (3, self.frames * self.side, self.side)
        noise = rng.normal(0.0, NOISE_STD, size=shape).astype(np.float32)
        clip = np.clip(colours[:3, None, None].astype(np.float32) + noise, 0.0, 1.0)
        for t in range(self.frames):
            top = t * self.side + row + t * self.step * d_row
            left = col + t * self.step * d_col
            clip[:, top : top + size, left : left + size] = colours[3:, None, None]
        return torch.from_numpy(clip)
