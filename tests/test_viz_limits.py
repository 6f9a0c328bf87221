"""`viz-bias` and `viz-buckets` limits: sizes that cannot fit are refused before anything big
is allocated, the estimate follows measurement, and options that do not apply are errors."""

from __future__ import annotations

import json
import math
import re

import pytest

from posenc_cli.bias_maps import positional_logits
from posenc_cli.bucket_maps import grid_buckets, scaled_grids
from posenc_cli.encodings import build_encoding
from posenc_cli.memory_budget import measure_growth
from posenc_cli.profiling.memory import LiveTensorBytes
from posenc_cli.viz_budget import PROBE_CELLS, PROBE_LENGTHS
from tests.helpers import run


def measured(compute) -> int:
    tracker = LiveTensorBytes()
    with tracker:
        compute()
    return tracker.peak


def test_alibi_bias_estimate_matches_a_measured_larger_length():
    enc = build_encoding("alibi", dim=128, heads=4, head_dim=32).eval()
    growth = measure_growth(lambda n: positional_logits(enc, n), PROBE_LENGTHS)
    assert growth(512) == pytest.approx(measured(lambda: positional_logits(enc, 512)), rel=0.05)
    # the N x N term: at least the (1, 4, N, N) float32 bias
    assert growth(10**5) / 1e10 >= 4 * 4


def test_grid_estimate_matches_a_measured_larger_grid():
    enc = build_encoding("irpe", dim=64, heads=1, head_dim=64)
    grids = {math.sqrt(h * w): (h, w) for h, w in scaled_grids(90, 60, PROBE_CELLS)}
    assert all(abs(h / w - 1.5) < 0.1 for h, w in grids.values())  # the shape is kept
    growth = measure_growth(lambda s: grid_buckets(enc, *grids[s], (0, 0), "irpe"), sorted(grids))
    actual = measured(lambda: grid_buckets(enc, 90, 60, (0, 0), "irpe"))
    assert growth(math.sqrt(90 * 60)) == pytest.approx(actual, rel=0.1)


@pytest.mark.parametrize(
    "args, start",
    [
        (["viz-bias", "alibi", "--length", "1000000"], "--length 1000000: alibi needs about"),
        (["viz-bias", "sinusoidal", "--length", "10000000"], "--length 10000000: sinusoidal"),
        (["viz-buckets", "t5", "--length", "1000000"], "--length 1000000: t5 needs about"),
        (["viz-buckets", "irpe", "--grid", "100000x100000"], "--grid 100000x100000: irpe"),
        (
            ["viz-buckets", "irpe", "--grid", "100000x100000", "--all-methods"],
            "--grid 100000x100000: irpe",
        ),
    ],
)
def test_a_size_that_cannot_fit_is_refused_in_one_line(capsys, args, start):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {start}")
    assert re.search(r"the largest that fits is about \d+ (positions|patches)$", err.strip())


def test_json_output_lowers_the_largest_length(capsys):
    largest = {}
    for extra in ([], ["--format", "json"]):
        _, _, err = run(capsys, "viz-bias", "alibi", "--length", "1000000", *extra)
        largest[bool(extra)] = int(re.search(r"about (\d+) positions", err).group(1))
    assert largest[True] < largest[False]  # every float of the maps becomes a Python object


def test_a_table_too_short_for_a_probe_reports_the_real_length(capsys):
    code, _, err = run(capsys, "viz-bias", "learned", "length=100", "--length", "1000")
    assert code == 2 and "position 999 is past the table's length 100" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["t5", "--grid", "5x5"], "--grid: t5 is a 1D encoding; give its positions with --length"),
        (["shaw", "--query", "1,1"], "--query: shaw is a 1D encoding"),
        (["t5", "--grid", "5x5", "--query", "1,1"], "--grid and --query: t5 is a 1D"),
        (["irpe", "--length", "5"], "--length: irpe is a 2D encoding; give its grid with --grid"),
    ],
)
def test_an_option_that_does_not_apply_is_an_error(capsys, args, message):
    code, _, err = run(capsys, "viz-buckets", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err


def test_the_defaults_still_apply(capsys):
    code, out, _ = run(capsys, "viz-buckets", "t5", "--format", "json")
    assert code == 0 and json.loads(out)["maps"][0]["relative_from"] == -63  # N = 64
    code, out, _ = run(capsys, "viz-buckets", "irpe", "--format", "json")
    ids = json.loads(out)["maps"][0]["ids"]
    assert code == 0 and (len(ids), len(ids[0])) == (14, 14)
