"""`posenc export`: a sweep's results in one file that compare, rank and report read exactly as
they read the sweep, so that results outlive their run directories; and its one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run
from tests.test_evaluate_faults import assert_one_line
from tests.test_rank import TASKS, write_task
from tests.test_report import ALIBI, NONE, ROPE, write_study


@pytest.fixture
def sweep(tmp_path):
    """A task of three encodings x three seeds, a training summary per run, one diverged run."""
    root = write_task(tmp_path / "copy", TASKS["copy"])
    for n, folder in enumerate(sorted(root.iterdir())):
        (folder / "summary.json").write_text(json.dumps({"steps_trained": 100 * (n + 1)}))
    dead = root / "encoding.name=xl,seed=0"
    dead.mkdir()
    record = {"encoding": "xl", "encoding_params": {}, "seed": 0, "reason": "loss became nan"}
    (dead / "diverged.json").write_text(json.dumps(record))
    return root


def export(capsys, *paths) -> None:
    """``posenc export SOURCES... --out LAST``."""
    *sources, out = paths
    code, stdout, err = run(capsys, "export", *map(str, sources), "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in stdout.replace("\n", "")


def output(capsys, *args: str) -> str:
    code, stdout, err = run(capsys, *args)
    assert code == 0, err
    return stdout


def test_the_file_holds_every_run_its_summary_and_the_diverged(sweep, tmp_path, capsys):
    out = tmp_path / "results" / "copy.json"  # the folder is made on the way
    export(capsys, sweep, out)
    doc = json.loads(out.read_text())
    assert doc["schema"] == "posenc.results/1" and len(doc["runs"]) == 9
    names = {e["name"] for e in doc["runs"]}
    assert "encoding.name=rope,seed=2" in names
    for entry in doc["runs"]:
        folder = sweep / entry["name"]
        assert entry["evaluation"] == json.loads((folder / "eval.json").read_text())
        assert entry["summary"] == json.loads((folder / "summary.json").read_text())
    assert [e["record"]["encoding"] for e in doc["diverged"]] == ["xl"]


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--metric", "exact_match", "--fitted-at", "0.99", "--baseline", "none"],
        ["--baseline", "alibi", "--adjust", "holm"],
    ],
)
def test_compare_reads_the_file_as_it_reads_the_sweep(sweep, tmp_path, capsys, options):
    out = tmp_path / "copy.json"
    export(capsys, sweep, out)
    for fmt in ("json", "md"):
        from_sweep = output(capsys, "compare", str(sweep), *options, "--format", fmt)
        from_file = output(capsys, "compare", str(out), *options, "--format", fmt)
        assert from_file == from_sweep
    result = json.loads(output(capsys, "compare", str(out), "--format", "json"))
    assert result["groups"]["xl"]["diverged"] == [0]  # the diverged run travels too


def test_rank_mixes_files_and_sweeps_and_names_a_file_by_its_stem(tmp_path, capsys):
    sweeps = [write_task(tmp_path / task, encodings) for task, encodings in TASKS.items()]
    files = []
    for folder in sweeps[:2]:
        files.append(tmp_path / "results" / f"{folder.name}.json")
        export(capsys, folder, files[-1])
    from_sweeps = json.loads(output(capsys, "rank", *map(str, sweeps), "--format", "json"))
    mixed = json.loads(output(capsys, "rank", *map(str, [*files, sweeps[2]]), "--format", "json"))
    assert [s["name"] for s in mixed["studies"]] == ["copy", "reverse", "sort"]
    assert mixed["encodings"] == from_sweeps["encodings"]
    assert mixed["friedman"] == from_sweeps["friedman"]


def test_report_reads_the_file_as_it_reads_the_sweep(tmp_path, capsys):
    write_study(tmp_path / "copy", {"rope": ROPE, "alibi": ALIBI, "none": NONE})
    export(capsys, tmp_path / "copy", tmp_path / "copy.json")
    from_sweep, from_file = (
        json.loads(output(capsys, "report", str(tmp_path / name), "--format", "json"))
        for name in ("copy", "copy.json")
    )
    assert from_file["encodings"] == from_sweep["encodings"]
    assert [s["name"] for s in from_file["studies"]] == ["copy"]


def test_a_failed_export_leaves_the_earlier_file_as_it_was(sweep, tmp_path, capsys):
    out = tmp_path / "copy.json"
    export(capsys, sweep, out)
    before = out.read_bytes()
    (sweep / "encoding.name=rope,seed=0" / "eval.json").write_text("{")  # damaged since
    code, _, err = run(capsys, "export", str(sweep), "--out", str(out))
    assert_one_line(code, err, "eval.json", "damaged")
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{", ["not valid JSON", "posenc export"]),
        ('{"schema": "posenc.results/1", "runs": [{"name": "a", "evaluation": {}}]}',
         ["damaged", "posenc export"]),
        ('{"schema": "posenc.results/1", "runs": [], "diverged": []}', ["holds no run"]),
    ],
)  # fmt: skip
def test_a_damaged_results_file_is_one_line(tmp_path, capsys, content, words):
    path = tmp_path / "copy.json"
    path.write_text(content)
    if content == "{":  # not JSON: compare cannot know it was meant as a results file
        words = ["a file, not a run or sweep directory", "posenc export"]
    for verb in ("compare", "report"):
        code, _, err = run(capsys, verb, str(path))
        assert_one_line(code, err, str(path), *words)


def test_bad_export_arguments_are_one_line(sweep, tmp_path, capsys):
    out = str(tmp_path / "a.json")
    code, _, err = run(capsys, "export", str(sweep), "--out", str(tmp_path / "copy.txt"))
    assert_one_line(code, err, "--out", ".json")
    code, _, err = run(capsys, "export", str(tmp_path / "nowhere"), "--out", out)
    assert_one_line(code, err, "no such run or sweep directory")
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "export", str(tmp_path / "empty"), "--out", out)
    assert_one_line(code, err, "holds no evaluated run")
    assert not (tmp_path / "a.json").exists()


def test_a_sweep_run_in_parts_merges_into_one_file(sweep, tmp_path, capsys):
    first, rest = tmp_path / "first", tmp_path / "rest"
    for folder in sorted(sweep.iterdir()):  # rope's runs in a second session, say
        target = rest if "rope" in folder.name else first
        target.mkdir(exist_ok=True)
        folder.rename(target / folder.name)
    export(capsys, first, tmp_path / "first.json")
    export(capsys, tmp_path / "first.json", rest, tmp_path / "all.json")
    merged = json.loads(output(capsys, "compare", str(tmp_path / "all.json"), "--format", "json"))
    whole = json.loads(output(capsys, "compare", str(first), str(rest), "--format", "json"))
    assert merged == whole and set(merged["groups"]) == {"alibi", "none", "rope", "xl"}
    code, _, err = run(capsys, "export", str(tmp_path / "all.json"), str(rest), "--out",
                       str(tmp_path / "twice.json"))  # fmt: skip
    assert_one_line(code, err, "encoding.name=rope,seed=0", "export each run once")
