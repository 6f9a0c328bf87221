"""SetCriterion and postprocess on hand-made cases with hand-computed answers."""

import math

import pytest
import torch

from posenc_cli.tasks.detection.criterion import SetCriterion, postprocess
from posenc_cli.tasks.detection.matcher import HungarianMatcher

C = 3  # classes; index 3 is no-object


def make_criterion(**kwargs) -> SetCriterion:
    return SetCriterion(C, HungarianMatcher(), **kwargs)


def sure_logits(classes: list[int]) -> torch.Tensor:
    """(1, Q, C+1) logits that put almost all probability on the given class per query."""
    logits = torch.full((1, len(classes), C + 1), -20.0)
    logits[0, torch.arange(len(classes)), torch.tensor(classes)] = 20.0
    return logits


def test_a_perfect_prediction_has_zero_box_losses():
    boxes = torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])
    target = {"labels": torch.tensor([2, 0]), "boxes": boxes}
    # queries 1 and 3 hold the objects (in swapped order); 0 and 2 say no-object
    pred_boxes = torch.tensor([[0.5, 0.5, 0.1, 0.1], boxes[1], [0.2, 0.2, 0.1, 0.1], boxes[0]])
    outputs = {"pred_logits": sure_logits([C, 0, C, 2]), "pred_boxes": pred_boxes[None]}
    losses = make_criterion()(outputs, [target])
    assert losses["loss_bbox"].item() == 0.0
    assert losses["loss_giou"].item() == pytest.approx(0.0, abs=1e-5)
    assert losses["loss_ce"].item() < 1e-6


def test_no_object_is_down_weighted_by_eos_coef():
    logits = torch.tensor([[[1.0, 0.5, -0.5, 0.2], [0.3, 0.1, 0.4, 0.9], [-1.0, 2.0, 0.0, 0.5]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1], [0.9, 0.9, 0.1, 0.1]]])
    target = {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}
    log_p = torch.log_softmax(logits[0].double(), -1)
    # query 0 is matched (its box is exact) and must say class 1; queries 1, 2 no-object (3)
    ce = [-log_p[0, 1].item(), -log_p[1, 3].item(), -log_p[2, 3].item()]
    for eos in (0.1, 1.0):
        want = (ce[0] + eos * (ce[1] + ce[2])) / (1 + 2 * eos)
        got = make_criterion(eos_coef=eos)({"pred_logits": logits, "pred_boxes": boxes}, [target])
        assert got["loss_ce"].item() == pytest.approx(want, rel=1e-5)


def test_box_losses_are_normalised_by_the_number_of_targets():
    # one query per target, each off by a known amount; an extra image has no targets
    t1 = {"labels": torch.tensor([0, 1]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2]] * 2)}
    t1["boxes"][1] = torch.tensor([0.7, 0.7, 0.2, 0.2])
    t2 = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}
    pred = torch.stack(
        [
            torch.tensor([[0.32, 0.3, 0.2, 0.2], [0.7, 0.7, 0.25, 0.2]]),  # L1 0.02 and 0.05
            torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.2]]),
        ]
    )
    logits = torch.cat([sure_logits([0, 1]), sure_logits([C, C])])
    losses = make_criterion()({"pred_logits": logits, "pred_boxes": pred}, [t1, t2])
    assert losses["loss_bbox"].item() == pytest.approx((0.02 + 0.05) / 2, rel=1e-4)


def test_giou_loss_of_two_disjoint_boxes():
    # xyxy [0.4, 0.4, 0.6, 0.6] and [0.7, 0.4, 0.9, 0.6]: IoU 0, union 0.08, hull 0.1
    # GIoU = 0 - (0.1 - 0.08) / 0.1 = -0.2, so the loss is 1.2; L1 = 0.3
    outputs = {
        "pred_logits": sure_logits([0]),
        "pred_boxes": torch.tensor([[[0.5, 0.5, 0.2, 0.2]]]),
    }
    target = {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.8, 0.5, 0.2, 0.2]])}
    losses = make_criterion()(outputs, [target])
    assert losses["loss_giou"].item() == pytest.approx(1.2, rel=1e-4)
    assert losses["loss_bbox"].item() == pytest.approx(0.3, rel=1e-4)
    assert losses["loss"].item() == pytest.approx(
        1 * losses["loss_ce"].item() + 5 * 0.3 + 2 * 1.2, rel=1e-4
    )


