"""`posenc evaluate --by-position`: accuracy at each answer position, recounted here from the
predictions a run's misses file lists, and from hand-made predictions."""

from __future__ import annotations

import json

import torch

from posenc_cli.data.batch import IGNORE, Batch
from posenc_cli.tasks.text.by_position import PositionTally, position_rows
from tests.helpers import TINY_TEXT, run
from tests.test_misses import BATCH_SIZE, BATCHES, trained


def predicting(predictions: torch.Tensor, vocab: int = 8) -> torch.Tensor:
    """Logits whose arg-max is ``predictions``."""
    return torch.nn.functional.one_hot(predictions, vocab).float()


def test_each_answer_column_is_counted_over_rows_and_batches():
    targets = torch.full((2, 6), IGNORE)
    targets[:, 2:5] = torch.tensor([[4, 5, 3], [6, 7, 3]])  # two answer symbols, then EOS
    batch = Batch(torch.zeros(2, 6, dtype=torch.long), targets, None)
    first = targets.clamp(min=0).clone()
    first[0, 2] = 5  # row 0 misses position 1
    second = targets.clamp(min=0).clone()
    second[:, 4] = 4  # both rows miss the end token
    tally = PositionTally()
    tally.add(7, batch, predicting(first))
    tally.add(7, batch, predicting(second))
    assert tally.accuracy() == {"7": [0.75, 1.0, 0.5]}


def test_the_table_aligns_answers_from_their_first_position():
    columns, rows = position_rows({"2": [1.0, 0.5, 1.0], "3": [0.0, 0.25, 0.5, 0.75]})
    assert columns == ["position", "n=2", "n=3"]
    assert rows == [
        ["1", "1.000", "0.000"],
        ["2", "0.500", "0.250"],
        ["3", "", "0.500"],
        ["end", "1.000", "0.750"],
    ]


def test_positions_agree_with_the_listed_misses_and_the_token_accuracy(capsys, tmp_path):
    """Six steps fit nothing, so positions differ. A position's accuracy is one minus the share
    of problems whose listed prediction is wrong there; their mean is the per-token accuracy
    (every position is scored once per problem); the table and PNG come out, and a later
    evaluation without the option keeps what this one saved."""
    run_dir = trained(capsys, tmp_path, "reverse")
    misses, png = tmp_path / "m.jsonl", tmp_path / "p.png"
    code, out, err = run(capsys, "evaluate", str(run_dir), "--lengths", "3,5", "--by-position",
                         "--misses", str(misses), "--out", str(png),
                         "--format", "json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    listed = [json.loads(line) for line in misses.read_text().splitlines()]
    problems = BATCHES * BATCH_SIZE
    for n in (3, 5):
        accuracy = result["lengths"][str(n)]["by_position"]
        assert len(accuracy) == n + 1  # n reversed symbols, then the end token
        wrong = [0] * (n + 1)
        for record in (r for r in listed if r["length"] == n):
            for k, (want, got) in enumerate(
                zip(record["target"], record["predicted"], strict=True)
            ):
                wrong[k] += want != got
        assert accuracy == [1 - w / problems for w in wrong]
        mean = sum(accuracy) / len(accuracy)
        assert abs(mean - result["lengths"][str(n)]["token_accuracy"]) < 1e-9
    assert len({a for n in ("3", "5") for a in result["lengths"][n]["by_position"]}) > 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = run(capsys, "evaluate", str(run_dir), "--lengths", "4")
    assert code == 0, err
    saved = json.loads((run_dir / "eval.json").read_text())["lengths"]
    assert "by_position" in saved["3"] and "by_position" not in saved["4"]
    code, out, err = run(capsys, "evaluate", str(run_dir), "--lengths", "3")
    assert code == 0, err  # scored again without the option: the length's entry is replaced
    assert "by_position" not in json.loads((run_dir / "eval.json").read_text())["lengths"]["3"]


def test_the_table_has_a_row_per_position_and_names_lengths_that_cannot_run(capsys, tmp_path):
    """A learned table of 24 positions cannot run 20 reversed symbols (43 tokens): that length
    is named under the table; when no length can run, that is the one-line error."""
    out = tmp_path / "learned"
    args = ["train", "quickstart", "sweep=null", "data.task=reverse", "encoding.name=learned",
            "encoding.length=24", "data.train_lengths=[2,5]", *TINY_TEXT, "eval.lengths=[3]",
            "--out", str(out)]  # fmt: skip
    code, _, err = run(capsys, *args)
    assert code == 0, err
    code, shown, err = run(capsys, "evaluate", str(out), "--lengths", "3,20", "--by-position")
    assert code == 0, err
    labels = [line.split()[1] for line in shown.splitlines() if line.startswith("│")]
    assert labels == ["1", "2", "3", "end"]  # three reversed symbols, then the end token
    assert "n=3" in shown and "cannot run at n=20" in shown
    code, _, err = run(capsys, "evaluate", str(out), "--lengths", "20", "--by-position")
    assert code == 2 and "--by-position: no length could run (n=20" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_language_model_run_has_no_answer_positions(capsys, tmp_path):
    run_dir = trained(capsys, tmp_path, "text")
    code, _, err = run(capsys, "evaluate", str(run_dir), "--by-position")
    assert code == 2 and "--by-position: a text run has no answer positions" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
