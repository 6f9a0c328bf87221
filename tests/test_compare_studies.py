"""`posenc compare` over several studies of the same encodings (copy and copy with randomized
positions, say): groups stay apart by study, `--baseline STUDY` tests each encoding against
itself there, and a seed that would count twice is refused."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from tests.helpers import run
from tests.test_evaluate_faults import assert_one_line
from tests.test_statistics import write_runs

PLAIN = {"none": [0.50, 0.52, 0.51], "rope": [0.40, 0.42, 0.41]}
RANDOM = {"rope": [0.60, 0.63, 0.61], "alibi": [0.70, 0.71, 0.69]}


def studies(tmp_path):
    write_runs(tmp_path / "copy", PLAIN)
    write_runs(tmp_path / "copy-randomized", RANDOM)
    return [str(tmp_path / "copy"), str(tmp_path / "copy-randomized")]


def compare_json(capsys, *args: str) -> dict:
    code, out, err = run(capsys, "compare", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_the_same_encoding_in_two_studies_is_two_groups(tmp_path, capsys):
    groups = compare_json(capsys, *studies(tmp_path))["groups"]
    assert set(groups) == {"none [copy]", "rope [copy]", "rope [copy-randomized]",
                           "alibi [copy-randomized]"}  # fmt: skip
    rope = groups["rope [copy-randomized]"]
    assert rope["study"] == "copy-randomized" and rope["seeds"] == [0, 1, 2]
    assert rope["lengths"]["8"]["token_accuracy"]["values"] == RANDOM["rope"]


def test_studies_that_share_no_run_keep_their_plain_labels(tmp_path, capsys):
    write_runs(tmp_path / "a", {"none": [0.5, 0.6]})
    write_runs(tmp_path / "b", {"rope": [0.4, 0.5]})
    groups = compare_json(capsys, str(tmp_path / "a"), str(tmp_path / "b"))["groups"]
    assert set(groups) == {"none", "rope"} and "study" not in groups["none"]


def test_a_study_as_baseline_tests_each_encoding_against_itself_there(tmp_path, capsys):
    paths = studies(tmp_path)
    result = compare_json(capsys, *paths, "--baseline", "copy")
    assert result["against"] == {"rope [copy-randomized]": "rope [copy]"}  # alibi has no pair
    test = result["groups"]["rope [copy-randomized]"]["lengths"]["8"]["token_accuracy"]
    welch = stats.ttest_ind(RANDOM["rope"], PLAIN["rope"], equal_var=False).pvalue
    assert test["vs_baseline"]["p"] == pytest.approx(welch)
    assert test["vs_baseline"]["paired"]["p"] == pytest.approx(
        stats.ttest_rel(RANDOM["rope"], PLAIN["rope"]).pvalue
    )
    for other in ("none [copy]", "alibi [copy-randomized]", "rope [copy]"):
        assert "vs_baseline" not in result["groups"][other]["lengths"]["8"]["token_accuracy"]
    code, out, _ = run(capsys, "compare", *paths, "--baseline", "copy", "--format", "md")
    assert code == 0 and "Against the same encoding in copy" in out
    tested = [line for line in out.split("Against")[1].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in tested[1:]] == ["| rope [copy-randomized]"]


def test_a_group_of_one_study_is_still_a_baseline(tmp_path, capsys):
    result = compare_json(capsys, *studies(tmp_path), "--baseline", "none [copy]")
    assert set(result["against"]) == {"rope [copy]", "rope [copy-randomized]",
                                      "alibi [copy-randomized]"}  # fmt: skip


def test_an_unknown_study_baseline_names_the_choices(tmp_path, capsys):
    code, _, err = run(capsys, "compare", *studies(tmp_path), "--baseline", "copy-random")
    assert_one_line(code, err, "copy-randomized")


def test_a_seed_counted_twice_is_refused(tmp_path, capsys):
    write_runs(tmp_path / "copy", PLAIN)
    path = str(tmp_path / "copy")
    code, _, err = run(capsys, "compare", path, path)
    assert_one_line(code, err, "seed 0 appears 2 times", "give each sweep once")
    write_runs(tmp_path / "both" / "first", PLAIN)  # two sweeps of one setting below a folder
    write_runs(tmp_path / "both" / "second", PLAIN)
    code, _, err = run(capsys, "compare", str(tmp_path / "both"))
    assert_one_line(code, err, "seed 0 appears 2 times")
