"""The faults a user can cause in `posenc train` and its recipes: each is one line and exit 2
(or the documented stop), and nothing already written is lost or changed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from posenc_cli.config import load_recipe
from posenc_cli.errors import UsageError
from tests.helpers import TINY_TEXT, run

TINY = ["sweep=null", *TINY_TEXT]


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    from posenc_cli.cli import main

    out = tmp_path_factory.mktemp("runs") / "rope"
    with pytest.raises(SystemExit) as done:
        main(["train", "quickstart", *TINY, "encoding.name=rope", "--out", str(out)])
    assert done.value.code == 0
    return out


# ----------------------------------------------------------------------------- recipe files


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", ["is empty"]),
        (b"# nothing but a comment\n\n", ["is empty"]),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", ["not a text file", "not UTF-8"]),
        (b"train: {steps: 1e400}\n", ["train.steps", "finite"]),
        (b"train: {lr: .nan}\n", ["train.lr", "finite"]),
        (b"train: {steps: 99999999999999999999999999}\n", ["train.steps", "too large"]),
        (b"train: {steps: 1000000000000}\n", ["train.steps", "at most 100,000,000"]),
        (b"data: {train_lengths: [5, 100000000000]}\n", ["data.train_lengths", "at most"]),
    ],
)
def test_bad_recipe_files_are_one_line(tmp_path, capsys, content, words):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "out"))
    one_line_error(code, err, *words)
    assert not (tmp_path / "out").exists()


def test_image_and_detection_sizes_have_upper_bounds_too():
    with pytest.raises(UsageError, match="train.epochs.*at most"):
        load_recipe("image/encodings", ["train.epochs=1e9"])
    with pytest.raises(UsageError, match="data.image_size.*at most"):
        load_recipe("detection/shapes", ["data.image_size=1e7"])


def test_sweep_null_clears_the_recipe_grid_before_later_overrides_add_to_it():
    recipe = load_recipe("text/extrapolation", ["sweep=null", "sweep.encoding.name=[rope,alibi]"])
    assert recipe.sweep == {"encoding.name": ["rope", "alibi"]}  # no seed axis left
    recipe = load_recipe("text/extrapolation", ["sweep.encoding.name=[rope,alibi]", "sweep=null"])
    assert recipe.sweep is None  # the later override wins


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "args, option",
    [
        (["train", "quickstart", "--jobs", "abc"], "--jobs"),
        (["evaluate", "somewhere", "--shift", "abc"], "--shift"),
        (["list", "--format", "xml"], "--format"),
        (["train"], "recipe"),
        (["trian", "quickstart"], "trian"),
    ],
)
def test_bad_option_values_are_one_line_not_a_box(capsys, args, option):
    code, _, err = run(capsys, *args)
    one_line_error(code, err, option, "--help")
    assert "╭" not in err


# ----------------------------------------------------------------------------- --out


def test_out_naming_a_file_or_below_one_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    for out in (blocker, blocker / "run"):
        code, _, err = run(capsys, "train", "quickstart", *TINY, "--out", str(out))
        one_line_error(code, err, "cannot write", str(blocker), "--out")
    assert blocker.read_text() == "keep me"


@pytest.mark.parametrize(
    "args, words",
    [
        (["quickstart", *TINY, "data.task=recall", "data.vocab=4", "data.train_lengths=[2,5]"],
         ["data.train_lengths", "data.vocab"]),
        (["quickstart", *TINY, "data.task=addition-hints", "data.train_lengths=[1,64]"],
         ["data.train_lengths", "64 hint symbols"]),
        (["image/encodings", "sweep=null", "data.dataset=folder", "data.root=/nonexistent"],
         ["data.root", "not a folder"]),
        (["quickstart", "data.task=recall", "data.vocab=4", "data.train_lengths=[2,5]"],
         ["data.train_lengths"]),  # a sweep: its folder and its first run's
    ],
)  # fmt: skip
def test_data_only_the_task_can_check_leaves_no_run_folder(tmp_path, capsys, args, words):
    """Settings the recipe schema passes but the task refuses fail before a file is written,
    and the folders made for the run are taken away again."""
    out = tmp_path / "new" / "run"
    code, _, err = run(capsys, "train", *args, "--out", str(out))
    one_line_error(code, err.strip().splitlines()[-1], *words)  # a sweep names its run first
    assert "Traceback" not in err
    assert not out.exists() and (tmp_path / "new").is_dir()  # only what this run made goes


def test_a_refused_run_keeps_a_folder_that_was_there(tmp_path, capsys):
    out = tmp_path / "kept"
    out.mkdir()
    code, _, err = run(capsys, "train", "quickstart", *TINY, "data.task=recall", "data.vocab=4",
                       "data.train_lengths=[2,5]", "--out", str(out))  # fmt: skip
    one_line_error(code, err, "data.vocab")
    assert out.is_dir() and not (out / "recipe.yaml").exists()


def test_out_in_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    def refuse(self, *args, **kwargs):  # root ignores chmod; make the denial explicit
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    code, _, err = run(capsys, "train", "quickstart", *TINY, "--out", str(tmp_path / "run"))
    one_line_error(code, err, "cannot write", "Permission denied", "--out")


# ----------------------------------------------------------------------------- resume


def test_resume_refuses_other_settings_and_names_them(rope_run, capsys):
    (rope_run / "summary.json").rename(rope_run / "summary.json.kept")
    try:
        before = snapshot(rope_run)
        code, _, err = run(
            capsys, "train", "quickstart", *TINY, "encoding.name=alibi", "train.lr=1e-2",
            "--out", str(rope_run), "--resume",
        )  # fmt: skip
        one_line_error(code, err, "--resume", "encoding.name (run: rope, now: alibi)", "train.lr")
        assert snapshot(rope_run) == before  # recipe.yaml still says rope
    finally:
        (rope_run / "summary.json.kept").rename(rope_run / "summary.json")


def test_resume_of_a_finished_run_says_what_it_ignored(rope_run, capsys):
    before = snapshot(rope_run)
    code, _, err = run(
        capsys, "train", "quickstart", *TINY, "encoding.name=alibi", "train.device=cpu",
        "--out", str(rope_run), "--resume",
    )  # fmt: skip
    assert code == 0, err
    assert "finished earlier" in err and "ignored for it: encoding.name (run: rope" in err
    assert "train.device" not in err  # where a run goes on is not a setting of the run
    assert snapshot(rope_run) == before


# ----------------------------------------------------------------------------- the lock


@contextmanager
def held_elsewhere(folder: Path) -> Iterator[int]:
    """``folder`` locked by another process while the block runs; yields that process's pid."""
    script = (
        "import sys; from pathlib import Path; from posenc_cli.runs.lock import hold\n"
        f"with hold(Path({str(folder)!r})):\n    print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.communicate("", timeout=30)


def test_a_second_writer_of_a_run_directory_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    with held_elsewhere(out) as pid:
        code, _, err = run(capsys, "train", "quickstart", *TINY, "--out", str(out))
        one_line_error(code, err, f"process {pid}", "being written", "--out")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing of this run
    # once the holder is gone the folder is free again
    code, _, err = run(capsys, "train", "quickstart", *TINY, "--out", str(out))
    assert code == 0, err


def test_evaluate_of_a_run_being_written_is_refused_and_changes_nothing(rope_run, capsys):
    with held_elsewhere(rope_run) as pid:
        before = snapshot(rope_run)
        code, _, err = run(capsys, "evaluate", str(rope_run), "--lengths", "4")
        one_line_error(code, err, f"process {pid}", "being written")
        assert snapshot(rope_run) == before


# ----------------------------------------------------------------------------- signals


def test_sigterm_saves_a_checkpoint_where_the_run_stopped(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, "train.steps=100000", "train.checkpoint_every=100000", "train.eval_every=50"]
    command = [sys.executable, "-m", "posenc_cli", "train", "quickstart", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [*command, "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file():  # past step 50: training is under way
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in err and "--resume" in err and "Traceback" not in err
    import torch

    state = torch.load(out / "last.pt", weights_only=True)
    assert state["step"] >= 50  # saved where it stopped, not only at checkpoint_every


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_stopped_parallel_sweep_starts_no_queued_run(tmp_path, how):
    """Three runs in two workers: SIGTERM to the sweep (a scheduler) or SIGINT to its process
    group (a terminal's Ctrl-C) while the first two train ends the sweep; the third run, already
    queued to a worker, is never started (it once was, and trained to the end)."""
    out = tmp_path / "sweep"
    args = [*TINY, "train.steps=100000", "train.checkpoint_every=100000", "train.eval_every=50"]
    command = [sys.executable, "-m", "posenc_cli", "train", "quickstart", *args,
               "sweep.seed=[0,1,2]", "--jobs", "2", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while len(list(out.glob("*/metrics.jsonl"))) < 2:  # both workers are training
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # never leave a sweep training behind
    assert proc.returncode == (143 if how == "sigterm" else 130), err
    started = sorted(p.parent.name for p in out.glob("*/metrics.jsonl"))
    assert started == ["seed=0", "seed=1"], started
    assert all((out / name / "last.pt").is_file() for name in started)  # both can resume
