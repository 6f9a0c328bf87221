"""The task registry: a task added by one registry line (``tests/toy_task.py``) trains as a
sweep, evaluates and compares through the command line, and each built-in task names entry
points that exist."""

from __future__ import annotations

import json

import pytest

from posenc_cli import tasks
from posenc_cli.tasks import TASKS, Task, resolve
from tests import toy_task
from tests.helpers import run

TOY = Task(
    kind="toy",
    schema_module="tests.toy_task",
    workload="tests.toy_task:score",  # not profiled here
    profile_unit="tokens",
    train="tests.toy_task:train",
    evaluate="tests.toy_task:evaluate",
    score="tests.toy_task:score",
    evaluate_flags=(),
    evaluate_hint="the toy task takes no options",
    metrics=("score",),
    column=lambda key: f"p{key}",
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "toy", TOY)  # the one line a new task adds


def test_a_new_task_trains_evaluates_and_compares(toy, tmp_path, capsys):
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(
        "kind: toy\ntrain: {steps: 2}\neval: {points: [1, 3]}\nsweep: {seed: [0, 1, 2]}\n"
    )
    out = tmp_path / "runs"
    code, stdout, err = run(capsys, "train", str(recipe), "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "sweep.json").read_text())["runs"] == ["seed=0", "seed=1", "seed=2"]
    assert "p1" in stdout and "p3" in stdout  # the comparison after the sweep, in its columns

    code, stdout, err = run(capsys, "evaluate", str(out / "seed=1"), "--format", "json")
    assert code == 0, err
    assert json.loads(stdout)["lengths"]["3"]["score"] == pytest.approx(toy_task.figure(1, 3))
    code, _, err = run(capsys, "evaluate", str(out / "seed=1"), "--lengths", "4")
    assert code == 2 and "toy task takes no options" in err

    code, stdout, err = run(capsys, "compare", str(out), "--format", "json")
    assert code == 0, err
    cell = json.loads(stdout)["groups"]["none"]["lengths"]["3"]["score"]
    assert cell["mean"] == pytest.approx(sum(toy_task.figure(s, 3) for s in range(3)) / 3)
    code, _, err = run(capsys, "train", str(recipe), "train.steps=0", "--out", str(tmp_path / "x"))
    assert code == 2 and "train.steps" in err  # its own schema's rule


def test_the_built_in_tasks_name_entry_points_that_exist():
    for task in TASKS.values():
        for target in (task.train, task.evaluate, task.score, task.workload, task.prepare):
            if target is not None:
                assert callable(resolve(target)), target
        schema = task.schema
        assert {"model", "data", "train", "eval"} <= set(schema.SECTIONS)
        assert callable(schema.validate) and callable(schema.build_encoding_once)
        assert schema.DEFAULT_ENCODING and schema.ENCODING_DIMS
