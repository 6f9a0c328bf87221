"""The statistics behind `posenc compare`: intervals and Welch's test against scipy and against
the textbook formulas, the seeds needed against Cohen's power table, and `compare --baseline`
end to end on evaluations the test writes."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from scipy import stats

from posenc_cli.statistics import ci95, cohens_d, paired, power, seeds_needed, welch
from tests.helpers import run

A = [0.81, 0.84, 0.79, 0.83, 0.80]
B = [0.71, 0.78, 0.69, 0.74]


def test_ci95_is_students_interval():
    low, high = stats.t.interval(0.95, len(A) - 1, loc=statistics.fmean(A), scale=stats.sem(A))
    assert ci95(A) == pytest.approx((high - low) / 2)
    assert ci95([0.5]) is None


def test_welch_matches_scipy_and_the_formula():
    test = welch(A, B)
    reference = stats.ttest_ind(A, B, equal_var=False)
    assert (test["t"], test["p"]) == pytest.approx((reference.statistic, reference.pvalue))
    va, vb = statistics.variance(A) / len(A), statistics.variance(B) / len(B)
    t = (statistics.fmean(A) - statistics.fmean(B)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(A) - 1) + vb**2 / (len(B) - 1))  # Welch-Satterthwaite
    assert test["t"] == pytest.approx(t) and test["p"] == pytest.approx(2 * stats.t.sf(t, df))
    assert test["resolved"] and test["diff"] == pytest.approx(0.084)
    pooled = math.sqrt((statistics.variance(A) + statistics.variance(B)) / 2)
    assert test["effect_size"] == pytest.approx(0.084 / pooled)


def test_a_difference_inside_the_spread_is_not_resolved():
    test = welch([0.5, 0.7, 0.6], [0.55, 0.65, 0.62])
    assert not test["resolved"] and test["p"] > 0.5


def test_seeds_needed_match_cohens_power_table():
    # two-sided, alpha 0.05, power 0.8: d = 0.5, 0.8, 1.0 need 64, 26 and 17 per group
    assert [seeds_needed(d) for d in (0.5, 0.8, 1.0)] == [64, 26, 17]
    assert power(1.0, 17) >= 0.8 > power(1.0, 16)
    assert seeds_needed(0.0) is None and seeds_needed(1e-4) is None  # past any budget


def test_seeds_needed_is_the_first_count_that_reaches_the_power():
    # the walk from the z-test's guess against a scan of every count, with scipy's noncentral t
    # (defined for these moderate shifts) as the power
    critical = stats.t.ppf
    for d in (2.5, 1.3, 0.7, 0.35):
        first = next(
            n
            for n in range(2, 400)
            if stats.nct.sf(critical(0.975, 2 * n - 2), 2 * n - 2, d * (n / 2) ** 0.5)
            + stats.nct.cdf(-critical(0.975, 2 * n - 2), 2 * n - 2, d * (n / 2) ** 0.5)
            >= 0.8
        )
        assert seeds_needed(d) == seeds_needed(-d) == first


def test_identical_seeds_have_no_spread_to_test():
    assert cohens_d([1.0, 1.0], [1.0, 1.0]) == 0.0
    test = welch([1.0, 1.0], [0.5, 0.5])
    assert test["resolved"] and test["effect_size"] is None and test["seeds_needed"] == 2


def write_runs(root, groups: dict[str, list[float]]) -> None:
    for name, values in groups.items():
        for seed, value in enumerate(values):
            run_dir = root / f"encoding.name={name},seed={seed}"
            run_dir.mkdir(parents=True)
            cell = {"loss": 1 - value, "perplexity": 2.0, "token_accuracy": value,
                    "exact_match": 0.0}  # fmt: skip
            result = {"encoding": name, "encoding_params": {}, "seed": seed,
                      "train_lengths": [4, 8], "lengths": {"8": cell}}  # fmt: skip
            (run_dir / "eval.json").write_text(json.dumps(result))


def test_compare_against_a_baseline_in_json_markdown_and_the_table(tmp_path, capsys):
    write_runs(tmp_path, {"none": B, "alibi": A, "rope": [0.70, 0.80, 0.72, 0.76]})
    code, out, err = run(capsys, "compare", str(tmp_path), "--baseline", "none", "--format", "json")
    assert code == 0, err
    groups = json.loads(out)["groups"]
    cell = groups["alibi"]["lengths"]["8"]["token_accuracy"]
    assert cell["ci95"] == pytest.approx(ci95(A))
    assert cell["vs_baseline"]["p"] == pytest.approx(stats.ttest_ind(A, B, equal_var=False).pvalue)
    assert "vs_baseline" not in groups["none"]["lengths"]["8"]["token_accuracy"]
    assert not groups["rope"]["lengths"]["8"]["token_accuracy"]["vs_baseline"]["resolved"]
    # lower is better for the loss: alibi's lower loss is still marked as better
    code, out, _ = run(capsys, "compare", str(tmp_path), "--baseline", "none", "--format", "md",
                       "--metric", "loss")  # fmt: skip
    assert code == 0 and "Against none" in out
    alibi = next(line for line in out.splitlines() if line.startswith("| alibi"))
    assert "▲" in alibi
    code, out, _ = run(capsys, "compare", str(tmp_path), "--baseline", "none")
    assert code == 0 and "Welch" in out and "seeds" in out


def test_an_unknown_baseline_is_one_line(tmp_path, capsys):
    write_runs(tmp_path, {"none": B, "alibi": A})
    code, _, err = run(capsys, "compare", str(tmp_path), "--baseline", "alibj")
    assert code == 2 and "alibi" in err and len(err.strip().splitlines()) == 1


def test_power_stays_defined_for_the_large_effects_a_few_seeds_give():
    # scipy's noncentral t answered NaN here (d 14.25 with 2-3 seeds, seen on a real sweep)
    for d in (6.29, 14.25, 19.31):
        powers = [power(d, n) for n in range(2, 8)]
        assert all(0.0 <= p <= 1.0 for p in powers)
        assert all(b >= a - 1e-9 for a, b in zip(powers, powers[1:], strict=False))
    assert power(6.29, 2) == pytest.approx(stats.nct.sf(stats.t.ppf(0.975, 2), 2, 6.29), abs=1e-3)
    assert seeds_needed(-19.31) == 2


def test_fitted_at_counts_the_seeds_that_fitted_the_trained_range(tmp_path, capsys):
    """Judged at the longest trained length (8 here) on the table's metric; lower is better
    for the loss, so the threshold flips there."""
    write_runs(tmp_path, {"none": [0.5, 0.995, 0.999], "rope": [0.999, 0.999, 0.999]})
    code, out, err = run(capsys, "compare", str(tmp_path), "--fitted-at", "0.99",
                         "--format", "json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["fit"] == {"metric": "token_accuracy", "threshold": 0.99}
    none = result["groups"]["none"]["fitted"]
    assert none == {"seeds": [1, 2], "unfit": [0], "unknown": []}
    assert result["groups"]["rope"]["fitted"]["seeds"] == [0, 1, 2]
    code, out, _ = run(capsys, "compare", str(tmp_path), "--fitted-at", "0.003",
                       "--metric", "loss", "--format", "md")  # fmt: skip
    none_row = next(line for line in out.splitlines() if line.startswith("| none"))
    assert code == 0 and "| 3 (1 fit) |" in none_row and "<= 0.003" in out
    code, out, _ = run(capsys, "compare", str(tmp_path), "--fitted-at", "0.99")
    assert code == 0 and "2 fit" in out and "longest trained length" in out
    code, _, err = run(capsys, "compare", str(tmp_path), "--fitted-at", "nan")
    assert code == 2 and "--fitted-at" in err


def test_the_paired_test_matches_scipy_over_shared_seeds():
    a = {0: 0.81, 1: 0.84, 2: 0.79, 3: 0.83, 7: 0.5}
    b = {0: 0.80, 1: 0.82, 2: 0.78, 3: 0.80, 9: 0.9}  # seeds 7 and 9 have no partner
    got = paired(a, b)
    want = stats.ttest_rel([0.81, 0.84, 0.79, 0.83], [0.80, 0.82, 0.78, 0.80])
    assert got["seeds"] == 4 and got["p"] == pytest.approx(want.pvalue)
    assert got["t"] == pytest.approx(want.statistic) and got["resolved"] == (want.pvalue < 0.05)
    assert paired({0: 1.0}, {0: 0.5})["p"] is None  # one shared seed: nothing to test
    assert paired({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5})["p"] is None  # a constant difference


def test_compare_pairs_runs_by_seed_not_by_order(tmp_path, capsys):
    """Seeds 0-10 sort as 0, 1, 10, 2 ... by folder name; the pairs must still match seeds."""
    a = [0.5 + 0.01 * s + (0.002 if s % 2 else 0.0) for s in range(11)]
    b = [0.5 + 0.01 * s for s in range(11)]
    write_runs(tmp_path, {"none": b, "alibi": a})
    code, out, err = run(capsys, "compare", str(tmp_path), "--baseline", "none", "--format", "json")
    assert code == 0, err
    test = json.loads(out)["groups"]["alibi"]["lengths"]["8"]["token_accuracy"]["vs_baseline"]
    want = stats.ttest_rel(a, b).pvalue
    assert test["paired"]["p"] == pytest.approx(want) and test["paired"]["seeds"] == 11
    assert test["p"] > 0.5 and test["paired"]["resolved"]  # pairing sees what Welch cannot


def test_nearly_identical_seeds_give_a_p_and_no_warning():
    """A baseline at 1.0 in every seed made scipy warn of precision loss on stderr, once per
    cell (seen on a real sweep: these are reverse's per-token accuracies at n=10)."""
    import warnings

    a, b = [0.9996448863636364, 1.0, 0.9992897727272727], [1.0, 1.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        test, pair = welch(a, b), paired(dict(enumerate(a)), dict(enumerate(b)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference may warn
        reference = stats.ttest_ind(a, b, equal_var=False).pvalue
    assert test["p"] == pytest.approx(reference)
    assert not test["resolved"] and pair["p"] is not None


def test_holm_steps_down_and_bh_is_scipys():
    from posenc_cli.statistics import adjusted

    p = [0.01, 0.04, 0.03, 0.005]
    # Holm by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, kept non-decreasing
    assert adjusted(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjusted([0.5, 0.9], "holm") == pytest.approx([1.0, 1.0])  # capped at 1
    assert adjusted(p, "bh") == pytest.approx(list(stats.false_discovery_control(p)))
    assert adjusted([], "holm") == [] and adjusted([], "bh") == []


def test_compare_adjust_resolves_by_the_adjusted_p(tmp_path, capsys):
    write_runs(tmp_path, {"none": B, "alibi": A, "rope": [0.70, 0.80, 0.72, 0.76]})
    code, out, err = run(capsys, "compare", str(tmp_path), "--baseline", "none", "--adjust",
                         "holm", "--format", "json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["adjust"] == "holm"
    tests = {g: result["groups"][g]["lengths"]["8"]["token_accuracy"]["vs_baseline"]
             for g in ("alibi", "rope")}  # fmt: skip
    raw = [tests["alibi"]["p"], tests["rope"]["p"]]
    low, high = sorted(raw)
    want = {raw.index(low): 2 * low, raw.index(high): max(2 * low, min(1.0, high))}
    for i, g in enumerate(("alibi", "rope")):
        assert tests[g]["p_adjusted"] == pytest.approx(want[i])
        assert tests[g]["resolved"] == (tests[g]["p_adjusted"] < 0.05)
    code, out, _ = run(capsys, "compare", str(tmp_path), "--baseline", "none", "--adjust", "bh",
                       "--format", "md")  # fmt: skip
    assert code == 0 and "after Benjamini-Hochberg's adjustment" in out and " bh 0." in out


@pytest.mark.parametrize("args", [["--adjust", "holm"], ["--baseline", "none", "--adjust", "fdr"]])
def test_adjust_without_a_baseline_or_a_known_method_is_one_line(tmp_path, capsys, args):
    write_runs(tmp_path, {"none": B, "alibi": A})
    code, out, err = run(capsys, "compare", str(tmp_path), *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--adjust" in err and "holm, bh" in err


def test_the_compare_picture_cuts_each_band_to_the_metrics_range(tmp_path, capsys, monkeypatch):
    """Three seeds at 0, 1 and 0.5: the t-based 95% interval of the mean is 0.5 ± 1.24, far past
    what an accuracy can be. The band drawn stops at 0 and 1; the table keeps the interval."""
    import matplotlib.axes

    write_runs(tmp_path / "runs", {"none": [0.0, 1.0, 0.5]})
    drawn = []
    real = matplotlib.axes.Axes.fill_between

    def fill_between(self, x, low, high, **kw):
        drawn.append((low, high))
        return real(self, x, low, high, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", fill_between)
    out = tmp_path / "curves.png"
    code, _, err = run(capsys, "compare", str(tmp_path / "runs"), "--out", str(out))
    assert code == 0, err
    assert out.stat().st_size > 0
    [(low, high)] = drawn
    assert list(low) == [0.0] and list(high) == [1.0]
    assert 0.5 - ci95([0.0, 1.0, 0.5]) < 0 < 1 < 0.5 + ci95([0.0, 1.0, 0.5])


def test_every_metric_has_the_range_of_its_scale():
    from posenc_cli.compare import all_metrics, metric_range
    from posenc_cli.plots import band

    ranges = {metric: metric_range(metric) for metric in all_metrics()}
    assert ranges["exact_match"] == ranges["token_accuracy"] == (0.0, 1.0)
    assert ranges["top1"] == ranges["AP50"] == (0.0, 100.0)  # both in percent
    assert ranges["loss"] == ranges["perplexity"] == (0.0, float("inf"))
    low, high = band([0.2, 99.0], [0.5, 3.0], (0.0, 100.0))
    assert list(low) == [0.0, 96.0] and list(high) == [0.7, 100.0]
    low, high = band([0.2], [0.5])  # no limits: the interval as it is
    assert list(low) == [pytest.approx(-0.3)] and list(high) == [0.7]
