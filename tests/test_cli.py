"""The command line through its real entry point: output, files, and one-line errors."""

from __future__ import annotations

import json

import pytest

from posenc_cli import __version__
from posenc_cli.encodings import ENCODINGS
from tests.helpers import run


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"posenc {__version__}"


@pytest.mark.parametrize("command", [[], ["list"], ["viz-bias"]])
def test_every_command_has_help_with_an_example(capsys, command):
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0 and "Example" in out


def test_list_json_describes_every_encoding(capsys):
    code, out, _ = run(capsys, "list", "--format", "json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and set(rows) == set(ENCODINGS)
    assert rows["learned"]["extrapolates"] is False
    assert rows["shaw"]["fused"] is False  # its value term needs the attention weights
    assert rows["alibi"]["fused"] is True
    assert rows["t5"]["params"]["num_buckets"] == {"type": "int | 'auto'", "default": 32}


def test_list_table(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0 and "rope" in out and "deberta" in out


def test_viz_bias_writes_png_and_json(capsys, tmp_path):
    png = tmp_path / "alibi.png"
    code, out, _ = run(
        capsys,
        "viz-bias",
        "alibi",
        "--length",
        "6",
        "--heads",
        "2",
        "--out",
        str(png),
        "--format",
        "json",
    )
    data = json.loads(out)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bias = data["maps"]["positional logit term"]
    assert len(bias) == 2 and len(bias[0]) == 6
    # two heads: slopes 2^-4 and 2^-8 (Press et al.); logit term -slope * |i - j|
    assert bias[0][0][3] == pytest.approx(-(2**-4) * 3, rel=1e-6)
    assert bias[1][5][1] == pytest.approx(-(2**-8) * 4, rel=1e-6)


def test_viz_bias_shows_the_sinusoid_claim(capsys):
    code, out, _ = run(capsys, "viz-bias", "sinusoidal", "--length", "24", "--format", "json")
    errors = json.loads(out)["toeplitz_error"]
    assert code == 0
    assert errors["U_i . U_j"][0] < 1e-5  # raw sinusoid: depends only on i - j
    assert min(errors["U_i^T W_q^T W_k U_j (random W)"]) > 0.1  # projected: it does not


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["viz-bias", "alibl"], "unknown encoding 'alibl' (did you mean 'alibi'?)"),
        (["viz-bias", "t5", "bucket=3"], "encoding 't5' has no parameter 'bucket'"),
        (["viz-bias", "t5", "num_buckets=many"], "t5.num_buckets: expected int"),
        (["viz-bias", "rope", "layout=diagonal"], "rope.layout: 'diagonal' is not one of"),
        (["viz-bias", "t5", "--length", "0"], "--length must be at least 1"),
        (["viz-bias", "t5", "--out", "x.jpg"], "ending in .png"),
        (["viz-bias", "learned", "length=4", "--length", "8"], "past the table's length 4"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
