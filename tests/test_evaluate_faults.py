"""`posenc evaluate` and `posenc compare` on broken or unusual input: damaged eval.json and
checkpoints, folders that cannot be written, options that do not apply. Each fault is one line
on stderr with exit status 2, and nothing a run already recorded is lost."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from posenc_cli.config import load_recipe
from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import CorruptCheckpoint, load_checkpoint, load_run_weights
from posenc_cli.tasks.text.evaluate import evaluate_run, save_evaluation
from posenc_cli.tasks.text.train import train
from tests.helpers import TINY_TEXT, run

TINY = ["sweep=null", "encoding.name=rope", *TINY_TEXT, "train.eval_batches=1", "eval.batches=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny text run, trained and evaluated as `posenc train` leaves it."""
    out = tmp_path_factory.mktemp("trained") / "run"
    train(load_recipe("quickstart", TINY), out)
    evaluate_run(out)
    return out


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    """A copy of the trained run that a test may damage."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def kind_only_run(tmp_path: Path, kind: str) -> Path:
    """A run directory holding only a recipe of ``kind``: enough for checks made before loading."""
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "recipe.yaml").write_text(f"kind: {kind}\n")
    return folder


def assert_one_line(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err


class Payload:
    """Unpickling this would create a file: a stand-in for a checkpoint that carries code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# 1. a damaged eval.json


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "not valid JSON"),  # the real file cut in half
        ("", "not valid JSON"),
        ("[1, 2, 3]", "not an evaluation"),
        ('{"encoding": "rope", "seed": 0, "lengths": [4, 8]}', "not an evaluation"),
        ('{"encoding": "rope", "seed": 0, "lengths": {"4": {"loss": "low"}}}', "not an evaluation"),
    ],
)
def test_compare_names_a_damaged_eval_json_and_the_fix(run_dir, capsys, content, words):
    path = run_dir / "eval.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if content is None else content)
    code, _, err = run(capsys, "compare", str(run_dir))
    assert_one_line(code, err, str(path), "damaged", words, f"posenc evaluate {run_dir}")


# 2. damaged checkpoints


