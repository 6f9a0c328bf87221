"""HungarianMatcher against brute force over all one-to-one assignments, with the pair cost
re-derived here from its formula (softmax probability, L1, GIoU by hand)."""

import itertools
import math

import pytest
import torch

from posenc_cli.tasks.detection.matcher import HungarianMatcher, pair_costs


def random_boxes(n: int, generator: torch.Generator) -> torch.Tensor:
    """(n, 4) valid cxcywh boxes inside the unit square."""
    wh = 0.05 + 0.4 * torch.rand(n, 2, generator=generator)
    c = wh / 2 + (1 - wh) * torch.rand(n, 2, generator=generator)
    return torch.cat([c, wh], dim=1)


def giou_by_hand(a: list[float], b: list[float]) -> float:
    """GIoU of two cxcywh boxes from the definition (Rezatofighi et al. 2019)."""
    ax0, ay0, ax1, ay1 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx0, by0, bx1, by1 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = a[2] * a[3] + b[2] * b[3] - inter
    hull = (max(ax1, bx1) - min(ax0, bx0)) * (max(ay1, by1) - min(ay0, by0))
    return inter / union - (hull - union) / hull


def cost_by_hand(logits, boxes, labels, targets, weights=(1.0, 5.0, 2.0)) -> list[list[float]]:
    prob = torch.softmax(logits.double(), -1)
    rows = []
    for q in range(len(boxes)):
        row = []
        for t in range(len(targets)):
            p = boxes[q].tolist()
            g = targets[t].tolist()
            l1 = sum(abs(x - y) for x, y in zip(p, g, strict=True))
            cost = -weights[0] * prob[q, labels[t]].item() + weights[1] * l1
            row.append(cost - weights[2] * giou_by_hand(p, g))
        rows.append(row)
    return rows


def brute_force_min(cost: list[list[float]]) -> float:
    """Smallest total cost over all one-to-one matchings of min(Q, M) pairs."""
    q, m = len(cost), len(cost[0]) if cost else 0
    if q >= m:
        options = (
            sum(cost[r][c] for c, r in enumerate(rows))
            for rows in itertools.permutations(range(q), m)
        )
    else:
        options = (
            sum(cost[r][c] for r, c in enumerate(cols))
            for cols in itertools.permutations(range(m), q)
        )
    return min(options)


def test_pair_costs_match_the_formula():
    g = torch.Generator().manual_seed(0)
    logits, boxes = torch.randn(5, 4, generator=g), random_boxes(5, g)
    labels, targets = torch.tensor([2, 0, 2]), random_boxes(3, g)
    got = pair_costs(logits, boxes, labels, targets, 1.0, 5.0, 2.0)
    want = torch.tensor(cost_by_hand(logits, boxes, labels, targets), dtype=torch.float32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("queries,targets", [(4, 4), (6, 3), (5, 1), (3, 5), (7, 4)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matching_is_the_cheapest_one_to_one_assignment(queries, targets, seed):
    g = torch.Generator().manual_seed(seed * 100 + queries * 10 + targets)
    classes = 3
    logits = torch.randn(1, queries, classes + 1, generator=g)
    boxes = random_boxes(queries, g)[None]
    labels = torch.randint(0, classes, (targets,), generator=g)
    target_boxes = random_boxes(targets, g)
    ((rows, cols),) = HungarianMatcher()(
        {"pred_logits": logits, "pred_boxes": boxes}, [{"labels": labels, "boxes": target_boxes}]
    )
    assert rows.dtype == cols.dtype == torch.int64
    assert len(rows) == len(cols) == min(queries, targets)
    assert len(set(rows.tolist())) == len(rows) and len(set(cols.tolist())) == len(cols)
    assert rows.tolist() == sorted(rows.tolist())
    cost = cost_by_hand(logits[0], boxes[0], labels, target_boxes)
    total = sum(cost[r][c] for r, c in zip(rows.tolist(), cols.tolist(), strict=True))
    assert math.isclose(total, brute_force_min(cost), rel_tol=1e-5, abs_tol=1e-5)


def test_images_without_targets_and_a_mixed_batch():
    g = torch.Generator().manual_seed(3)
    outputs = {"pred_logits": torch.randn(3, 4, 3, generator=g), "pred_boxes": random_boxes(12, g)}
    outputs["pred_boxes"] = outputs["pred_boxes"].reshape(3, 4, 4)
    empty = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}
    two = {"labels": torch.tensor([0, 1]), "boxes": random_boxes(2, g)}
    matches = HungarianMatcher()(outputs, [empty, two, empty])
    assert [len(q) for q, _ in matches] == [0, 2, 0]
    assert all(q.dtype == t.dtype == torch.int64 for q, t in matches)
    # image 1 alone gives the same pairs as inside the batch: images are matched independently
    alone = HungarianMatcher()(
        {"pred_logits": outputs["pred_logits"][1:2], "pred_boxes": outputs["pred_boxes"][1:2]},
        [two],
    )
    assert all(torch.equal(a, b) for a, b in zip(alone[0], matches[1], strict=True))


def test_the_weights_decide_between_class_and_box():
    # query 0 has the right box and the wrong class; query 1 the right class and a far box
    logits = torch.tensor([[[0.0, 9.0, 0.0], [9.0, 0.0, 0.0]]])
    boxes = torch.tensor([[[0.3, 0.3, 0.2, 0.2], [0.8, 0.8, 0.2, 0.2]]])
    target = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2]])}]
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    by_class = HungarianMatcher(cost_class=1, cost_bbox=0, cost_giou=0)(outputs, target)
    by_box = HungarianMatcher(cost_class=0, cost_bbox=5, cost_giou=2)(outputs, target)
    assert by_class[0][0].tolist() == [1]
    assert by_box[0][0].tolist() == [0]
