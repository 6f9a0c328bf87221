"""Image folders in the ImageNet layout: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*``.

A thin check around torchvision's ``ImageFolder`` (classes are the sorted subfolder names,
images are opened as RGB). Train and val must name the same classes, or a label would mean
different things in the two splits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor
from torchvision.datasets import ImageFolder

from posenc_cli.errors import UsageError


def _split(root: Path, name: str, transform: Callable[[Any], Tensor]) -> ImageFolder:
    folder = root / name
    if not folder.is_dir():
        raise UsageError(
            f"data.root: {folder} is not a folder; data.root must hold train/<class>/ and "
            "val/<class>/ image folders (the ImageNet layout)"
        )
    try:
        return ImageFolder(str(folder), transform=transform)
    except FileNotFoundError as error:  # no class folders, or a class with no images
        raise UsageError(f"data.root: {folder}: {error}") from None


def read_folder(
    root: str | None,
    train_transform: Callable[[Any], Tensor],
    val_transform: Callable[[Any], Tensor],
) -> tuple[ImageFolder, ImageFolder]:
    """The train and val ImageFolders under ``root``, with the same classes."""
    if root is None:
        raise UsageError(
            "data.root: the folder data set needs a directory with train/ and val/ "
            "subfolders; set data.root to it"
        )
    base = Path(root)
    train = _split(base, "train", train_transform)
    val = _split(base, "val", val_transform)
    if train.classes != val.classes:
        only = sorted(set(train.classes) ^ set(val.classes))
        raise UsageError(
            f"data.root: train/ and val/ in {root} hold different classes (only in one: "
            f"{', '.join(only[:5])}); give both splits the same class folders"
        )
    return train, val
