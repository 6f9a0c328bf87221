"""TensorBoard curves beside metrics.jsonl: the same numbers at the same steps, one curve per
figure after a resume (the events past the checkpoint purged), none when switched off."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc_cli.config import load_recipe
from posenc_cli.runs.curves import tag
from posenc_cli.tasks.text.train import train
from tests import test_image_train
from tests.helpers import TINY_TEXT, run

TEXT = ["sweep=null", *TINY_TEXT, "train.steps=9"]


def curves(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {
        name: [(e.step, e.value) for e in events.Scalars(name)] for name in events.Tags()["scalars"]
    }


def logged(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_curves_are_the_log(run_dir) -> None:
    found, rows = curves(run_dir), logged(run_dir)
    assert {"train/loss", "val/loss", "lr"} <= set(found)
    for key in ("train_loss", "val_loss", "lr"):
        expected = [(row["step"], row[key]) for row in rows]
        assert [s for s, _ in found[tag(key)]] == [s for s, _ in expected]
        assert [v for _, v in found[tag(key)]] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_text_curves_equal_the_log_and_a_resume_leaves_one_curve(tmp_path):
    recipe = load_recipe("quickstart", TEXT)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(recipe, out, interrupt_at=7)  # logged at 3 and 6; the checkpoint holds step 7
    kept = (out / "last.pt").read_bytes()
    train(recipe, out, resume=True)  # logs step 9
    # as after a kill past step 9's log but before a later checkpoint: back to step 7, again
    (out / "last.pt").write_bytes(kept)
    (out / "summary.json").unlink()
    train(recipe, out, resume=True)
    assert [row["step"] for row in logged(out)] == [3, 6, 9]
    assert_curves_are_the_log(out)  # step 9 once: the first one was purged


def test_image_curves_and_the_switch(tmp_path, capsys):
    path = test_image_train.write_recipe(tmp_path, **{"train.epochs": 2})
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "on"))
    assert code == 0, err
    assert_curves_are_the_log(tmp_path / "on")
    code, _, err = run(
        capsys, "train", str(path), "train.tensorboard=false", "--out", str(tmp_path / "off")
    )
    assert code == 0, err
    assert not (tmp_path / "off" / "tensorboard").exists()
