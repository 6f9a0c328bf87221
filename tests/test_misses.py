"""`posenc evaluate --misses`: every test problem a run gets wrong, in the task's symbols, and
only those. The answers are recomputed here in plain Python, not read from the task."""

from __future__ import annotations

import json

import pytest

from posenc_cli.errors import UsageError
from posenc_cli.tasks.text.misses import check_listable
from tests.helpers import TINY_TEXT, run

BATCHES, BATCH_SIZE = 2, 8  # TINY_TEXT's eval.batches and train.batch_size


def trained(capsys, tmp_path, task: str, *extra: str):
    out = tmp_path / task
    args = ["train", "quickstart", "sweep=null", f"data.task={task}", *TINY_TEXT, *extra,
            "--out", str(out)]  # fmt: skip
    code, _, err = run(capsys, *args)
    assert code == 0, err
    return out


def misses_of(capsys, run_dir, path, length: int) -> tuple[list[dict], dict]:
    code, out, err = run(capsys, "evaluate", str(run_dir), "--lengths", str(length),
                         "--misses", str(path), "--format", "json")  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return records, json.loads(out)["lengths"][str(length)]


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        ("parity", lambda bits: [sum(bits) % 2]),
        ("copy", lambda symbols: list(symbols)),
        ("reverse", lambda symbols: list(reversed(symbols))),
        ("sort", lambda symbols: sorted(symbols)),
    ],
)
def test_every_missed_problem_is_listed_with_its_true_answer(capsys, tmp_path, task, answer):
    """Six steps fit nothing, so most problems are missed: as many lines as exact match says,
    each with the answer the task defines (and its end) and a prediction that differs from it."""
    run_dir = trained(capsys, tmp_path, task)
    records, scores = misses_of(capsys, run_dir, tmp_path / "m.jsonl", 6)
    problems = BATCHES * BATCH_SIZE
    assert len(records) == round((1 - scores["exact_match"]) * problems) > 0
    assert len({(r["batch"], r["row"]) for r in records}) == len(records)
    for r in records:
        assert r["length"] == 6 and len(r["input"]) == 6
        assert all(isinstance(s, int) for s in r["input"])
        assert r["target"] == [*answer(r["input"]), "EOS"]
        assert len(r["predicted"]) == len(r["target"]) and r["predicted"] != r["target"]


def test_addition_hints_misses_name_the_hints_and_score_the_digits(capsys, tmp_path):
    """The input keeps its hints (``h<k>``, consecutive, the same for both operands); target
    and prediction hold the digits of the sum and its end, not the hints, which are given."""
    run_dir = trained(capsys, tmp_path, "addition-hints", "data.vocab=10")
    records, _ = misses_of(capsys, run_dir, tmp_path / "m.jsonl", 3)
    assert records
    for r in records:
        plus = r["input"].index("+")
        a, b = r["input"][:plus], r["input"][plus + 1 :]
        assert a[0::2] == b[0::2] and all(h.startswith("h") for h in a[0::2])
        first = int(a[0][1:])
        assert a[0::2] == [f"h{first + k}" for k in range(3)]
        value = sum(d * 10**i for i, d in enumerate(a[1::2])) + sum(
            d * 10**i for i, d in enumerate(b[1::2])
        )
        assert r["target"] == [*(value // 10**i % 10 for i in range(4)), "EOS"]
        assert len(r["predicted"]) == 5 and r["predicted"] != r["target"]


def test_a_run_that_answers_everything_lists_nothing(capsys, tmp_path, monkeypatch):
    """A model that always predicts the target misses nothing: the file is written, empty."""
    import posenc_cli.tasks.text.misses as misses

    run_dir = trained(capsys, tmp_path, "copy")
    real = misses.missed

    def perfect(task, length, batch, tokens, targets, logits):
        import torch

        right = torch.nn.functional.one_hot(targets.clamp(min=0), logits.shape[-1]).float()
        return real(task, length, batch, tokens, targets, right)

    monkeypatch.setattr("posenc_cli.tasks.text.evaluate.missed", perfect)
    records, _ = misses_of(capsys, run_dir, tmp_path / "none.jsonl", 4)
    assert records == [] and (tmp_path / "none.jsonl").is_file()


def test_bad_misses_paths_and_tasks_are_one_line_errors(capsys, tmp_path):
    run_dir = trained(capsys, tmp_path, "copy")
    code, _, err = run(capsys, "evaluate", str(run_dir), "--misses", str(tmp_path))
    assert code == 2 and "--misses" in err and "a folder" in err and "Traceback" not in err
    (tmp_path / "file").write_text("kept")
    code, _, err = run(capsys, "evaluate", str(run_dir), "--misses", str(tmp_path / "file" / "m"))
    assert code == 2 and "--misses" in err and "is a file" in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "kept"
    code, _, err = run(capsys, "evaluate", str(run_dir), "--misses", str(tmp_path / "new" / "m"))
    assert code == 0 and (tmp_path / "new" / "m").is_file()  # folders made on the way
    with pytest.raises(UsageError, match="--misses: .* algorithmic task"):
        check_listable(object(), "--misses", "has no problems to list")  # a language model
