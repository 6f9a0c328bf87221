"""Training end to end on a tiny recipe: determinism, resume, Ctrl-C, NaN, unsafe checkpoints,
evaluate and compare through the real command line, and a 2-process DDP run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from posenc_cli.config import load_recipe
from posenc_cli.metrics import Tally
from posenc_cli.runs.directory import TrainingStopped
from posenc_cli.tasks.text.train import train
from tests.helpers import ddp_train, run, torchrun_available

TINY = [
    "sweep=null",
    "encoding.name=rope",
    "model.dim=32",
    "model.depth=1",
    "train.steps=12",
    "train.batch_size=8",
    "train.eval_every=4",
    "train.checkpoint_every=4",
    "train.eval_batches=2",
    "train.warmup=2",
    "eval.lengths=[4,8]",
    "eval.batches=2",
]


def tiny(*extra: str):
    return load_recipe("quickstart", [*TINY, *extra])


def final(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["final"]


def val_only(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.startswith("val_")}


def test_same_seed_same_numbers(tmp_path):
    a = train(tiny(), tmp_path / "a")
    b = train(tiny(), tmp_path / "b")
    assert val_only(a["final"]) == val_only(b["final"])
    c = train(tiny("seed=1"), tmp_path / "c")
    assert val_only(c["final"]) != val_only(a["final"])


def test_resume_after_ctrl_c_ends_where_the_uninterrupted_run_ends(tmp_path):
    whole = train(tiny(), tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train(tiny(), tmp_path / "cut", interrupt_at=6)
    saved = torch.load(tmp_path / "cut" / "last.pt", weights_only=True)
    assert saved["step"] == 6
    resumed = train(tiny(), tmp_path / "cut", resume=True)
    assert val_only(resumed["final"]) == val_only(whole["final"])
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").open()]
    assert steps == [4, 8, 12]  # nothing logged twice, nothing missing


def test_a_curriculum_run_draws_growing_sizes_and_resumes_exactly(tmp_path, monkeypatch):
    """``data.curriculum``: each step's batch is asked for sizes up to the ramp's value, and a
    run cut at step 6 and resumed ends where the uninterrupted run ends."""
    from posenc_cli.data.algorithmic import AlgorithmicTask

    asked = []
    batch = AlgorithmicTask.batch

    def spy(self, *args, largest=None, **kwargs):
        if args[-1] == "train":
            asked.append(largest)
        return batch(self, *args, largest=largest, **kwargs)

    monkeypatch.setattr(AlgorithmicTask, "batch", spy)
    recipe = tiny("data.curriculum=8")
    lo, hi = recipe.data.train_lengths
    whole = train(recipe, tmp_path / "whole")
    assert asked == [lo + -(-(hi - lo) * (s + 1) // 8) if s < 7 else hi for s in range(12)]
    assert asked[0] < hi
    with pytest.raises(KeyboardInterrupt):
        train(recipe, tmp_path / "cut", interrupt_at=6)
    resumed = train(recipe, tmp_path / "cut", resume=True)
    assert val_only(resumed["final"]) == val_only(whole["final"])
    plain = train(tiny(), tmp_path / "plain")
    assert val_only(plain["final"]) != val_only(whole["final"])


def test_resume_under_another_thread_count_says_it_will_not_repeat_the_run(tmp_path, capsys):
    """The checkpoint records the thread count; resuming under another one (it orders the float
    sums) warns in one line how to repeat the run, and under the same count says nothing."""
    threads = torch.get_num_threads()
    for name in ("other", "same"):
        with pytest.raises(KeyboardInterrupt):
            train(tiny(), tmp_path / name, interrupt_at=6)
    assert torch.load(tmp_path / "other" / "last.pt", weights_only=True)["threads"] == threads
    capsys.readouterr()
    torch.set_num_threads(threads + 1)
    try:
        train(tiny(), tmp_path / "other", resume=True)
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert f"saved under {threads} CPU thread(s) and resumes under {threads + 1}" in err
    assert f"OMP_NUM_THREADS={threads}" in err
    train(tiny(), tmp_path / "same", resume=True)
    assert "CPU thread(s)" not in capsys.readouterr().err


def test_resume_after_a_kill_continues_from_the_periodic_checkpoint(tmp_path, monkeypatch):
    """A killed process saves nothing on the way out: last.pt is the step-4 checkpoint and
    metrics.jsonl may hold lines written after it. Resuming still ends where the whole run does."""
    import posenc_cli.tasks.text.train as train_module

    whole = train(tiny(), tmp_path / "whole")
    real_save = train_module.save_checkpoint

    def dies_after_step_4(path, state):
        if state["step"] <= 4:
            real_save(path, state)

    monkeypatch.setattr(train_module, "save_checkpoint", dies_after_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(), tmp_path / "killed", interrupt_at=10)
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    assert torch.load(tmp_path / "killed" / "last.pt", weights_only=True)["step"] == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").open()]
    assert steps == [4, 8]  # step 8 was logged after the checkpoint the resume starts from
    resumed = train(tiny(), tmp_path / "killed", resume=True)
    assert val_only(resumed["final"]) == val_only(whole["final"])
    steps = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").open()]
    assert steps == [4, 8, 12]


def test_stop_at_ends_the_run_once_it_has_fitted(tmp_path, monkeypatch):
    """The first evaluation at or above train.stop_at ends training there: the checkpoint, the
    metrics and the summary all say step 8 of 12; without the setting it runs all 12."""
    import posenc_cli.tasks.text.train as train_module

    real = train_module.evaluate_length
    calls = []

    def scored(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return {**out, "exact_match": 0.2 if len(calls) == 1 else 0.995}

    monkeypatch.setattr(train_module, "evaluate_length", scored)
    summary = train(tiny("train.stop_at=0.99"), tmp_path / "fit")
    assert summary["steps_trained"] == 8 and summary["steps"] == 12
    rows = (tmp_path / "fit" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [4, 8]
    assert torch.load(tmp_path / "fit" / "last.pt", weights_only=True)["step"] == 8
    calls.clear()
    assert train(tiny(), tmp_path / "all")["steps_trained"] == 12


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real_add = Tally.add
    calls = {"n": 0}

    def poisoned(self, logits, targets):
        loss = real_add(self, logits, targets)
        calls["n"] += 1
        return loss * float("nan") if calls["n"] == 7 else loss

    monkeypatch.setattr(Tally, "add", poisoned)
    with pytest.raises(TrainingStopped, match=r"loss became nan at step 5.*\(step 4\) is kept"):
        train(tiny(), tmp_path / "run")  # 4 train batches + 2 eval batches, then step 5
    kept = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert kept["step"] == 4
    assert all(torch.isfinite(t).all() for t in kept["model"].values())


class Payload:
    """Unpickling this object would create a file: a stand-in for arbitrary code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_malicious_checkpoint_is_refused_without_running_it(tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(), out)
    marker = tmp_path / "pwned"
    with open(out / "best.pt", "wb") as f:
        pickle.dump({"model": Payload(str(marker))}, f)
    capsys.readouterr()
    code, _, err = run(capsys, "evaluate", str(out))
    assert code == 2 and "refused to load" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_train_evaluate_compare_through_the_cli(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    code, _, _ = run(
        capsys,
        "train",
        "quickstart",
        *TINY[1:],
        "sweep.encoding.name=[none,rope]",
        "sweep.seed=[0,1]",
        "--out",
        str(sweep),
    )
    assert code == 0
    assert json.loads((sweep / "sweep.json").read_text())["runs"] == [
        "encoding.name=none,seed=0",
        "encoding.name=none,seed=1",
        "encoding.name=rope,seed=0",
        "encoding.name=rope,seed=1",
    ]
    for name in ("recipe.yaml", "metrics.jsonl", "summary.json", "last.pt", "best.pt", "eval.json"):
        assert (sweep / "encoding.name=rope,seed=1" / name).is_file()
    summary = json.loads((sweep / "encoding.name=rope,seed=1" / "summary.json").read_text())
    assert summary["threads"] == torch.get_num_threads()  # in one process, the whole pool

    code, out, _ = run(
        capsys,
        "evaluate",
        str(sweep / "encoding.name=none,seed=0"),
        "--lengths",
        "4,16",
        "--shift",
        "5",
        "--format",
        "json",
    )
    result = json.loads(out)
    assert code == 0 and result["shift"] == 5 and set(result["lengths"]) == {"4", "16"}
    assert (sweep / "encoding.name=none,seed=0" / "eval_shift5.json").is_file()

    png = tmp_path / "cmp.png"
    code, out, _ = run(capsys, "compare", str(sweep), "--format", "json", "--out", str(png))
    table = json.loads(out)
    assert code == 0 and png.is_file() and set(table["groups"]) == {"none", "rope"}
    group = table["groups"]["rope"]["lengths"]["8"]["token_accuracy"]
    seeds = [
        json.loads((sweep / f"encoding.name=rope,seed={s}" / "eval.json").read_text())
        for s in (0, 1)
    ]
    values = [r["lengths"]["8"]["token_accuracy"] for r in seeds]
    assert group["n"] == 2 and group["mean"] == pytest.approx(sum(values) / 2)
    code, out, _ = run(capsys, "compare", str(sweep), "--format", "md")
    assert code == 0 and out.startswith("| encoding | seeds |") and "**" in out


def test_learned_past_its_table_is_reported_not_a_crash(tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny("encoding.name=learned", "encoding.length=24"), out)
    code, text, _ = run(capsys, "evaluate", str(out), "--lengths", "4,30", "--format", "json")
    lengths = json.loads(text)["lengths"]
    assert code == 0 and "token_accuracy" in lengths["4"]
    assert "past the table's length 24" in lengths["30"]["error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "quickstart", "train.stepz=3"], "train.stepz"),
        (["train", "quickstart", "train.lr=fast"], "train.lr"),
        (["train", "no/such-recipe"], "no/such-recipe"),
        (["evaluate", "/nonexistent/run"], "not a run directory"),
        (["compare", "/nonexistent/sweep"], "no such run or sweep directory"),
        (["compare", ".", "--metric", "speed"], "--metric 'speed'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, _, err = run(capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_existing_run_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(), out)
    before = (out / "last.pt").read_bytes()
    capsys.readouterr()
    code, _, err = run(capsys, "train", "quickstart", *TINY, "--out", str(out))
    assert code == 2 and "--resume" in err
    assert (out / "last.pt").read_bytes() == before


def test_dry_run_prints_the_resolved_recipe_and_trains_nothing(tmp_path, capsys):
    code, out, _ = run(
        capsys, "train", "quickstart", "train.lr=3e-4", "--dry-run", "--out", str(tmp_path / "x")
    )
    assert code == 0 and "lr: 0.0003" in out and "# 5 run(s)" in out
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(not torchrun_available(), reason="torchrun not installed")
def test_two_process_ddp_run_on_cpu(tmp_path):
    out = tmp_path / "ddp"
    summary = ddp_train(["quickstart", *TINY, "train.steps=4"], out)
    assert summary["world_size"] == 2 and summary["final"]["step"] == 4
    assert not list(out.glob(".*.tmp"))


def test_a_run_that_diverges_is_recorded_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    """A NaN in one encoding is a result: its folder says so, the other runs still train,
    compare counts it per encoding, and --resume keeps it instead of diverging again."""
    import posenc_cli.tasks.text.train as train_module

    real = train_module.train

    def alibi_diverges(recipe, out, **kwargs):
        if recipe.encoding.name == "alibi":
            out.mkdir(parents=True, exist_ok=True)
            raise TrainingStopped("loss became nan at step 3; lower train.lr")
        return real(recipe, out, **kwargs)

    monkeypatch.setattr(train_module, "train", alibi_diverges)
    args = [a for a in TINY if a != "sweep=null" and not a.startswith("encoding.name")]
    out = tmp_path / "sweep"
    sweep = ["sweep=null", "sweep.encoding.name=[none,alibi]", *args]
    code, _, err = run(capsys, "train", "quickstart", *sweep, "--out", str(out))
    assert code == 0, err
    assert "1 of 2 runs diverged" in err and "the sweep goes on" in err
    record = json.loads((out / "encoding.name=alibi" / "diverged.json").read_text())
    assert record["encoding"] == "alibi" and record["seed"] == 0 and "nan" in record["reason"]
    assert (out / "encoding.name=none" / "eval.json").is_file()
    code, shown, _ = run(capsys, "compare", str(out), "--format", "json")
    groups = json.loads(shown)["groups"]
    assert code == 0 and groups["alibi"]["diverged"] == [0] and groups["alibi"]["seeds"] == []
    assert groups["none"]["diverged"] == []
    code, _, err = run(capsys, "train", "quickstart", *sweep, "--out", str(out), "--resume")
    assert code == 0 and "diverged earlier, kept as it is" in err
