"""Randomized positions (Ruoss et al. 2023): the draw, the recipe checks that refuse a no-op,
the model's plumbing (an explicit 0 .. T-1 is the default exactly), and a run end to end."""

from __future__ import annotations

import json

import pytest
import torch

from posenc_cli.config import load_recipe
from posenc_cli.errors import UsageError
from posenc_cli.models.positions import random_positions
from posenc_cli.models.text import build_text_model
from posenc_cli.tasks.text.train import train
from tests.helpers import run
from tests.test_train import TINY


def test_the_draw_is_a_sorted_distinct_subset_and_seeded():
    a = random_positions(20, 100, torch.Generator().manual_seed(3))
    b = random_positions(20, 100, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (20,) and a.dtype == torch.long
    assert (a.diff() > 0).all() and 0 <= int(a.min()) and int(a.max()) < 100
    seen = torch.cat(
        [random_positions(20, 100, torch.Generator().manual_seed(s)) for s in range(50)]
    )
    assert int(seen.max()) > 90  # far positions are drawn: what the test lengths will use
    with pytest.raises(UsageError, match="raise model.random_positions to at least 30"):
        random_positions(30, 20, torch.Generator())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["encoding.name=none", "model.random_positions=256"], "reads no positions"),
        (["model.random_positions=10"], "a no-op"),  # quickstart's longest copy is 23 tokens
        (["model.mem_len=8", "data.task=text", "model.random_positions=256"], "memory"),
    ],
)
def test_a_no_op_or_a_conflict_is_one_line(capsys, overrides, message):
    code, _, err = run(capsys, "train", "quickstart", "sweep=null", *overrides, "--dry-run")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_explicit_consecutive_positions_are_the_default_exactly():
    recipe = load_recipe("quickstart", [*TINY, "encoding.name=t5"])
    task = type("Task", (), {"kind": "lm", "vocab_size": 20, "num_classes": 0})()
    torch.manual_seed(0)
    model = build_text_model(recipe.model, recipe.encoding, task).double().eval()
    x = torch.randint(0, 20, (2, 9))
    torch.testing.assert_close(model(x).logits, model(x, positions=torch.arange(9)).logits)
    gaps = torch.tensor([0, 3, 4, 10, 11, 12, 20, 31, 40])
    assert not torch.allclose(model(x).logits, model(x, positions=gaps).logits)


def test_a_run_trains_and_evaluates_with_the_same_draw_rule(tmp_path):
    extra = ["model.random_positions=64", "eval.lengths=[4,8,40]"]
    a = train(load_recipe("quickstart", [*TINY, *extra]), tmp_path / "a")
    b = train(load_recipe("quickstart", [*TINY, *extra]), tmp_path / "b")
    plain = train(load_recipe("quickstart", [*TINY, "eval.lengths=[4,8,40]"]), tmp_path / "c")
    val = lambda s: {k: v for k, v in s["final"].items() if k.startswith("val_")}  # noqa: E731
    assert val(a) == val(b)  # the draws come from the step's generator: repeatable
    assert val(a) != val(plain)
    from posenc_cli.tasks.text.evaluate import evaluate_run

    result = evaluate_run(tmp_path / "a", write=False)
    assert "error" not in result["lengths"]["8"]
    # 40 symbols make an 83-token copy sequence: more than 64 distinct positions
    assert "model.random_positions" in result["lengths"]["40"]["error"]
    json.dumps(result)
