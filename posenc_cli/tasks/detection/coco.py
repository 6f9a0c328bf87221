"""COCO-format detection data for DETR-lite: the shapes set (shapes.py) or real COCO 2017.

Built on ``torchvision.datasets.CocoDetection``, which reads local files only. Each item is

    image   (3, S, S) float, resized to a square S x S (aspect ratio not kept), normalised
            with the ImageNet mean and std (as DETR's backbone expects)
    target  {"labels": (M,) int64 in [0, C), "boxes": (M, 4) float cxcywh in [0, 1],
             "image_id": int, "orig_size": (2,) int64 (height, width)}

Conventions:
- Labels are contiguous: the categories sorted by COCO id map to 0..C-1 (COCO's 80 ids run
  1..90 with gaps). ``label_to_category[label]`` gives the id back for evaluation.
- Boxes are normalised by the original width and height, so resizing to a square leaves them
  unchanged; ``box * (W, H, W, H)`` gives the original pixels back. A horizontal flip (train
  only, probability 1/2) maps cx to 1 - cx.
- As DETR does, crowd annotations (``iscrowd`` 1) and boxes of zero width or height (after
  clipping to the image) are dropped from the targets; images without objects stay.

Layouts under ``data.root`` (``layout: auto`` picks the one whose annotations exist):

    shapes: train/ val/ annotations/instances_{train,val}.json           (what shapes.py writes)
    coco:   train2017/ val2017/ annotations/instances_{train,val}2017.json  (COCO 2017 as shipped)
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from PIL import Image
from torch import Tensor
from torchvision.datasets import CocoDetection
from torchvision.transforms.functional import normalize, pil_to_tensor

from posenc_cli.errors import UsageError

MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as torchvision's and DETR's backbones use
STD = (0.229, 0.224, 0.225)

Layout = Literal["auto", "shapes", "coco"]
LAYOUTS: dict[str, dict[str, tuple[str, str]]] = {
    # layout -> split -> (image folder, annotation file), both relative to data.root
    "shapes": {
        "train": ("train", "annotations/instances_train.json"),
        "val": ("val", "annotations/instances_val.json"),
    },
    "coco": {
        "train": ("train2017", "annotations/instances_train2017.json"),
        "val": ("val2017", "annotations/instances_val2017.json"),
    },
}

Target = dict[str, Any]


class CocoDetectionData(CocoDetection):
    """One split: ``data[i] -> (image (3, S, S), target)``; see the module docstring."""

    def __init__(
        self, root_images: Path | str, annotation_json: Path | str, image_size: int, train: bool
    ) -> None:
        images, ann_file = Path(root_images), Path(annotation_json)
        if not ann_file.is_file():
            raise UsageError(f"data.root: expected the annotation file {ann_file}")
        if not images.is_dir():
            raise UsageError(f"data.root: expected the image folder {images}")
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
                super().__init__(str(images), str(ann_file))
        except (ValueError, KeyError, TypeError, AssertionError) as err:
            raise UsageError(f"data.root: {ann_file} is not COCO json ({err})") from None
        _check_images(images, ann_file.name, [i["file_name"] for i in self.coco.imgs.values()])
        self.image_size = image_size
        self.train = train
        self.label_to_category: list[int] = sorted(self.coco.cats)
        self.category_to_label = {c: i for i, c in enumerate(self.label_to_category)}
        self.class_names: list[str] = [self.coco.cats[c]["name"] for c in self.label_to_category]

    @property
    def num_classes(self) -> int:
        return len(self.label_to_category)

    def __getitem__(self, index: int) -> tuple[Tensor, Target]:
        image_id = self.ids[index]
        image = self._load_image(image_id)
        width, height = image.size
        labels, boxes = self.targets_of(self._load_target(image_id), width, height)
        image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
        pixels = normalize(pil_to_tensor(image).float() / 255.0, MEAN, STD)  # (3, S, S)
        if self.train and torch.rand(()) < 0.5:
            pixels = pixels.flip(-1)
            boxes[:, 0] = 1.0 - boxes[:, 0]
        target = {
            "labels": labels,
            "boxes": boxes,
            "image_id": int(image_id),
            "orig_size": torch.tensor([height, width], dtype=torch.int64),
        }
        return pixels, target

    def targets_of(
        self, annotations: list[dict[str, Any]], width: int, height: int
    ) -> tuple[Tensor, Tensor]:
        """COCO annotations -> labels (M,) and normalised cxcywh boxes (M, 4)."""
        labels, boxes = [], []
        for ann in annotations:
            if ann.get("iscrowd", 0):
                continue
            x, y, w, h = ann["bbox"]
            x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
            x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
            if x1 <= x0 or y1 <= y0:
                continue
            labels.append(self.category_to_label[ann["category_id"]])
            cx, cy = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height
            boxes.append([cx, cy, (x1 - x0) / width, (y1 - y0) / height])
        return (
            torch.tensor(labels, dtype=torch.int64),  # (M,)
            torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),  # (M, 4)
        )


def collate(batch: list[tuple[Tensor, Target]]) -> tuple[Tensor, list[Target]]:
    """Stack the (equal-sized) images; targets stay a list, since M differs per image."""
    images = torch.stack([image for image, _ in batch])  # (B, 3, S, S)
    return images, [target for _, target in batch]


class DetectionDataConfig(Protocol):
    root: str | Path  # the folder holding one of the LAYOUTS
    image_size: int  # square side S


@dataclass(frozen=True)
class DetectionData:
    train: CocoDetectionData
    val: CocoDetectionData
    layout: Literal["shapes", "coco"]

    @property
    def class_names(self) -> list[str]:
        return self.train.class_names

    @property
    def label_to_category(self) -> list[int]:
        return self.train.label_to_category

    @property
    def num_classes(self) -> int:
        return self.train.num_classes


def detect_layout(root: Path, layout: Layout = "auto") -> Literal["shapes", "coco"]:
    """The layout named, or with "auto" the one whose train annotations exist under root."""
    if layout != "auto":
        if layout not in LAYOUTS:
            raise UsageError(f"data.layout={layout!r} is not one of auto, shapes, coco")
        return layout  # type: ignore[return-value]
    if not root.is_dir():
        raise UsageError(f"data.root={root}: no such folder; make a shapes set or point at COCO")
    for name, splits in LAYOUTS.items():
        if (root / splits["train"][1]).is_file():
            return name  # type: ignore[return-value]
    expected = " or ".join(f"{splits['train'][1]} ({name})" for name, splits in LAYOUTS.items())
    raise UsageError(f"data.root={root}: found neither {expected}")


def build_detection_data(cfg: DetectionDataConfig) -> DetectionData:
    """Train and val splits under ``cfg.root``; ``cfg.layout`` (optional) is auto/shapes/coco."""
    root = Path(cfg.root).expanduser()
    layout = detect_layout(root, getattr(cfg, "layout", "auto"))
    splits = {}
    for split, (folder, ann_file) in LAYOUTS[layout].items():
        splits[split] = CocoDetectionData(
            root / folder, root / ann_file, cfg.image_size, train=split == "train"
        )
    if splits["train"].label_to_category != splits["val"].label_to_category:
        raise UsageError(
            f"data.root={root}: train and val annotations list different categories; "
            "regenerate the set or use matching annotation files"
        )
    return DetectionData(splits["train"], splits["val"], layout)


def _check_images(folder: Path, annotation_name: str, names: list[str]) -> None:
    """Every image the annotations name, checked before training starts, not at step N."""
    listing = set(os.listdir(folder))
    missing = sorted(n for n in names if n not in listing and not (folder / n).is_file())
    if missing:
        raise UsageError(
            f"data.root: {len(missing)} image(s) named in {annotation_name} are missing from "
            f"{folder} (first: {missing[0]})"
        )
