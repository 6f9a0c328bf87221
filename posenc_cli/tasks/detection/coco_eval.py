"""COCO box AP through pycocotools' COCOeval, the number DETR papers report.

``coco_evaluate`` takes ``postprocess`` output keyed by image id (boxes as absolute xyxy pixels
of the original image, labels contiguous) and returns COCOeval's first six stats:

    AP    mean over IoU 0.50:0.05:0.95, 100 detections per image   (stats[0])
    AP50  AP75                                                     (stats[1], stats[2])
    APs   APm   APl   area < 32^2, 32^2..96^2, > 96^2 pixels        (stats[3..5])

Conventions:
- Only the images that are keys of ``predictions`` are scored (as DETR does), so a partial
  pass over the validation set is scored on what it saw; an image seen with no detections is a
  key with empty tensors. An empty ``predictions`` scores every ground-truth image as having no
  detections (AP 0).
- COCOeval reports -1 where a metric is undefined (no ground truth of that size, e.g. APl on
  64-pixel images); that comes back as NaN, never as a made-up 0.
- pycocotools prints progress and the summary table; it is silenced here.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def coco_evaluate(
    coco_gt: COCO,
    predictions: dict[int, dict[str, Tensor]],
    label_to_category: Sequence[int],
) -> dict[str, float]:
    """Box AP of ``predictions`` against ``coco_gt``; keys METRICS, values in [0, 1] or NaN."""
    image_ids = sorted(predictions) if predictions else sorted(coco_gt.getImgIds())
    unknown = set(image_ids) - set(coco_gt.getImgIds())
    if unknown:
        raise ValueError(f"predictions for images not in the ground truth: {sorted(unknown)[:5]}")
    results = to_coco_results(predictions, label_to_category)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(results) if results else _no_detections(coco_gt)
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {
        name: math.nan if value < 0 else float(value)
        for name, value in zip(METRICS, evaluator.stats[:6], strict=True)
    }


def to_coco_results(
    predictions: dict[int, dict[str, Tensor]], label_to_category: Sequence[int]
) -> list[dict]:
    """COCO's result format: one dict per box, ``bbox`` as [x, y, w, h] pixels."""
    results = []
    for image_id, pred in predictions.items():
        boxes = pred["boxes"].detach().float().cpu().numpy().reshape(-1, 4)  # (K, 4) xyxy
        xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)  # (K, 4)
        scores = pred["scores"].detach().float().cpu().tolist()
        labels = pred["labels"].detach().cpu().tolist()
        for box, score, label in zip(xywh.tolist(), scores, labels, strict=True):
            results.append(
                {
                    "image_id": int(image_id),
                    "category_id": int(label_to_category[label]),
                    "bbox": box,
                    "score": score,
                }
            )
    return results


def _no_detections(coco_gt: COCO) -> COCO:
    """A result set with no boxes (``loadRes`` refuses an empty list)."""
    empty = COCO()
    empty.dataset = {
        "images": list(coco_gt.dataset["images"]),
        "categories": list(coco_gt.dataset["categories"]),
        "annotations": [],
    }
    empty.createIndex()
    return empty
