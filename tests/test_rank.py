"""`posenc rank`: scores past the trained range, ranks within a study and over studies, and
Friedman's test, recomputed here by hand and with scipy on runs the test writes."""

from __future__ import annotations

import json
import statistics

import pytest
from scipy import stats

from tests.helpers import run

# task -> encoding -> per seed, (accuracy at the trained length 8, at 12, at 16)
TASKS = {
    "copy": {
        "alibi": [(1.0, 0.9, 0.7), (1.0, 0.8, 0.6), (0.98, 0.9, 0.8)],
        "none": [(1.0, 0.6, 0.2), (1.0, 0.5, 0.3), (1.0, 0.7, 0.1)],
        "rope": [(1.0, 0.2, 0.1), (0.9, 0.3, 0.1), (1.0, 0.1, 0.1)],
    },
    "reverse": {
        "alibi": [(1.0, 0.5, 0.3), (1.0, 0.6, 0.2), (1.0, 0.4, 0.4)],
        "none": [(1.0, 0.7, 0.5), (1.0, 0.8, 0.4), (1.0, 0.6, 0.6)],
        "rope": [(1.0, 0.1, 0.0), (1.0, 0.2, 0.0), (1.0, 0.0, 0.0)],
    },
    "sort": {  # alibi and none tie here
        "alibi": [(1.0, 0.5, 0.5), (1.0, 0.5, 0.5), (1.0, 0.5, 0.5)],
        "none": [(1.0, 0.5, 0.5), (1.0, 0.5, 0.5), (1.0, 0.5, 0.5)],
        "rope": [(1.0, 0.3, 0.2), (1.0, 0.2, 0.2), (1.0, 0.4, 0.3)],
    },
}


def write_task(root, encodings):
    for name, seeds in encodings.items():
        for seed, values in enumerate(seeds):
            run_dir = root / f"encoding.name={name},seed={seed}"
            run_dir.mkdir(parents=True)
            lengths = {
                str(n): {"loss": 1 - v, "perplexity": 1.5, "token_accuracy": v, "exact_match": v}
                for n, v in zip((8, 12, 16), values, strict=True)
            }
            result = {"encoding": name, "encoding_params": {}, "seed": seed, "task": root.name,
                      "train_lengths": [1, 8], "lengths": lengths}  # fmt: skip
            (run_dir / "eval.json").write_text(json.dumps(result))
    return root


@pytest.fixture
def tasks(tmp_path):
    return [write_task(tmp_path / task, encodings) for task, encodings in TASKS.items()]


def by_hand(task, encoding):
    """The score: per seed the mean past the trained length, then the mean over seeds."""
    return statistics.fmean(statistics.fmean(v[1:]) for v in TASKS[task][encoding])


def test_scores_ranks_and_friedman_by_hand(tasks, capsys):
    code, out, err = run(capsys, "rank", *map(str, tasks), "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["schema"] == "posenc.rank/1" and result["metric"] == "token_accuracy"
    rows = result["encodings"]
    for task in TASKS:
        for encoding in TASKS[task]:
            score = rows[encoding]["studies"][task]
            assert score["mean"] == pytest.approx(by_hand(task, encoding))
            assert score["lengths"] == [12, 16] and score["n"] == 3
            assert score["in_range"] == pytest.approx(
                statistics.fmean(v[0] for v in TASKS[task][encoding])
            )
    ranks = {e: [rows[e]["studies"][t]["rank"] for t in TASKS] for e in rows}
    assert ranks == {"alibi": [1, 2, 1.5], "none": [2, 1, 1.5], "rope": [3, 3, 3]}  # sort ties
    assert rows["alibi"]["mean_rank"] == pytest.approx(1.5)
    assert result["order"] == ["alibi", "none", "rope"]  # the tie at 1.5 goes by name
    means = [[by_hand(t, e) for t in TASKS] for e in ("alibi", "none", "rope")]
    reference = stats.friedmanchisquare(*means)
    assert result["friedman"]["statistic"] == pytest.approx(reference.statistic)
    assert result["friedman"]["p"] == pytest.approx(reference.pvalue)


def test_lower_is_better_flips_the_ranks(tasks, capsys):
    code, out, _ = run(capsys, "rank", *map(str, tasks), "--metric", "loss", "--format", "json")
    assert code == 0
    result = json.loads(out)
    assert result["lower_is_better"] and result["order"] == ["alibi", "none", "rope"]
    assert result["encodings"]["rope"]["studies"]["copy"]["rank"] == 3


def test_markdown_marks_unfitted_seeds_and_names_what_was_left_out(tmp_path, tasks, capsys):
    write_task(tmp_path / "copy", {"fire": TASKS["copy"]["alibi"]})  # in one study only
    code, out, err = run(capsys, "rank", *map(str, tasks), "--fitted-at", "0.99", "--format", "md")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "| encoding | copy | reverse | sort | mean rank |"
    alibi = next(line for line in lines if line.startswith("| alibi"))
    assert "0.783 #1 (2/3 fit)" in alibi  # seed 2 reached 0.98 at length 8
    rope = next(line for line in lines if line.startswith("| rope"))
    assert "(2/3 fit)" in rope.split("|")[2] and "fit" not in rope.split("|")[3]
    assert "fire is left out: not in reverse, sort." in out
    assert "Friedman's test over 3 studies" in out


def test_the_table_and_the_png(tmp_path, tasks, capsys):
    png = tmp_path / "ranks.png"
    code, out, err = run(capsys, "rank", *map(str, tasks[:2]), "--out", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean rank" in out and "Friedman's test needs three studies" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["copy"], "two or more studies"),
        (["copy", "reverse", "--metric", "top1"], "--metric 'top1': "),
        (["copy", "reverse", "--metric", "nope"], "--metric 'nope': choose one of"),
        (["copy", "reverse", "--fitted-at", "nan"], "finite threshold"),
        (["copy", "reverse", "--out", "ranks.txt"], ".png"),
    ],
)
def test_bad_input_is_one_line(tasks, capsys, args, words):
    root = tasks[0].parent
    paths = [str(root / a) if a in TASKS else a for a in args]
    code, out, err = run(capsys, "rank", *paths)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and "Traceback" not in err


