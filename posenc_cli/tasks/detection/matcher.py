"""Hungarian matching of predicted boxes to ground truth (Carion et al. 2020, DETR, Sec. 3.1).

Each image's targets are assigned to distinct queries by minimising, over one-to-one matchings,
the sum of pair costs

    cost(q, t) = cost_class * -p_q(c_t) + cost_bbox * |b_q - b_t|_1 + cost_giou * -GIoU(b_q, b_t)

with p the softmax over the C + 1 logits (the last class is "no object"), the L1 term taken on
normalised (cx, cy, w, h) boxes and GIoU on the same boxes as (x0, y0, x1, y1). The defaults are
DETR's (1, 5, 2). As in DETR the class term is the negative probability rather than its log:
it has the same scale as the box terms and needs no clamping at p = 0.

With Q queries and M targets, min(Q, M) pairs come back; queries left over are "no object".
Matching solves per image (DETR concatenates the batch into one cost matrix and splits it; the
result is the same, and per image never builds the (B Q, sum M) cross-image block).
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor
from torchvision.ops import box_convert, generalized_box_iou

Match = tuple[Tensor, Tensor]  # (query indices, target indices), both (K,) int64


def pair_costs(
    logits: Tensor,
    boxes: Tensor,
    labels: Tensor,
    target_boxes: Tensor,
    cost_class: float = 1.0,
    cost_bbox: float = 5.0,
    cost_giou: float = 2.0,
) -> Tensor:
    """The (Q, M) matrix of matching costs for one image: logits (Q, C+1), boxes (Q, 4)
    cxcywh, labels (M,), target_boxes (M, 4) cxcywh."""
    prob = logits.float().softmax(-1)  # (Q, C+1)
    boxes = boxes.float()
    target_boxes = target_boxes.float()
    class_term = -prob[:, labels]  # (Q, M)
    bbox_term = torch.cdist(boxes, target_boxes, p=1)  # (Q, M)
    giou_term = -generalized_box_iou(
        box_convert(boxes, "cxcywh", "xyxy"), box_convert(target_boxes, "cxcywh", "xyxy")
    )  # (Q, M)
    return cost_class * class_term + cost_bbox * bbox_term + cost_giou * giou_term


class HungarianMatcher:
    """Callable: ``matcher(outputs, targets) -> [(query_idx, target_idx), ...]``, one per image.

    ``outputs`` holds ``pred_logits`` (B, Q, C+1) and ``pred_boxes`` (B, Q, 4); each target holds
    ``labels`` (M,) and ``boxes`` (M, 4). Index pairs are sorted by query index.
    """

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0):
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all matching costs are 0: every matching would tie")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    @torch.no_grad()
    def __call__(self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]) -> list[Match]:
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        matches: list[Match] = []
        for b, target in enumerate(targets):
            if len(target["labels"]) == 0:
                empty = torch.zeros(0, dtype=torch.int64)
                matches.append((empty, empty.clone()))
                continue
            cost = pair_costs(
                logits[b],
                boxes[b],
                target["labels"],
                target["boxes"],
                self.cost_class,
                self.cost_bbox,
                self.cost_giou,
            )
            rows, cols = linear_sum_assignment(cost.cpu().numpy())
            queries = torch.as_tensor(rows, dtype=torch.int64)  # (min(Q, M),), ascending
            matches.append((queries, torch.as_tensor(cols, dtype=torch.int64)))
        return matches

    def __repr__(self) -> str:
        return (
            f"HungarianMatcher(cost_class={self.cost_class}, cost_bbox={self.cost_bbox}, "
            f"cost_giou={self.cost_giou})"
        )
