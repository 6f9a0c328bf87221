"""Train and eval transforms for the image data sets: timm's for photos, a light tensor path
for the small procedural sets, and the validation translation of the robustness test.

Photos (``folder``, ``cifar10``, ``cifar100``) go through ``timm.data.create_transform``, the
transform DeiT (Touvron et al. 2021) trains with: RandomResizedCrop (``crop_scale``, timm's
default (0.08, 1)), horizontal flip, RandAugment (a timm string such as
``rand-m9-mstd0.5-inc1``), normalisation, then random erasing in "pixel" mode (DeiT's
``--remode pixel``). Colour jitter is off: timm turns DeiT's 0.4 off whenever RandAugment is on,
and without RandAugment we want no augmentation beyond crop, flip and erasing. Eval resizes
the short side and centre-crops: ``crop_pct`` 0.875 for ImageNet-style folders (DeiT's
256 -> 224), 1.0 for CIFAR, whose 32 px images are already the whole object.

Tensors (``digits``, ``direction``) are float images in [0, 1] made at ``image_size`` by
their data set, so the path is normalise, flip, erase. RandAugment is refused there rather
than skipped silently: its ops work on PIL photos, and on ``direction`` rotations and shears
would change the label. Mixup, CutMix and label smoothing belong to the training loop.

Translation (``Translate``): the validation image is rolled by ``shift`` pixels right and
down with ``torch.roll``, i.e. the canvas wraps, so the image keeps its size and token count
and only where things sit changes. ``direction`` leaves an empty margin so that no shape
wraps; on photos the strip that leaves one edge comes back at the other. With a ViT of patch
size p, a shift that is a multiple of p moves whole patches, so the tokens are exactly the
unshifted ones at positions moved by shift / p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from timm.data import create_transform
from timm.data.random_erasing import RandomErasing
from torch import Tensor
from torchvision import transforms

from posenc_cli.errors import UsageError

INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


@dataclass(frozen=True)
class Augment:
    """The recipe's augmentation settings, checked once."""

    randaugment: str | None = None
    random_erasing: float = 0.0
    hflip: float = 0.0
    crop_scale: tuple[float, float] = (0.08, 1.0)
    interpolation: str = "bicubic"


def augment_from(cfg: Any, hflip_default: float) -> Augment:
    """Read ``randaugment``, ``random_erasing``, ``hflip`` (None = ``hflip_default``),
    ``crop_scale`` and ``interpolation`` from ``cfg``; a bad value is a UsageError."""
    hflip = hflip_default if cfg.hflip is None else float(cfg.hflip)
    erasing = float(cfg.random_erasing)
    for key, p in (("data.hflip", hflip), ("data.random_erasing", erasing)):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"{key}: {p} is not a probability; use a value in [0, 1]")
    scale = tuple(float(s) for s in cfg.crop_scale)
    if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
        raise UsageError(
            f"data.crop_scale: {list(cfg.crop_scale)} is not [min, max] with 0 < min <= max <= 1;"
            " DeiT uses [0.08, 1.0]"
        )
    if cfg.interpolation not in INTERPOLATIONS:
        raise UsageError(
            f"data.interpolation: unknown {cfg.interpolation!r}; valid: {', '.join(INTERPOLATIONS)}"
        )
    randaugment = cfg.randaugment or None
    if randaugment is not None and not str(randaugment).startswith("rand"):
        raise UsageError(
            f"data.randaugment: {randaugment!r} is not a RandAugment string; "
            "use one like 'rand-m9-mstd0.5-inc1' or null"
        )
    return Augment(randaugment, erasing, hflip, (scale[0], scale[1]), cfg.interpolation)


def photo_train_transform(
    image_size: int, augment: Augment, mean: tuple[float, ...], std: tuple[float, ...]
) -> Callable[[Any], Tensor]:
    """PIL image -> normalised (C, image_size, image_size) tensor, with DeiT's augmentations."""
    try:
        return create_transform(
            image_size,
            is_training=True,
            scale=augment.crop_scale,
            hflip=augment.hflip,
            color_jitter=None,
            auto_augment=augment.randaugment,
            interpolation=augment.interpolation,
            mean=mean,
            std=std,
            re_prob=augment.random_erasing,
            re_mode="pixel",
            re_count=1,
        )
    except (AssertionError, KeyError, ValueError, IndexError) as error:
        # timm checks the RandAugment string with asserts ("Unknown RandAugment config section").
        raise UsageError(
            f"data.randaugment: timm rejects {augment.randaugment!r} ({error}); "
            "use one like 'rand-m9-mstd0.5-inc1'"
        ) from None


def photo_eval_transform(
    image_size: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    interpolation: str,
    crop_pct: float,
) -> Callable[[Any], Tensor]:
    """PIL image -> resize the short side to image_size / crop_pct, centre-crop, normalise."""
    return create_transform(
        image_size,
        is_training=False,
        crop_pct=crop_pct,
        interpolation=interpolation,
        mean=mean,
        std=std,
    )


def tensor_train_transform(
    augment: Augment, mean: tuple[float, ...], std: tuple[float, ...], dataset: str
) -> Callable[[Tensor], Tensor]:
    """(C, H, W) in [0, 1] -> normalised, randomly flipped and erased; RandAugment refused."""
    if augment.randaugment is not None:
        raise UsageError(
            f"data.randaugment: {dataset} is a tensor data set and RandAugment works on PIL "
            "photos (on direction its rotations would change the label); set data.randaugment "
            "to null"
        )
    steps: list[Callable[[Tensor], Tensor]] = [transforms.Normalize(mean, std)]
    if augment.hflip > 0:
        steps.append(transforms.RandomHorizontalFlip(augment.hflip))
    if augment.random_erasing > 0:
        steps.append(RandomErasing(augment.random_erasing, mode="pixel", device="cpu"))
    return transforms.Compose(steps)


def tensor_eval_transform(
    mean: tuple[float, ...], std: tuple[float, ...]
) -> Callable[[Tensor], Tensor]:
    """(C, H, W) in [0, 1] -> normalised; the data set already made it at image_size."""
    return transforms.Normalize(mean, std)


class Translate:
    """Roll a (C, H, W) tensor ``shift`` pixels right and down; the canvas wraps."""

    def __init__(self, shift: int) -> None:
        self.shift = shift

    def __call__(self, image: Tensor) -> Tensor:
        return torch.roll(image, shifts=(self.shift, self.shift), dims=(-2, -1))

    def __repr__(self) -> str:
        return f"Translate(shift={self.shift})"


def with_shift(transform: Callable[[Any], Tensor], shift: int) -> Callable[[Any], Tensor]:
    """``transform`` followed by the validation translation (unchanged when shift is 0)."""
    return transform if shift == 0 else transforms.Compose([transform, Translate(shift)])