def test_a_study_not_evaluated_past_its_range_is_refused(tmp_path, tasks, capsys):
    short = tmp_path / "short"
    write_task(short, {"none": [(1.0, 0.5, 0.5)]})
    for path in short.glob("*/eval.json"):
        result = json.loads(path.read_text())
        result["train_lengths"] = [1, 16]
        path.write_text(json.dumps(result))
    code, _, err = run(capsys, "rank", str(tasks[0]), str(short))
    assert code == 2 and "no encoding was evaluated past its trained range" in err


def test_friedman_is_left_out_with_two_shared_encodings_and_when_all_tie(tmp_path, capsys):
    two = [write_task(tmp_path / "two" / t, {e: TASKS[t][e] for e in ("alibi", "rope")})
           for t in TASKS]  # fmt: skip
    code, out, err = run(capsys, "rank", *map(str, two), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["friedman"] is None
    zero = {e: [(1.0, 0.0, 0.0)] * 3 for e in ("alibi", "none", "rope")}
    tied = [write_task(tmp_path / "tied" / t, zero) for t in TASKS]
    code, out, err = run(capsys, "rank", *map(str, tied), "--format", "json")
    assert code == 0, err
    result = json.loads(out)  # strict JSON: no NaN
    assert result["friedman"] == {"statistic": None, "p": None}
    assert {r["studies"]["copy"]["rank"] for r in result["encodings"].values()} == {2.0}
    code, out, _ = run(capsys, "rank", *map(str, tied), "--format", "md")
    assert "every study ties every encoding" in out


def test_a_length_only_one_seed_has_is_not_scored(tasks, capsys):
    """One run evaluated again at 20 (`posenc evaluate` on one seed): the group keeps its
    score over the lengths all its seeds have."""
    path = tasks[0] / "encoding.name=alibi,seed=0" / "eval.json"
    result = json.loads(path.read_text())
    result["lengths"]["20"] = dict(result["lengths"]["16"], token_accuracy=0.0)
    path.write_text(json.dumps(result))
    code, out, err = run(capsys, "rank", *map(str, tasks), "--format", "json")
    assert code == 0, err
    score = json.loads(out)["encodings"]["alibi"]["studies"]["copy"]
    assert score["lengths"] == [12, 16] and score["mean"] == pytest.approx(by_hand("copy", "alibi"))


def test_encodings_are_matched_by_label_with_their_parameters(tmp_path, tasks, capsys):
    for task in tasks:
        write_task(task, {"fire": TASKS["copy"]["alibi"]})
    for path in (tasks[0] / "encoding.name=rope,seed=0").parent.glob("encoding.name=rope,*"):
        result = json.loads((path / "eval.json").read_text())
        result["encoding_params"] = {"base": 500}
        (path / "eval.json").write_text(json.dumps(result))
    short = tasks[2] / "encoding.name=none,seed=0" / "eval.json"
    for path in tasks[2].glob("encoding.name=none,*/eval.json"):
        result = json.loads(path.read_text())
        result["train_lengths"] = [1, 16]  # nothing past its range
        path.write_text(json.dumps(result))
    assert short.is_file()
    code, out, err = run(capsys, "rank", *map(str, tasks), "--format", "md")
    assert code == 0, err
    assert "rope(base=500) is left out: not in reverse, sort." in out
    assert "rope is left out: not in copy." in out
    assert "none is left out: not evaluated past the trained range in sort." in out
