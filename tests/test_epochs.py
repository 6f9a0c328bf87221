"""The optimiser step and the epoch log line that the image and detection loops share."""

from __future__ import annotations

import json

import pytest
import torch

from posenc_cli.runs.directory import TrainingStopped
from posenc_cli.runs.epochs import log_epoch, optimize


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_finite_loss_steps_with_the_gradient_clipped():
    model, optimizer = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.full((4, 3), 100.0)).square().sum()
    value = optimize(loss, model, optimizer, grad_clip=0.5, stopped="")
    assert value == pytest.approx(float(loss.detach()))
    grad_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert float(grad_norm) == pytest.approx(0.5, rel=1e-5)  # clipped from far above
    pairs = zip(model.parameters(), before, strict=True)
    moved = torch.cat([(p.detach() - b).flatten() for p, b in pairs])
    assert float(moved.norm()) == pytest.approx(0.1 * 0.5, rel=1e-5)  # lr x clipped norm


def test_a_loss_that_is_not_finite_stops_before_touching_the_weights():
    model, optimizer = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 3)).sum() * float("nan")
    with pytest.raises(TrainingStopped, match=r"^loss became nan at step 3; lower train.lr$"):
        optimize(loss, model, optimizer, grad_clip=0.0, stopped="at step 3; lower train.lr")
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), b) and p.grad is None


def test_log_epoch_appends_one_line_per_finished_epoch(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log_epoch(log, 0, 5, 0.01, [1.0, 3.0], 12.5, {"top1": 50.0})
    row = log_epoch(log, 1, 5, 0.005, [1.0], 10.0, {"top1": 75.0})
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[1] == row
    assert lines[0] == {
        "step": 5,
        "epoch": 1,
        "lr": 0.01,
        "train_loss": 2.0,
        "images_per_s": 12.5,
        "val_top1": 50.0,
    }


def test_epoch_batches_refuse_a_loader_that_disagrees_with_the_epoch_length():
    from posenc_cli.runs.epochs import epoch_batches

    good = epoch_batches(lambda epoch: [f"{epoch}.{i}" for i in range(2)], per_epoch=2)
    stream = good(2)  # resumed at step 2: epoch 1 first
    assert [next(stream) for _ in range(3)] == ["1.0", "1.1", "2.0"]
    short = epoch_batches(lambda epoch: ["only"], per_epoch=2)(0)
    assert next(short) == "only"
    with pytest.raises(RuntimeError, match="gave 1 batches; the loop counts 2"):
        next(short)
    empty = epoch_batches(lambda epoch: [], per_epoch=3)(0)
    with pytest.raises(RuntimeError, match="gave 0 batches"):  # not an endless loop
        next(empty)
