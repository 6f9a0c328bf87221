"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) read from the python batch files a user obtained.

Layout of the "python version" archives (https://www.cs.toronto.edu/~kriz/cifar.html):
CIFAR-10 ``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``
(``label_names``); CIFAR-100 ``train``, ``test``, ``meta`` (``fine_label_names``). Each batch
is a pickled dict with ``data``, an (N, 3072) uint8 array whose row holds the 1024 red values,
then the 1024 green, then the 1024 blue of a 32 x 32 image, each plane row-major, and
``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100; the 20 coarse labels are not used).

We read the files ourselves instead of through torchvision's CIFAR classes: those check the
md5 of every file, which rejects any re-packed or test copy, and offer a download we must
never start. The originals were pickled by Python 2, so they are loaded with
``encoding="latin1"`` (as torchvision does) and keys that come back as bytes are decoded.
Unpickling runs code from the file: open only CIFAR files you trust.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from posenc_cli.errors import UsageError

Variant = Literal["cifar10", "cifar100"]


@dataclass(frozen=True)
class CifarFiles:
    """Where one variant keeps its files, and under which keys."""

    folder: str  # the folder the official archive extracts to
    train: tuple[str, ...]
    test: str
    meta: str
    label_key: str
    names_key: str


FILES: dict[str, CifarFiles] = {
    "cifar10": CifarFiles(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        "batches.meta",
        "labels",
        "label_names",
    ),
    "cifar100": CifarFiles(
        "cifar-100-python", ("train",), "test", "meta", "fine_labels", "fine_label_names"
    ),
}


@dataclass(frozen=True)
class CifarArrays:
    """One variant in memory: images (N, 32, 32, 3) uint8 in R, G, B order, labels (N,)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: list[str]


def _text(value: Any) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def _unpickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as error:
        raise UsageError(f"data.root: {path} is not a CIFAR python batch ({error})") from None
    if not isinstance(entry, dict):
        raise UsageError(f"data.root: {path} is not a CIFAR python batch (not a dict)")
    return {_text(key): value for key, value in entry.items()}


def read_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images (N, 32, 32, 3) uint8 and labels (N,) int64."""
    entry = _unpickle(path)
    if "data" not in entry or label_key not in entry:
        raise UsageError(
            f"data.root: {path} has no 'data'/'{label_key}' entries; is it the right CIFAR "
            "variant (data.dataset)?"
        )
    data = np.asarray(entry["data"], dtype=np.uint8)
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise UsageError(
            f"data.root: {path} holds data of shape {data.shape} and {len(labels)} labels; "
            "expected (N, 3072) and N"
        )
    # (N, 3072) -> (N, 3, 32, 32): the planes are R, G, B, each row-major; PIL wants HWC.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
    return np.ascontiguousarray(images), labels


def find_folder(root: str | None, variant: Variant) -> Path:
    """``root`` itself or its archive subfolder, whichever holds the variant's files."""
    files = FILES[variant]
    if root is None:
        raise UsageError(
            f"data.root: {variant} needs the folder of its python batch files "
            f"({files.folder}); set data.root to it"
        )
    needed = [*files.train, files.test, files.meta]
    for folder in (Path(root), Path(root) / files.folder):
        if all((folder / name).is_file() for name in needed):
            return folder
    raise UsageError(
        f"data.root: no {variant} batches in {root} (need {', '.join(needed)}, from the "
        f"python archive that extracts to {files.folder}); set data.root to that folder"
    )


def read_cifar(root: str | None, variant: Variant) -> CifarArrays:
    """Every training batch, the test batch and the class names of one variant."""
    files = FILES[variant]
    folder = find_folder(root, variant)
    parts = [read_batch(folder / name, files.label_key) for name in files.train]
    test_images, test_labels = read_batch(folder / files.test, files.label_key)
    meta = _unpickle(folder / files.meta)
    if files.names_key not in meta:
        raise UsageError(f"data.root: {folder / files.meta} has no '{files.names_key}' entry")
    return CifarArrays(
        train_images=np.concatenate([images for images, _ in parts]),
        train_labels=np.concatenate([labels for _, labels in parts]),
        test_images=test_images,
        test_labels=test_labels,
        class_names=[_text(name) for name in meta[files.names_key]],
    )
