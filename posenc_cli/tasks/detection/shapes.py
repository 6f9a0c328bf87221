"""A procedural detection data set (circles, squares, triangles) written in real COCO format.

Layout under ``out`` (the same one ``coco.py`` reads)::

    train/000001.png ...   val/000042.png ...
    annotations/instances_train.json   annotations/instances_val.json
    .posenc-shapes         the parameters it was made with (marks the folder as ours)

Conventions:
- COCO's: category ids start at 1 (circle 1, square 2, triangle 3); image and annotation ids
  start at 1 and are unique across both splits (COCOeval treats a ground-truth id of 0 as "no
  match", so 0 would silently count as a miss); ``bbox`` is [x, y, w, h] in pixels with pixel
  (r, c) covering [c, c + 1) x [r, r + 1), so a shape whose pixels span columns c0..c1 has
  x = c0, w = c1 - c0 + 1. No ``segmentation`` (COCO bbox evaluation does not read it).
- Boxes and areas are those of the *visible* pixels (as COCO's are): later shapes are drawn
  over earlier ones. A shape may cover at most ``MAX_COVER`` of another's bounding box, so
  every shape stays mostly visible. Shapes are flat-coloured and drawn without anti-aliasing,
  so each pixel belongs to one shape or to the background and boxes are exact.
- Every image holds 1..``max_objects`` shapes (fewer when a small image has no room left), of
  side ``MIN_SIDE..MAX_SIDE`` of the image, in a colour far from the background; half the
  backgrounds are plain, half noisy (``background`` picks one kind for all).
- Deterministic: image i is drawn from ``numpy.random.default_rng([seed, i])``, so a seed
  gives the same PNG bytes and JSON every time. The last ``round(images * val_fraction)``
  images form the validation split.

Writing order makes a crash harmless: the marker first, then the images, then each JSON
through a temporary file and a rename, so a JSON never names a missing image. ``out`` must be
empty, absent, or a shapes set made earlier (which is rewritten, or kept as it is when it was
made with the same parameters). Anything else is refused, so a typo cannot wipe a folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, ImageDraw

from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import atomic_write_json, atomic_write_text

CATEGORIES = ("circle", "square", "triangle")  # category id = index + 1
MARKER = ".posenc-shapes"
MIN_SIDE, MAX_SIDE = 0.12, 0.4  # shape side as a fraction of the image side
MAX_COVER = 0.2  # largest fraction of a box that an overlapping box may cover
NOISE_STD = 12.0  # grey levels of background noise
MIN_CONTRAST = 120.0  # Euclidean RGB distance between a shape and the background
PLACEMENT_TRIES = 30

Background = Literal["mixed", "plain", "noisy"]


@dataclass(frozen=True)
class ShapesParams:
    images: int
    seed: int
    size: int
    max_objects: int
    val_fraction: float
    background: Background
    version: int = 1  # bump when the drawing changes, so old sets are rebuilt


@dataclass(frozen=True)
class ShapesSet:
    """What ``make_shapes`` left in ``root``; ``reused`` when it was there already."""

    root: Path
    train_images: int
    val_images: int
    annotations: int
    reused: bool


@dataclass(frozen=True)
class DrawnImage:
    pixels: np.ndarray  # (size, size, 3) uint8
    boxes: list[tuple[float, float, float, float]]  # visible [x, y, w, h] per shape
    areas: list[int]  # visible pixels per shape
    categories: list[int]  # COCO category id per shape


def make_shapes(
    out: Path,
    images: int,
    seed: int = 0,
    size: int = 64,
    max_objects: int = 4,
    val_fraction: float = 0.2,
    background: Background = "mixed",
) -> ShapesSet:
    """Write (or reuse) a shapes set under ``out``; see the module docstring for the layout."""
    params = ShapesParams(images, seed, size, max_objects, val_fraction, background)
    _check(params)
    out = Path(out)
    marker = out / MARKER
    _check_target(out, marker)
    splits = _split_indices(images, val_fraction)
    jsons = {split: out / "annotations" / f"instances_{split}.json" for split in splits}

    if _marker_params(marker) == asdict(params) and all(p.is_file() for p in jsons.values()):
        return _summary(out, jsons, reused=True)

    # an old set is invalidated first: its JSONs go before any image changes under them
    for path in jsons.values():
        path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps(asdict(params), sort_keys=True) + "\n")
    annotation_id = 0  # runs on across splits, so ids are unique in the whole set
    for split, indices in splits.items():
        folder = out / split
        folder.mkdir(exist_ok=True)
        for stale in folder.glob("*.png"):
            stale.unlink()
        coco = _empty_coco(params, split)
        for i in indices:
            drawn = draw_image(np.random.default_rng([seed, i]), size, max_objects, background, i)
            image_id = i + 1
            name = f"{image_id:06d}.png"
            Image.fromarray(drawn.pixels).save(folder / name)
            coco["images"].append(
                {"id": image_id, "file_name": name, "width": size, "height": size}
            )
            for box, area, category in zip(drawn.boxes, drawn.areas, drawn.categories, strict=True):
                annotation_id += 1
                coco["annotations"].append(
                    {
                        "id": annotation_id,
                        "image_id": image_id,
                        "category_id": category,
                        "bbox": list(box),
                        "area": float(area),
                        "iscrowd": 0,
                    }
                )
        jsons[split].parent.mkdir(exist_ok=True)
        atomic_write_json(jsons[split], coco)
    return _summary(out, jsons, reused=False)


def draw_image(
    rng: np.random.Generator, size: int, max_objects: int, background: Background, index: int = 0
) -> DrawnImage:
    """One picture and its visible boxes. ``index`` picks plain/noisy in "mixed" mode."""
    bg_colour = rng.integers(0, 256, size=3).astype(np.float64)
    noisy = background == "noisy" or (background == "mixed" and index % 2 == 1)
    pixels = np.broadcast_to(bg_colour, (size, size, 3)).copy()  # (S, S, 3)
    if noisy:
        pixels += rng.normal(0.0, NOISE_STD, size=(size, size, 3))
    pixels = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)

    owner = np.full((size, size), -1, dtype=np.int64)  # (S, S): which shape shows at a pixel
    placed: list[tuple[int, int, int]] = []  # (x0, y0, side) of the drawn shapes
    categories: list[int] = []
    count = int(rng.integers(1, max_objects + 1))
    lo, hi = max(4, round(MIN_SIDE * size)), max(5, round(MAX_SIDE * size))
    for _ in range(count):
        spot = _place(rng, size, lo, hi, placed)
        if spot is None:
            break
        x0, y0, side = spot
        category = int(rng.integers(1, len(CATEGORIES) + 1))
        mask = _shape_mask(CATEGORIES[category - 1], x0, y0, side, size, rng)
        pixels[mask] = _colour_far_from(rng, bg_colour)
        owner[mask] = len(placed)
        placed.append(spot)
        categories.append(category)

    boxes, areas, kept = [], [], []
    for k, category in enumerate(categories):
        rows, cols = np.nonzero(owner == k)
        if len(rows) == 0:  # cannot happen under MAX_COVER, but a box of nothing is never written
            continue
        x, y = float(cols.min()), float(rows.min())
        boxes.append((x, y, float(cols.max()) + 1.0 - x, float(rows.max()) + 1.0 - y))
        areas.append(len(rows))
        kept.append(category)
    return DrawnImage(pixels, boxes, areas, kept)


def _place(
    rng: np.random.Generator, size: int, lo: int, hi: int, placed: list[tuple[int, int, int]]
) -> tuple[int, int, int] | None:
    """A random square spot that overlaps no earlier one by more than MAX_COVER of either."""
    for _ in range(PLACEMENT_TRIES):
        side = int(rng.integers(lo, hi + 1))
        x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
        if all(_cover(x0, y0, side, *other) <= MAX_COVER for other in placed):
            return x0, y0, side
    return None


def _cover(x0: int, y0: int, s0: int, x1: int, y1: int, s1: int) -> float:
    """Intersection of two squares over the smaller one's area."""
    w = min(x0 + s0, x1 + s1) - max(x0, x1)
    h = min(y0 + s0, y1 + s1) - max(y0, y1)
    return max(w, 0) * max(h, 0) / min(s0, s1) ** 2


