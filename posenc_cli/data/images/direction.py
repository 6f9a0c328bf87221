"""Direction: a procedural image task where position is the only signal.

Every image (3 channels, ``image_size`` square) shows a filled square and a plus-shaped cross
on a noisy dark background; the label says where the cross is relative to the square:
``left``, ``right``, ``above`` or ``below`` (``CLASSES``, in that order). The direction is
unambiguous by construction: with d = cross centre - square centre (row, col), the dominant
axis beats the other by at least ``gap`` pixels (|d_col| >= |d_row| + gap for left/right), and
the two bounding boxes are at least ``gap`` pixels apart along it.

Why content alone cannot solve it (a bag of patches without positions is near chance): both
shapes appear in every image, and their sizes, colours and the background are drawn before
the label and independently of it. Placements are drawn for "right" and then mapped to the
label by a mirror or a transpose of the content region, under which a square and a plus are
their own images; so the scenes of any two classes are the same distribution up to that
rigid motion, and only the arrangement of the shapes tells them apart. Because the boxes are
``gap`` apart (4 px at 32 px), no patch of side <= ``gap`` + 1 holds pieces of both shapes,
so no single patch sees the arrangement either. Measured (seed 0, 8000 train / 2000 val
at 32 px, 4 x 4 patches): a DeepSets model (per-patch MLP, mean and max pooling) reaches 28%
validation accuracy (chance 25%; it can still pick up where the patch grid cuts the shapes'
edges, a weak cue), and 99.9% once each patch also gets its (row, col). A horizontal flip
swaps left and right, and RandAugment's rotations and shears change labels: the builder
refuses both for this set.

Determinism: item ``i`` of a split is drawn from
``numpy.random.default_rng(SeedSequence([seed, split, i]))`` (split 0 = train, 1 = val), so
it is the same in every run with the same seed, costs no memory (made on access), and train
and val never share a stream. The labels cycle ``i % 4``, so every split of a multiple of 4
items is exactly balanced.

Translation test: the shapes are placed only in the top-left ``image_size - margin`` square
(``margin = image_size // 4``: 24 of 32 px), in training and validation alike, so the bottom
and right ``margin`` pixels are background in every training image. The shifted validation
set (``data.shift``, at most ``margin``) rolls each validation image ``shift`` pixels right and
down (``transforms.Translate``); only background wraps around the edge, so the shapes, their
arrangement and the label are unchanged while part of the content now sits where no
training image ever had any. A model that reads absolute position is expected to lose
accuracy; one that reads only relative position should not.

Sizes scale with u = image_size / 32: square side 3u..6u, cross span 5u..7u (odd, so the bars
sit on a centre pixel), bar thickness 1 below a span of 10 (3 from 10, and so on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from posenc_cli.data.images.procedural import ProceduralImages
from posenc_cli.errors import UsageError

CLASSES = ["left", "right", "above", "below"]
LEFT, RIGHT, ABOVE, BELOW = range(4)
MIN_SIZE = 16  # below this the two shapes and the gap no longer fit the content region
CANDIDATES = 64  # placements proposed per round of rejection sampling
NOISE_STD = 0.04


@dataclass(frozen=True)
class Geometry:
    """Sizes that follow from ``image_size``."""

    image_size: int

    @property
    def margin(self) -> int:
        return self.image_size // 4

    @property
    def region(self) -> int:
        """Side of the top-left square the shapes live in."""
        return self.image_size - self.margin

    @property
    def gap(self) -> int:
        return max(2, self.image_size // 8)

    @property
    def square_sides(self) -> tuple[int, int]:
        u = self.image_size / 32
        return max(2, round(3 * u)), max(2, round(6 * u))

    @property
    def cross_halves(self) -> tuple[int, int]:
        """Range of (span - 1) / 2 for the cross."""
        u = self.image_size / 32
        return max(1, round(2 * u)), max(1, round(3 * u))


def geometry(image_size: int) -> Geometry:
    if image_size < MIN_SIZE:
        raise UsageError(
            f"data.image_size: direction needs at least {MIN_SIZE} px to fit two shapes and "
            f"the gap between them, got {image_size}"
        )
    return Geometry(image_size)


@dataclass(frozen=True)
class Scene:
    """One image's content. Boxes are (top row, left col, side); rows grow downwards."""

    label: int
    square: tuple[int, int, int]
    cross: tuple[int, int, int]
    thickness: int  # of the cross's bars, odd
    square_colour: tuple[float, float, float]
    cross_colour: tuple[float, float, float]
    background: tuple[float, float, float]

    @property
    def square_centre(self) -> tuple[float, float]:
        row, col, side = self.square
        return row + (side - 1) / 2, col + (side - 1) / 2

    @property
    def cross_centre(self) -> tuple[float, float]:
        row, col, span = self.cross
        return row + (span - 1) / 2, col + (span - 1) / 2


