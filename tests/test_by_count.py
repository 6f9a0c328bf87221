"""`posenc evaluate --by-count`: exact match at each count of ones on parity, recounted here
from the problems the same evaluation lists as missed, and from hand-made predictions."""

from __future__ import annotations

import json

import pytest
import torch

from posenc_cli.data import build_task
from posenc_cli.data.batch import Batch
from posenc_cli.tasks.text.by_count import CountTally, count_rows
from tests.helpers import run
from tests.test_data import Cfg, gen
from tests.test_misses import BATCH_SIZE, trained


def test_each_problem_is_counted_under_its_own_count_of_ones():
    task = build_task(Cfg(task="parity", train_lengths=[1, 4]))
    batch = task.batch(3, 4, gen(), "test")
    bits = [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    tokens = batch.tokens.clone()
    tokens[:, 1:5] = torch.tensor(bits) + task.symbol_offset
    targets = batch.targets.clone()
    targets[:, 5] = torch.tensor([0, 1, 1]) + task.symbol_offset  # each row's true parity
    predicted = targets.clamp(min=0).clone()
    predicted[1, 5] = task.symbol_offset  # the row with three ones answered "even"
    tally = CountTally(task)
    tally.add(4, Batch(tokens, targets, None), torch.nn.functional.one_hot(predicted, 6).float())
    assert tally.accuracy() == {"4": [None, 1.0, 1.0, 0.0, None]}


def test_the_table_leaves_counts_past_a_length_blank():
    columns, rows = count_rows({"2": [1.0, 0.5, None], "3": [0.0, 0.25, 0.5, 0.75]})
    assert columns == ["ones", "n=2", "n=3"]
    assert rows == [
        ["0", "1.000", "0.000"],
        ["1", "0.500", "0.250"],
        ["2", "", "0.500"],
        ["3", "", "0.750"],
    ]


def test_counts_agree_with_the_listed_misses_and_leave_the_fair_scores_alone(capsys, tmp_path):
    """Every count from 0 to n is drawn about as often as each other (256 problems over six
    counts at n=5); a count's accuracy is one minus its listed misses over its problems; the
    result goes to eval_by_count.json and eval.json is untouched; a copy task is refused."""
    run_dir = trained(capsys, tmp_path, "parity")
    code, _, err = run(capsys, "evaluate", str(run_dir), "--lengths", "5")
    assert code == 0, err
    fair = (run_dir / "eval.json").read_text()
    misses = tmp_path / "m.jsonl"
    code, out, err = run(capsys, "evaluate", str(run_dir), "eval.batches=32", "--lengths", "5",
                         "--by-count", "--misses", str(misses), "--format", "json")  # fmt: skip
    assert code == 0, err
    scores = json.loads(out)["lengths"]["5"]
    accuracy, drawn = scores["by_count"], scores["by_count_problems"]
    assert sum(drawn) == 32 * BATCH_SIZE and min(drawn) > 20  # 256 / 6 = 43 expected
    wrong = [0] * 6
    for record in (json.loads(line) for line in misses.read_text().splitlines()):
        wrong[sum(record["input"])] += 1
    assert accuracy == pytest.approx([1 - w / d for w, d in zip(wrong, drawn, strict=True)])
    assert (run_dir / "eval.json").read_text() == fair
    saved = json.loads((run_dir / "eval_by_count.json").read_text())
    assert saved["ones"] == "uniform" and saved["lengths"]["5"]["by_count"] == accuracy
    code, out, err = run(capsys, "evaluate", str(run_dir), "eval.batches=32", "--lengths", "5",
                         "--by-count")  # fmt: skip
    assert code == 0 and f"{min(drawn)}-{max(drawn)} problems per count" in out, err
    copy_dir = trained(capsys, tmp_path, "copy")
    code, _, err = run(capsys, "evaluate", str(copy_dir), "--by-count")
    assert code == 2 and "parity" in err and "Traceback" not in err
    code, _, err = run(capsys, "evaluate", str(run_dir), "--by-count", "--by-position")
    assert code == 2 and "give one of them" in err
