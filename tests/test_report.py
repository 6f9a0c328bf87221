"""`posenc report`: its numbers recomputed from evaluations and a profile the test writes, the
code-size proxy on known source, the scenario verdicts, and the command's files and errors."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from posenc_cli.encodings import encoding_class
from posenc_cli.report.advice import verdict_at
from posenc_cli.report.code_size import attention_path, code_lines, encoding_lines
from posenc_cli.report.measure import SCHEMA, build_report, read_study
from tests.helpers import run

VERDICTS = {"agrees", "disagrees", "not resolved", "mixed", "not measured"}


def write_study(root, groups: dict[str, list[tuple[float, float]]], task="copy") -> None:
    """Per encoding, per seed: (accuracy at 1x = 8, accuracy at 4x = 32); 16 is in between."""
    for name, seeds in groups.items():
        for seed, (near, far) in enumerate(seeds):
            folder = root / f"encoding.name={name},seed={seed}"
            folder.mkdir(parents=True)
            values = ((8, near), (16, (near + far) / 2), (32, far), (64, 0.0))
            cells = {str(n): {"loss": 1 - v, "perplexity": 2 - v, "token_accuracy": v,
                              "exact_match": 0.0} for n, v in values}  # fmt: skip
            result = {"encoding": name, "encoding_params": {}, "seed": seed, "task": task,
                      "train_lengths": [4, 8], "lengths": cells}  # fmt: skip
            (folder / "eval.json").write_text(json.dumps(result))


def write_profile(path, ratios: dict[str, tuple[float, float]]) -> None:
    results = [
        {"encoding": name, "encoding_parameters": 0, "time_exponent": 2.0,
         "memory_exponent": 1.0, "points": [
             {"size": 64, "time_ratio": 9.0, "memory_ratio": 9.0, "error": None},
             {"size": 128, "time_ratio": t, "memory_ratio": m, "error": None}]}
        for name, (t, m) in ratios.items()
    ]  # fmt: skip
    path.write_text(json.dumps({"schema": "posenc.profile/1", "results": results}))


ROPE = [(0.99, 0.50), (0.98, 0.52), (0.99, 0.49)]
ALIBI = [(0.90, 0.80), (0.91, 0.82), (0.89, 0.81)]
NONE = [(0.60, 0.20), (0.62, 0.25), (0.61, 0.22)]


def test_numbers_are_the_seeds_means_at_1x_and_4x(tmp_path):
    write_study(tmp_path / "copy", {"rope": ROPE, "alibi": ALIBI, "none": NONE})
    (tmp_path / "copy" / "encoding.name=alibi,seed=3").mkdir()
    (tmp_path / "copy" / "encoding.name=alibi,seed=3" / "diverged.json").write_text(
        json.dumps({"encoding": "alibi", "encoding_params": {}, "seed": 3, "reason": "nan"})
    )
    write_profile(tmp_path / "p.json", {"none": (1.0, 1.0), "rope": (1.1, 1.2), "alibi": (2, 3)})
    report = build_report([tmp_path / "copy"], tmp_path / "p.json")
    assert report["schema"] == SCHEMA
    assert report["studies"][0]["metric"] == "token_accuracy"
    assert report["studies"][0]["trained"] == 8
    rows = {r["encoding"]: r for r in report["encodings"]}
    assert list(rows) == ["none", "rope", "alibi"]  # registry order
    extra = rows["rope"]["studies"]["copy"]["extrapolation"]
    assert extra["multiple"] == 4 and extra["length"] == 32  # 64 is 8x: past the 4x cap
    assert extra["at_1x"] == pytest.approx(statistics.fmean(a for a, _ in ROPE))
    assert extra["at_kx"] == pytest.approx(statistics.fmean(b for _, b in ROPE))
    assert extra["ratio"] == pytest.approx(extra["at_kx"] / extra["at_1x"])
    sd = rows["alibi"]["studies"]["copy"]["stability"]["sd_at_1x"]
    assert sd == pytest.approx(statistics.stdev(a for a, _ in ALIBI))
    assert rows["alibi"]["diverged"] == {"runs": 4, "diverged": 1, "share": 0.25}
    assert rows["alibi"]["cost"]["time_ratio"] == 2 and rows["alibi"]["cost"]["at_size"] == 128
    assert rows["rope"]["multimodal"] == {"dims": [1, 2], "counterpart": "rope2d"}
    assert rows["alibi"]["article"]["extrapolation"] == "very strong"
    assert [s["verdict"] for s in report["scenarios"]][2] == "not measured"  # no learned row
    assert all(s["verdict"] in VERDICTS for s in report["scenarios"])


def test_verdicts_follow_welchs_test(tmp_path):
    write_study(tmp_path / "lm", {"rope": ROPE, "alibi": ALIBI, "none": NONE}, task="text")
    study = read_study(tmp_path / "lm")
    assert study.metric == "perplexity"  # a character LM is judged on perplexity
    assert verdict_at(study, 8, "rope")[0] == "agrees"  # perplexity 2 - acc: rope lowest at 1x
    assert verdict_at(study, 8, "alibi")[0] == "disagrees"
    tied = {"rope": [(0.90, 0.5), (0.92, 0.5), (0.88, 0.5)], "alibi": [(0.91, 0.5), (0.89, 0.5),
                                                                       (0.90, 0.5)]}  # fmt: skip
    write_study(tmp_path / "tied", tied)
    verdict, text = verdict_at(read_study(tmp_path / "tied"), 8, "rope")
    assert verdict == "not resolved" and "Welch p" in text
    report = build_report([tmp_path / "lm"], None)
    general = report["scenarios"][0]
    assert general["scenario"] == "general language modelling" and general["verdict"] == "agrees"


def test_code_size_counts_code_only_and_names_the_attention_path():
    source = '''
def f(x):
    """A docstring
    over two lines."""
    # a comment

    return x + 1
'''
    assert code_lines(source) == 2
    assert encoding_lines("none") < encoding_lines("sinusoidal") < encoding_lines("irpe")
    assert attention_path(encoding_class("rope")) == "fused"
    assert attention_path(encoding_class("sandwich")) == "blocked"  # content-free, block by block
    assert attention_path(encoding_class("alibi")) == "blocked"  # its distance table as a view
    assert attention_path(encoding_class("cope")) == "own"  # blocks of its own, by hand
    assert attention_path(encoding_class("fox")) == "own"  # rides inside SDPA's causal kernel
    assert attention_path(encoding_class("shaw")) == "own"  # a value term


def test_report_command_writes_markdown_json_and_png(tmp_path, capsys):
    write_study(tmp_path / "copy", {"rope": ROPE, "alibi": ALIBI, "none": NONE})
    write_profile(tmp_path / "p.json", {"none": (1.0, 1.0), "rope": (1.1, 1.2), "alibi": (2, 3)})
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", str(tmp_path / "copy"), "--profile",
                            str(tmp_path / "p.json"), "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert "selection table" in stdout and "scenario" in stdout
    md = (out / "report.md").read_text()
    assert "| rope | rotary | 0.987 → 0.503 |" in md and "very strong" in md
    assert json.loads((out / "report.json").read_text())["schema"] == SCHEMA
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, stdout, _ = run(capsys, "report", str(tmp_path / "copy"), "--format", "json")
    assert code == 0 and json.loads(stdout)["encodings"][0]["cost"] is None


@pytest.mark.parametrize("profile", ["{", '{"schema": "other"}'])
def test_a_bad_profile_is_one_line(tmp_path, capsys, profile):
    write_study(tmp_path / "copy", {"rope": ROPE})
    (tmp_path / "p.json").write_text(profile)
    code, _, err = run(capsys, "report", str(tmp_path / "copy"), "--profile",
                       str(tmp_path / "p.json"))  # fmt: skip
    assert code == 2 and "--profile" in err and len(err.strip().splitlines()) == 1


def test_the_committed_report_is_rebuilt_from_the_committed_results():
    """docs/report/ is what `make report` writes from the results files and the profile in the
    repository, so a clone rebuilds the README's table without the run directories: every
    study's numbers, every encoding's costs and the scenario verdicts come out as committed."""
    root = Path(__file__).resolve().parents[1]
    listed = re.search(r"REPORT_STUDIES := (.*?)\nreport:", (root / "Makefile").read_text(), re.S)
    paths = [root / p for p in listed.group(1).replace("\\", " ").split()]
    built = json.loads(json.dumps(build_report(paths, root / "docs/profile/profile.json")))
    kept = json.loads((root / "docs/report/report.json").read_text())
    assert [s["name"] for s in built["studies"]] == [s["name"] for s in kept["studies"]]
    assert [r["encoding"] for r in built["encodings"]] == [r["encoding"] for r in kept["encodings"]]
    for got, want in zip(built["encodings"], kept["encodings"], strict=True):
        assert (got["studies"], got["cost"]) == (want["studies"], want["cost"]), got["encoding"]
    assert [s["verdict"] for s in built["scenarios"]] == [s["verdict"] for s in kept["scenarios"]]