def _shape_mask(
    kind: str, x0: int, y0: int, side: int, size: int, rng: np.random.Generator
) -> np.ndarray:
    """(size, size) bool mask of one shape inside the pixel square [x0, x0 + side)^2."""
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    x1, y1 = x0 + side - 1, y0 + side - 1  # PIL's corners are inclusive pixel coordinates
    if kind == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=255)
    elif kind == "square":
        draw.rectangle((x0, y0, x1, y1), fill=255)
    else:  # a triangle with its apex up, down, left or right
        mid_x, mid_y = (x0 + x1) / 2, (y0 + y1) / 2
        corners = {
            0: [(mid_x, y0), (x0, y1), (x1, y1)],
            1: [(x0, y0), (x1, y0), (mid_x, y1)],
            2: [(x0, mid_y), (x1, y0), (x1, y1)],
            3: [(x0, y0), (x0, y1), (x1, mid_y)],
        }[int(rng.integers(0, 4))]
        draw.polygon(corners, fill=255)
    return np.asarray(canvas) > 0


def _colour_far_from(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A random RGB colour at least MIN_CONTRAST from the background (its opposite if none
    of a few draws is: the RGB cube always has a corner that far away)."""
    for _ in range(20):
        colour = rng.integers(0, 256, size=3)
        if np.linalg.norm(colour - background) >= MIN_CONTRAST:
            return colour.astype(np.uint8)
    return np.where(background < 128, 255, 0).astype(np.uint8)


def _check(params: ShapesParams) -> None:
    if params.images < 1:
        raise UsageError(f"shapes: images must be at least 1, got {params.images}")
    if params.seed < 0:
        raise UsageError(f"shapes: seed must be 0 or more, got {params.seed}")
    if params.size < 16:
        raise UsageError(f"shapes: size must be at least 16 pixels, got {params.size}")
    if params.max_objects < 1:
        raise UsageError(f"shapes: max_objects must be at least 1, got {params.max_objects}")
    if not 0.0 <= params.val_fraction < 1.0:
        raise UsageError(f"shapes: val_fraction must be in [0, 1), got {params.val_fraction}")
    if params.background not in ("mixed", "plain", "noisy"):
        raise UsageError(
            f"shapes: background must be mixed, plain or noisy, got {params.background!r}"
        )


def _check_target(out: Path, marker: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; name a folder for the shapes set")
    if out.is_dir() and any(out.iterdir()) and not marker.is_file():
        raise UsageError(
            f"{out}: folder is not empty and holds no shapes set ({MARKER} missing); "
            "name an empty or new folder"
        )


def _marker_params(marker: Path) -> dict[str, Any] | None:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


def _split_indices(images: int, val_fraction: float) -> dict[str, range]:
    """Train then val; a positive fraction keeps at least one image on each side."""
    val = round(images * val_fraction)
    if val_fraction > 0 and images >= 2:
        val = min(max(val, 1), images - 1)
    return {"train": range(0, images - val), "val": range(images - val, images)}


def _empty_coco(params: ShapesParams, split: str) -> dict[str, Any]:
    return {
        "info": {"description": f"posenc procedural shapes, {split} split", **asdict(params)},
        "licenses": [],
        "images": [],
        "annotations": [],
        "categories": [
            {"id": i + 1, "name": name, "supercategory": "shape"}
            for i, name in enumerate(CATEGORIES)
        ],
    }


def _summary(out: Path, jsons: dict[str, Path], reused: bool) -> ShapesSet:
    counts = {}
    annotations = 0
    for split, path in jsons.items():
        coco = json.loads(path.read_text())
        counts[split] = len(coco["images"])
        annotations += len(coco["annotations"])
    return ShapesSet(out, counts["train"], counts["val"], annotations, reused)
