"""A picture of detections: a few validation images with true and predicted boxes.

True boxes are dashed green with the class name under the top-left corner; predictions at or
above ``score_threshold`` are solid red with "name score" above it. Images are the loader's
normalised (3, S, S) tensors (un-normalised here with coco.py's MEAN and STD); targets are the
loader's (normalised cxcywh); predictions are ``postprocess`` output, absolute xyxy pixels of the
original image, rescaled here to the S x S picture with each target's ``orig_size``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor
from torchvision.ops import box_convert

from posenc_cli.runs.checkpoint import atomic_write_bytes
from posenc_cli.tasks.detection.coco import MEAN, STD

TRUE_STYLE = {"edgecolor": "lime", "linestyle": "--", "linewidth": 1.4}
PRED_STYLE = {"edgecolor": "red", "linestyle": "-", "linewidth": 1.4}
# a dark outline keeps labels readable on any of the random background colours
OUTLINE = [patheffects.withStroke(linewidth=1.5, foreground="black")]


def draw_predictions(
    images: Tensor,
    predictions: Sequence[dict[str, Tensor]],
    targets: Sequence[dict[str, Any]],
    class_names: Sequence[str],
    path: Path,
    score_threshold: float = 0.5,
    max_images: int = 4,
) -> Path:
    """Write a PNG of the first ``max_images`` images to ``path`` (atomically); returns it."""
    count = min(len(images), max_images)
    fig = Figure(figsize=(3.0 * count, 3.3))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, count, squeeze=False)[0]
    for ax, image, pred, target in zip(axes, images[:count], predictions, targets, strict=False):
        side_h, side_w = image.shape[-2:]
        # extent puts pixel (r, c) on [c, c + 1) x [r, r + 1), the convention boxes use
        ax.imshow(_unnormalise(image), extent=(0, side_w, side_h, 0))
        ax.set_axis_off()
        size = torch.tensor([side_w, side_h, side_w, side_h], dtype=torch.float32)
        true_boxes = box_convert(target["boxes"].float().cpu(), "cxcywh", "xyxy") * size
        for box, label in zip(true_boxes.tolist(), target["labels"].tolist(), strict=True):
            _box(ax, box, TRUE_STYLE)
            _label(ax, box[0], box[3], class_names[label], "lime", va="top")
        orig_h, orig_w = (int(v) for v in target["orig_size"])
        scale = torch.tensor([side_w / orig_w, side_h / orig_h] * 2, dtype=torch.float32)
        keep = pred["scores"].cpu() >= score_threshold
        shown = 0
        for box, label, score in zip(
            (pred["boxes"].float().cpu()[keep] * scale).tolist(),
            pred["labels"].cpu()[keep].tolist(),
            pred["scores"].cpu()[keep].tolist(),
            strict=True,
        ):
            _box(ax, box, PRED_STYLE)
            _label(ax, box[0], box[1], f"{class_names[label]} {score:.2f}", "red", va="bottom")
            shown += 1
        ax.set_title(
            f"image {target['image_id']}: {len(true_boxes)} true, {shown} predicted",
            fontsize=7,
        )
    fig.suptitle(
        f"true boxes dashed green; predictions with score >= {score_threshold:g} solid red",
        fontsize=8,
    )
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _unnormalise(image: Tensor) -> Any:
    """(3, S, S) normalised -> (S, S, 3) numpy in [0, 1] for imshow."""
    mean = torch.tensor(MEAN)[:, None, None]
    std = torch.tensor(STD)[:, None, None]
    return (image.detach().float().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()


def _box(ax: Any, xyxy: list[float], style: dict[str, Any]) -> None:
    x0, y0, x1, y1 = xyxy
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, **style))


def _label(ax: Any, x: float, y: float, text: str, colour: str, va: str) -> None:
    ax.text(x, y, text, color=colour, fontsize=6, va=va, path_effects=OUTLINE)
