"""DETR's set loss and post-processing (Carion et al. 2020, Sec. 3.1 and appendix A.2).

After Hungarian matching (matcher.py) each image's loss has three terms:

- ``loss_ce``: cross-entropy over C + 1 classes for every query; matched queries must predict
  their target's label, the rest the no-object class (index C). The no-object class is
  down-weighted by ``eos_coef`` (0.1) because most queries are unmatched. As in DETR and
  ``F.cross_entropy(weight=...)``, the mean divides by the sum of the weights, not by B Q.
- ``loss_bbox``: L1 between matched normalised (cx, cy, w, h) boxes.
- ``loss_giou``: 1 - GIoU of the matched boxes, as (x0, y0, x1, y1).

The box terms are sums over matched pairs divided by the number of target boxes in the batch
(at least 1; averaged over ranks under torch.distributed, as DETR does), so an image with many
objects counts for more than one with few. Every ``aux_outputs`` entry (the earlier decoder
layers) is matched on its own and adds the same three terms with the suffix ``_0``, ``_1``, ...
``loss`` is the weighted total over all of them, the one to call ``backward`` on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, generalized_box_iou_loss

from posenc_cli.tasks.detection.matcher import HungarianMatcher, Match


class SetCriterion:
    """Callable: ``criterion(outputs, targets) -> {"loss_ce": .., ..., "loss": total}``.

    ``outputs``: ``pred_logits`` (B, Q, C+1), ``pred_boxes`` (B, Q, 4) in [0, 1] cxcywh and
    optionally ``aux_outputs`` (a list of dicts with the same two keys). ``targets``: one dict per
    image with ``labels`` (M,) int64 in [0, C) and ``boxes`` (M, 4) normalised cxcywh.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        eos_coef: float = 0.1,
        weight_ce: float = 1.0,
        weight_bbox: float = 5.0,
        weight_giou: float = 2.0,
        across_ranks: bool = True,
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.matcher = matcher
        self.eos_coef = eos_coef
        # average the box count over ranks (training); False where one rank scores alone
        self.across_ranks = across_ranks
        self.weights = {"loss_ce": weight_ce, "loss_bbox": weight_bbox, "loss_giou": weight_giou}

    def class_weight(self, device: torch.device) -> Tensor:
        """Per-class cross-entropy weights: 1 for real classes, ``eos_coef`` for no-object."""
        weight = torch.ones(self.num_classes + 1, device=device)  # (C+1,)
        weight[-1] = self.eos_coef
        return weight

    def __call__(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        logits = outputs["pred_logits"]
        if logits.shape[-1] != self.num_classes + 1:
            raise ValueError(
                f"pred_logits has {logits.shape[-1]} classes; expected num_classes + 1 = "
                f"{self.num_classes + 1} (the last one is no-object)"
            )
        num_boxes = self.num_boxes(targets, logits.device)
        layers = [("", outputs)]
        layers += [(f"_{i}", aux) for i, aux in enumerate(outputs.get("aux_outputs") or [])]
        losses: dict[str, Tensor] = {}
        total = logits.new_zeros((), dtype=torch.float32)
        for suffix, layer in layers:
            for name, value in self.set_losses(layer, targets, num_boxes).items():
                losses[name + suffix] = value
                total = total + self.weights[name] * value
        losses["loss"] = total
        return losses

    def num_boxes(self, targets: list[dict[str, Tensor]], device: torch.device) -> Tensor:
        """Target boxes in the batch, averaged over ranks, at least 1 (a float scalar)."""
        count = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=device)
        if self.across_ranks and dist.is_available() and dist.is_initialized():
            dist.all_reduce(count)
            count = count / dist.get_world_size()
        return count.clamp(min=1.0)

    def set_losses(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]], num_boxes: Tensor
    ) -> dict[str, Tensor]:
        """The three unweighted terms for one decoder layer's predictions."""
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        matches = self.matcher(outputs, targets)
        batch_idx, query_idx = _flat_index(matches)

        target_classes = torch.full(
            logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device
        )  # (B, Q): no-object everywhere, then the matched labels
        pairs = list(zip(targets, matches, strict=True))
        matched_labels = torch.cat([t["labels"][j] for t, (_, j) in pairs])
        target_classes[batch_idx, query_idx] = matched_labels.to(logits.device)
        loss_ce = F.cross_entropy(
            logits.transpose(1, 2).float(), target_classes, self.class_weight(logits.device)
        )

        pred = boxes[batch_idx, query_idx].float()  # (K, 4)
        true = torch.cat([t["boxes"][j] for t, (_, j) in pairs]).to(pred)  # (K, 4)
        loss_bbox = F.l1_loss(pred, true, reduction="sum") / num_boxes
        loss_giou = (
            generalized_box_iou_loss(
                box_convert(pred, "cxcywh", "xyxy"),
                box_convert(true, "cxcywh", "xyxy"),
                reduction="sum",
            )
            / num_boxes
        )
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}


def _flat_index(matches: list[Match]) -> tuple[Tensor, Tensor]:
    """(image index, query index) of every matched pair, each (K,), for advanced indexing."""
    batch = torch.cat([torch.full_like(q, b) for b, (q, _) in enumerate(matches)])
    query = torch.cat([q for q, _ in matches])
    return batch, query


@torch.no_grad()
def postprocess(
    outputs: dict[str, Tensor], orig_sizes: Tensor | Sequence[Sequence[int]]
) -> list[dict[str, Tensor]]:
    """DETR's PostProcess: per image ``scores`` (Q,), ``labels`` (Q,) and ``boxes`` (Q, 4) as
    absolute (x0, y0, x1, y1) pixels of the original image.

    Softmax over all C + 1 classes, then the best real class per query; its probability is the
    score (so a query sure of "no object" gets a low score, not a dropped row). ``orig_sizes`` is
    (B, 2) as (height, width), the ``orig_size`` of each target.
    """
    prob = outputs["pred_logits"].float().softmax(-1)  # (B, Q, C+1)
    scores, labels = prob[..., :-1].max(-1)  # (B, Q)
    boxes = box_convert(outputs["pred_boxes"].float(), "cxcywh", "xyxy")  # (B, Q, 4)
    sizes = torch.stack([torch.as_tensor(s) for s in orig_sizes]).to(boxes)  # (B, 2)
    height, width = sizes.unbind(1)
    scale = torch.stack([width, height, width, height], dim=1)  # (B, 4)
    boxes = boxes * scale[:, None, :]
    rows = zip(scores, labels, boxes, strict=True)
    return [{"scores": s, "labels": lab, "boxes": b} for s, lab, b in rows]