# Background, square and cross colours, drawn in one call: dark background, bright shapes.
COLOUR_LOW = np.array([0.0] * 3 + [0.55] * 6)
COLOUR_HIGH = np.array([0.3] * 3 + [1.0] * 6)


def _rgb(values: np.ndarray) -> tuple[float, float, float]:
    r, g, b = values.astype(np.float32).tolist()
    return r, g, b


def _place_right(
    rng: np.random.Generator, geo: Geometry, side: int, span: int
) -> tuple[int, int, int, int]:
    """Uniform over placements with the cross clearly right of the square: (r1, c1, r2, c2).

    Rejection sampling from all placements inside the region; 6-13% are accepted at every
    size, so one round of CANDIDATES proposals misses less than 2% of the time.
    """
    region, gap = geo.region, geo.gap
    # Top-left corners are uniform integers in [0, region - size]; one draw for all four.
    limits = np.array([region - side + 1, region - side + 1, region - span + 1, region - span + 1])
    while True:
        r1, c1, r2, c2 = (rng.random((4, CANDIDATES)) * limits[:, None]).astype(np.int64)
        d_row = (r2 + (span - 1) / 2) - (r1 + (side - 1) / 2)
        d_col = (c2 + (span - 1) / 2) - (c1 + (side - 1) / 2)
        ok = (c2 - (c1 + side) >= gap) & (d_col - np.abs(d_row) >= gap)
        if ok.any():
            k = int(np.argmax(ok))
            return int(r1[k]), int(c1[k]), int(r2[k]), int(c2[k])


def make_scene(rng: np.random.Generator, geo: Geometry, label: int) -> Scene:
    """Sizes and colours first (label-free), then a "right" placement moved to ``label``."""
    side = int(rng.integers(geo.square_sides[0], geo.square_sides[1] + 1))
    span = 2 * int(rng.integers(geo.cross_halves[0], geo.cross_halves[1] + 1)) + 1
    colours = rng.uniform(COLOUR_LOW, COLOUR_HIGH)  # (9,)
    r1, c1, r2, c2 = _place_right(rng, geo, side, span)
    region = geo.region
    if label == LEFT:  # mirror the columns of the region
        c1, c2 = region - side - c1, region - span - c2
    elif label == BELOW:  # transpose: "cross at larger col" becomes "at larger row"
        r1, c1, r2, c2 = c1, r1, c2, r2
    elif label == ABOVE:  # transpose, then mirror the rows
        r1, c1, r2, c2 = region - side - c1, r1, region - span - c2, r2
    return Scene(
        label=label,
        square=(r1, c1, side),
        cross=(r2, c2, span),
        thickness=2 * (span // 10) + 1,
        square_colour=_rgb(colours[3:6]),
        cross_colour=_rgb(colours[6:9]),
        background=_rgb(colours[0:3]),
    )


def render(scene: Scene, image_size: int, rng: np.random.Generator) -> Tensor:
    """The scene as a (3, image_size, image_size) float tensor in [0, 1]."""
    background = np.asarray(scene.background, dtype=np.float32)[:, None, None]
    noise = rng.normal(0.0, NOISE_STD, size=(3, image_size, image_size)).astype(np.float32)
    image = np.clip(background + noise, 0.0, 1.0)  # (3, S, S)
    row, col, side = scene.square
    image[:, row : row + side, col : col + side] = np.asarray(scene.square_colour)[:, None, None]
    row, col, span = scene.cross
    mid, half = (span - 1) // 2, scene.thickness // 2
    colour = np.asarray(scene.cross_colour)[:, None, None]
    image[:, row + mid - half : row + mid + half + 1, col : col + span] = colour
    image[:, row : row + span, col + mid - half : col + mid + half + 1] = colour
    return torch.from_numpy(image)


class DirectionScenes(ProceduralImages):
    """``count`` scenes of one split, each made on access from (seed, split, index)."""

    classes = CLASSES
    name = "direction"

    def __init__(
        self,
        count: int,
        image_size: int,
        seed: int,
        split: Literal["train", "val"],
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__(count, seed, split, transform)
        self.geometry = geometry(image_size)

    def scene(self, index: int) -> Scene:
        """What item ``index`` shows (positions, sizes, colours, label), without the pixels."""
        return make_scene(self.rng(index), self.geometry, index % len(CLASSES))

    def draw(self, rng: np.random.Generator, label: int) -> Tensor:
        """A scene of class ``label`` as (3, S, S) in [0, 1]."""
        return render(make_scene(rng, self.geometry, label), self.geometry.image_size, rng)
