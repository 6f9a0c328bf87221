"""Numbers that a change of layout must not move: for a fixed seed, a short quickstart sweep, a
tiny image run and a tiny detection run end with the summary.json and eval.json recorded in
tests/golden/ (throughput figures and thread count aside). ``POSENC_WRITE_GOLDEN=1`` records
them anew, for a change that is meant to move them; say why in its commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import test_detection_train, test_image_train
from tests.helpers import TINY_TEXT, run

GOLDEN = Path(__file__).parent / "golden"
TIMINGS = {"tokens_per_s", "images_per_s"}
QUICKSTART = TINY_TEXT  # the golden files were recorded with these


def recorded(folder: Path) -> dict:
    """Every run's summary and evaluation below ``folder``, by run name, timings and paths out."""
    found = {}
    for summary in sorted(folder.rglob("summary.json")):
        run_dir = summary.parent
        data = json.loads(summary.read_text())
        data["final"] = {k: v for k, v in data["final"].items() if k not in TIMINGS}
        data.pop("recipe", None)  # where the recipe file was, not what it did
        assert data.pop("threads") >= 1  # recorded, but the machine's, not the run's
        evaluation = json.loads((run_dir / "eval.json").read_text())
        evaluation.pop("run", None)
        found[run_dir.name] = {"summary": data, "eval": evaluation}
    return found


def check(name: str, folder: Path) -> None:
    got = recorded(folder)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("POSENC_WRITE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(path.read_text())
    assert got.keys() == expected.keys()
    for run_name in got:
        assert_close(got[run_name], expected[run_name], run_name)


def assert_close(got, expected, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7), where
    else:
        assert got == expected, where


def test_quickstart_sweep_numbers_are_unchanged(tmp_path, capsys):
    code, _, err = run(capsys, "train", "quickstart", *QUICKSTART, "--out", str(tmp_path / "q"))
    assert code == 0, err
    check("quickstart", tmp_path / "q")


def test_tiny_image_run_numbers_are_unchanged(tmp_path, capsys):
    path = test_image_train.write_recipe(tmp_path, **{"train.epochs": 1})
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "image"))
    assert code == 0, err
    check("image", tmp_path / "image")


def test_tiny_detection_run_numbers_are_unchanged(tmp_path, capsys):
    path = test_detection_train.write_recipe(tmp_path, **{"train.epochs": 1, "eval.pictures": 0})
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "detection"))
    assert code == 0, err
    check("detection", tmp_path / "detection")
