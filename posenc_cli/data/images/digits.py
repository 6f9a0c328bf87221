"""Handwritten digits: scikit-learn's ``load_digits`` (the UCI optical recognition set, 1797
8 x 8 images of 16 grey levels, 0-9), shipped inside the package, so nothing is downloaded.

Conventions: one channel; pixel values 0..16 are scaled to [0, 1], then the whole set is
upsampled once to ``image_size`` with bilinear interpolation (``align_corners=False``) and
kept in memory (1797 x 32 x 32 floats is 7 MB). The train/val split is a permutation of all
indices drawn from ``torch.Generator().manual_seed(seed)``: the first ``val_count`` go to val,
so one seed always gives the same split and the two splits never share an image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor

GREY_LEVELS = 16  # load_digits pixels are counts 0..16 of a 4x4 block of the 32x32 scan


def digit_images(image_size: int) -> tuple[Tensor, Tensor]:
    """All 1797 digits: images (1797, 1, image_size, image_size) in [0, 1], labels (1797,)."""
    bunch = load_digits()
    small = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / GREY_LEVELS
    # (1797, 1, 8, 8) -> (1797, 1, S, S)
    images = F.interpolate(
        small, size=(image_size, image_size), mode="bilinear", align_corners=False
    )
    return images.clamp(0.0, 1.0), torch.as_tensor(bunch.target, dtype=torch.int64)


def split_indices(count: int, val_count: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded permutation of ``range(count)``: (train indices, val indices)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return order[val_count:], order[:val_count]