def test_a_damaged_checkpoint_is_told_apart_from_one_that_carries_code(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.ones(64, 64)}}, good)
    data = good.read_bytes()
    for name, content in [("cut.pt", data[: len(data) // 2]), ("junk.pt", b"not a model" * 9)]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CorruptCheckpoint, match="corrupt or truncated.*train the run again"):
            load_checkpoint(tmp_path / name)
    marker = tmp_path / "pwned"
    planted = tmp_path / "planted.pt"
    torch.save({"model": Payload(marker)}, planted)
    with pytest.raises(UsageError, match="refused to load") as refused:
        load_checkpoint(planted)
    assert not isinstance(refused.value, CorruptCheckpoint) and not marker.exists()
    (tmp_path / "planted_cut.pt").write_bytes(planted.read_bytes()[:300])
    with pytest.raises(CorruptCheckpoint):  # cut short, it is damage, not a refusal
        load_checkpoint(tmp_path / "planted_cut.pt")


def test_evaluate_reads_last_pt_when_best_pt_is_damaged(run_dir, capsys):
    best = run_dir / "best.pt"
    best.write_bytes(best.read_bytes()[:200])
    code, out, err = run(capsys, "evaluate", str(run_dir), "--format", "json")
    assert code == 0, err
    assert len(err.strip().splitlines()) == 1
    assert "best.pt is corrupt or truncated" in err and str(run_dir / "last.pt") in err
    shutil.copy(run_dir / "last.pt", best)  # the same numbers as evaluating last.pt itself
    code, reference, _ = run(capsys, "evaluate", str(run_dir), "--format", "json")
    assert json.loads(out)["lengths"] == json.loads(reference)["lengths"]


def test_evaluate_fails_clearly_when_both_checkpoints_are_damaged(run_dir, capsys):
    before = (run_dir / "eval.json").read_bytes()
    (run_dir / "best.pt").write_bytes(b"")
    (run_dir / "last.pt").write_bytes(b"\x00garbage" * 50)
    code, _, err = run(capsys, "evaluate", str(run_dir))
    assert_one_line(code, err, str(run_dir), "both corrupt or truncated", "train the run again")
    assert (run_dir / "eval.json").read_bytes() == before


def test_a_planted_best_pt_is_refused_not_passed_over(run_dir, capsys, tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": Payload(marker)}, run_dir / "best.pt")
    code, _, err = run(capsys, "evaluate", str(run_dir))
    assert_one_line(code, err, "best.pt", "refused to load")
    assert not marker.exists()


def test_load_run_weights_falls_back_for_every_kind_and_prefers_ema(tmp_path):
    """The helper image and detection runs load through: EMA weights when asked and saved."""
    source, ema = nn.Linear(3, 2), nn.Linear(3, 2)
    torch.save({"model": source.state_dict(), "ema": ema.state_dict()}, tmp_path / "last.pt")
    (tmp_path / "best.pt").write_bytes(b"PK\x03\x04 cut short")
    target = nn.Linear(3, 2)
    assert load_run_weights(tmp_path, target, ema=True) == tmp_path / "last.pt"
    assert torch.equal(target.weight, ema.weight)
    assert load_run_weights(tmp_path, target) == tmp_path / "last.pt"
    assert torch.equal(target.weight, source.weight)
    with pytest.raises(UsageError, match="do not fit"):
        load_run_weights(tmp_path, nn.Linear(4, 2))


def test_overrides_that_change_the_model_are_one_line(run_dir, capsys):
    code, _, err = run(capsys, "evaluate", str(run_dir), "model.dim=64")
    assert_one_line(code, err, "best.pt", "do not fit", "model.*")


# 3. results are written last, and only where they can be


def test_a_failed_png_write_leaves_eval_json_as_it_was(run_dir, capsys, monkeypatch, tmp_path):
    import posenc_cli.plots

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(posenc_cli.plots, "save_length_curves", denied)
    before = (run_dir / "eval.json").read_bytes()
    png = tmp_path / "curve.png"
    code, _, err = run(capsys, "evaluate", str(run_dir), "--lengths", "5", "--out", str(png))
    assert_one_line(code, err, str(png), "could not be written", "Permission denied")
    assert (run_dir / "eval.json").read_bytes() == before and not png.exists()


def test_a_failed_eval_json_write_keeps_the_old_file(run_dir, capsys, monkeypatch):
    import posenc_cli.tasks.text.evaluate

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(posenc_cli.runs.evaluation, "atomic_write_json", disk_full)
    before = (run_dir / "eval.json").read_bytes()
    code, _, err = run(capsys, "evaluate", str(run_dir), "--lengths", "5")
    assert_one_line(code, err, "eval.json", "No space left", "unchanged")
    assert (run_dir / "eval.json").read_bytes() == before


@pytest.fixture
def never_evaluated(monkeypatch):
    """Fail the test if an evaluation starts: the checks must come before it."""
    import posenc_cli.tasks.text.evaluate

    def evaluated(*args, **kwargs):
        raise AssertionError("the evaluation ran before the output checks")

    monkeypatch.setattr(posenc_cli.tasks.text.evaluate, "evaluate_run", evaluated)


def test_out_below_a_regular_file_fails_before_evaluating(run_dir, capsys, never_evaluated):
    before = (run_dir / "eval.json").read_bytes()
    png = run_dir / "summary.json" / "curve.png"  # NotADirectoryError, even for root
    code, _, err = run(capsys, "evaluate", str(run_dir), "--lengths", "5", "--out", str(png))
    assert_one_line(code, err, f"--out {png}", "is a file, not a folder")
    assert (run_dir / "eval.json").read_bytes() == before


@pytest.mark.parametrize("denied", ["run", "plots"])
def test_a_folder_that_cannot_be_written_fails_before_evaluating(
    run_dir, capsys, monkeypatch, never_evaluated, tmp_path, denied
):
    real_access = os.access
    refused = tmp_path / denied  # tests run as root, whom chmod does not stop: pretend

    def access(path, mode, **kwargs):  # reading stays allowed; writing there is not
        writes = Path(path) == refused and mode & os.W_OK
        return not writes and real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    (tmp_path / "plots").mkdir()
    before = (run_dir / "eval.json").read_bytes()
    png = tmp_path / "plots" / "curve.png"
    code, _, err = run(capsys, "evaluate", str(run_dir), "--out", str(png))
    assert_one_line(code, err, "no permission to write in", str(refused))
    assert (run_dir / "eval.json").read_bytes() == before


def test_compare_out_below_a_regular_file_is_one_line(run_dir, capsys):
    png = run_dir / "eval.json" / "cmp.png"
    code, _, err = run(capsys, "compare", str(run_dir), "--out", str(png))
    assert_one_line(code, err, f"--out {png}", "is a file, not a folder")


# 4. evaluating again never shrinks what a run recorded


def test_new_lengths_are_merged_into_the_recorded_ones(run_dir, capsys):
    before = json.loads((run_dir / "eval.json").read_text())["lengths"]
    code, out, err = run(capsys, "evaluate", str(run_dir), "--lengths", "10,4", "--format", "json")
    assert code == 0, err
    assert set(json.loads(out)["lengths"]) == {"4", "10"}  # what was asked for now
    saved = json.loads((run_dir / "eval.json").read_text())["lengths"]
    assert list(saved) == ["4", "8", "10"] and saved["8"] == before["8"]
    code, out, _ = run(capsys, "compare", str(run_dir), "--format", "json")
    assert json.loads(out)["lengths"] == ["4", "8", "10"]


def test_shifted_evaluations_merge_into_their_own_file(run_dir, capsys):
    before = (run_dir / "eval.json").read_bytes()
    for length in ("8", "4"):
        assert run(capsys, "evaluate", str(run_dir), "--shift", "3", "--lengths", length)[0] == 0
    shifted = json.loads((run_dir / "eval_shift3.json").read_text())
    assert shifted["shift"] == 3 and list(shifted["lengths"]) == ["4", "8"]
    assert (run_dir / "eval.json").read_bytes() == before


def test_save_evaluation_keeps_image_points_in_order_and_replaces_a_damaged_file(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"lengths": {"24": {"top1": 1.0}, "16+4": {"top1": 2.0}}}))
    merged = save_evaluation(path, {"kind": "image", "lengths": {"16": {"top1": 3.0}}})
    assert list(merged["lengths"]) == ["16", "16+4", "24"]
    assert json.loads(path.read_text()) == merged
    detection = tmp_path / "detection.json"
    save_evaluation(detection, {"kind": "detection", "lengths": {"val": {"AP": 5.0}}})
    again = save_evaluation(detection, {"kind": "detection", "lengths": {"val": {"AP": 6.0}}})
    assert again["lengths"] == {"val": {"AP": 6.0}}  # one key: the new score replaces it
    path.write_text('{"lengths": {"val": ')  # damaged: replaced whole
    written = save_evaluation(path, {"kind": "detection", "lengths": {"val": {"AP": 7.0}}})
    assert written["lengths"] == {"val": {"AP": 7.0}}
    assert json.loads(path.read_text()) == written


# 5. options that do not apply to the run's kind


@pytest.mark.parametrize("args", [["--lengths", "5,10"], ["--shift", "3"], ["--by-position"]])
def test_text_options_on_an_image_run_are_an_error(tmp_path, capsys, args):
    code, _, err = run(capsys, "evaluate", str(kind_only_run(tmp_path, "image")), *args)
    assert_one_line(code, err, f"{args[0]}:", "for text runs", "--sizes", "--shifts")


@pytest.mark.parametrize(
    "args",
    [
        ["--lengths", "5"],
        ["--shift", "2"],
        ["--sizes", "32"],
        ["--shifts", "0"],
        ["--out", "a.png"],
        ["--by-position"],
    ],
)
def test_options_on_a_detection_run_are_an_error(tmp_path, capsys, args):
    code, _, err = run(capsys, "evaluate", str(kind_only_run(tmp_path, "detection")), *args)
    assert_one_line(code, err, f"{args[0]}:", "detection run takes none", "predictions.png")


# 6. a run's recipe.yaml names the run


def test_the_recipe_path_stands_for_its_run_directory(run_dir, capsys):
    code, _, err = run(capsys, "evaluate", str(run_dir / "recipe.yaml"), "--lengths", "5")
    assert code == 0, err
    assert "5" in json.loads((run_dir / "eval.json").read_text())["lengths"]
    code, _, err = run(capsys, "evaluate", str(run_dir / "last.pt"))
    assert_one_line(code, err, "not a run directory", f"give its folder, {run_dir}")


# 7. other faults a user can cause


def test_a_run_without_a_checkpoint_is_one_line(run_dir, capsys):
    for checkpoint in run_dir.glob("*.pt"):
        checkpoint.unlink()
    code, _, err = run(capsys, "evaluate", str(run_dir))
    assert_one_line(code, err, str(run_dir), "no checkpoint", "--resume")


def test_a_broken_recipe_yaml_is_one_line(run_dir, capsys):
    (run_dir / "recipe.yaml").write_text("model: [\n")
    code, _, err = run(capsys, "evaluate", str(run_dir))
    assert_one_line(code, err, "recipe.yaml", "YAML syntax error")


def test_compare_of_a_file_is_one_line(run_dir, capsys):
    code, _, err = run(capsys, "compare", str(run_dir / "eval.json"))
    assert_one_line(code, err, "a file, not a run or sweep directory", str(run_dir))


@pytest.mark.parametrize(
    ("kind", "args", "words"),
    [
        ("image", ["--shifts", "0,a"], "--shifts '0,a'"),
        ("image", ["--shifts", "-4"], "at least 0"),
        ("text", ["--shift", "-1"], "--shift -1"),
    ],
)
def test_bad_numbers_are_one_line(run_dir, tmp_path, capsys, kind, args, words):
    target = run_dir if kind == "text" else kind_only_run(tmp_path, kind)
    code, _, err = run(capsys, "evaluate", str(target), *args)
    assert_one_line(code, err, words)