def test_an_image_without_targets_only_pays_for_saying_something():
    logits = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]]])
    outputs = {"pred_logits": logits, "pred_boxes": torch.full((1, 2, 4), 0.5)}
    target = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}
    losses = make_criterion()(outputs, [target])
    log_p = torch.log_softmax(logits[0].double(), -1)
    assert losses["loss_ce"].item() == pytest.approx(-log_p[:, C].mean().item(), rel=1e-5)
    assert losses["loss_bbox"].item() == 0.0 and losses["loss_giou"].item() == 0.0


def test_aux_outputs_add_suffixed_terms_and_count_in_the_total():
    g = torch.Generator().manual_seed(0)

    def layer():
        boxes = torch.rand(2, 5, 4, generator=g) * 0.3 + 0.2
        return {"pred_logits": torch.randn(2, 5, C + 1, generator=g), "pred_boxes": boxes}

    main, aux0, aux1 = layer(), layer(), layer()
    targets = [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.1]] * 2)},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.6, 0.5, 0.3, 0.2]])},
    ]
    criterion = make_criterion(weight_ce=1.5, weight_bbox=4.0, weight_giou=3.0)
    losses = criterion({**main, "aux_outputs": [aux0, aux1]}, targets)
    names = {f"loss_{t}{s}" for t in ("ce", "bbox", "giou") for s in ("", "_0", "_1")}
    assert set(losses) == names | {"loss"}
    alone = criterion(aux1, targets)  # the last aux layer scored on its own
    for term in ("ce", "bbox", "giou"):
        assert losses[f"loss_{term}_1"].item() == pytest.approx(alone[f"loss_{term}"].item())
    weights = {"ce": 1.5, "bbox": 4.0, "giou": 3.0}
    terms = {name: v.item() for name, v in losses.items() if name != "loss"}
    total = sum(weights[name.split("_")[1]] * v for name, v in terms.items())
    assert losses["loss"].item() == pytest.approx(total, rel=1e-5)


def test_gradients_reach_logits_and_boxes():
    logits = torch.randn(1, 4, C + 1, requires_grad=True)
    raw = torch.randn(1, 4, 4, requires_grad=True)
    outputs = {"pred_logits": logits, "pred_boxes": raw.sigmoid()}
    target = {"labels": torch.tensor([1, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2]] * 2)}
    make_criterion()(outputs, [target])["loss"].backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert raw.grad is not None and raw.grad.abs().sum() > 0


def test_wrong_number_of_classes_is_refused():
    outputs = {"pred_logits": torch.zeros(1, 2, C), "pred_boxes": torch.full((1, 2, 4), 0.5)}
    with pytest.raises(ValueError, match="num_classes"):
        make_criterion()(outputs, [{"labels": torch.tensor([0]), "boxes": torch.rand(1, 4)}])


def test_postprocess_scores_labels_and_pixel_boxes():
    logits = torch.tensor([[[0.0, 2.0, 0.0, 5.0], [1.0, 0.0, 0.0, 0.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.25, 0.75, 0.5, 0.5]]])
    (out,) = postprocess({"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[100, 200]]))
    assert out["labels"].tolist() == [1, 0]
    denominator = math.exp(2) + 2 + math.exp(5)
    assert out["scores"][0].item() == pytest.approx(math.exp(2) / denominator, rel=1e-5)
    assert out["scores"][1].item() == pytest.approx(math.e / (math.e + 3), rel=1e-5)
    # height 100, width 200: x scales by 200, y by 100
    torch.testing.assert_close(out["boxes"][0], torch.tensor([50.0, 25.0, 150.0, 75.0]))
    torch.testing.assert_close(out["boxes"][1], torch.tensor([0.0, 50.0, 100.0, 100.0]))
