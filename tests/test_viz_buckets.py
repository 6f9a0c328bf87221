"""`posenc viz-buckets`: the ids it shows are the encodings' own, in every output form."""

from __future__ import annotations

import json

import pytest

from posenc_cli.encodings.t5 import relative_position_bucket
from tests.helpers import run


def test_t5_json_ids_follow_relative_position_bucket(capsys):
    code, out, _ = run(
        capsys,
        "viz-buckets",
        "t5",
        "num_buckets=16",
        "max_distance=32",
        "--length",
        "40",
        "--format",
        "json",
    )
    (bucket_map,) = json.loads(out)["maps"]
    import torch

    expected = relative_position_bucket(torch.arange(-39, 40), True, 16, 32).tolist()
    assert code == 0 and bucket_map["ids"] == expected and bucket_map["num_buckets"] == 16


def test_shaw_clips_at_k(capsys):
    code, out, _ = run(
        capsys, "viz-buckets", "shaw", "max_distance=2", "--length", "5", "--format", "json"
    )
    (bucket_map,) = json.loads(out)["maps"]
    assert code == 0 and bucket_map["ids"] == [0, 0, 0, 1, 2, 3, 4, 4, 4]


def test_1d_table_groups_runs_of_equal_buckets(capsys):
    code, out, _ = run(capsys, "viz-buckets", "shaw", "max_distance=2", "--length", "6")
    assert code == 0 and "-5 .. -2" in out and "2 .. 5" in out


def test_2d_grid_png_and_terminal(capsys, tmp_path):
    png = tmp_path / "swin.png"
    code, out, _ = run(
        capsys,
        "viz-buckets",
        "swin",
        "height=3",
        "width=4",
        "--grid",
        "3x4",
        "--query",
        "0,0",
        "--out",
        str(png),
    )
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    assert "17" in out  # the query patch itself: offset (0, 0)
    code, out, _ = run(
        capsys,
        "viz-buckets",
        "swin",
        "height=3",
        "width=4",
        "--grid",
        "3x4",
        "--query",
        "0,0",
        "--format",
        "json",
    )
    ids = json.loads(out)["maps"][0]["ids"]
    assert ids[0][0] == 2 * 7 + 3  # query minus key (0, 0): (0 + 2) * (2*4 - 1) + (0 + 3)
    assert ids[2][3] == 0 * 7 + 0  # query minus key (-2, -3)


def test_a_clip_gets_one_map_per_frame_with_product_ids_worked_by_hand(capsys, tmp_path):
    """irpe_nd on a 3 x 2 x 3 clip, query (1, 0, 1): the key (t, r, c) has the offset
    (1 - t, -r, 1 - c), each within alpha = 1.9 so g is the identity, and product ids are the
    digits (o + 3) in base 7."""
    png = tmp_path / "clip.png"
    code, out, _ = run(capsys, "viz-buckets", "irpe_nd", "--grid", "3x2x3", "--query", "1,0,1",
                       "--format", "json", "--out", str(png))  # fmt: skip
    maps = json.loads(out)["maps"]
    assert code == 0 and png.stat().st_size > 0 and len(maps) == 3
    for t, bucket_map in enumerate(maps):
        expected = [[(1 - t + 3) * 49 + (-r + 3) * 7 + (1 - c + 3) for c in range(3)]
                    for r in range(2)]  # fmt: skip
        assert bucket_map["ids"] == expected and bucket_map["num_buckets"] == 7**3 + 1
        assert bucket_map["query_in_this_map"] == (t == 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["viz-buckets", "irpe_nd", "axes=2", "--grid", "2x3x3"], "this one reads 2 axes"),
        (["viz-buckets", "irpe_nd", "--grid", "2x3x3", "--query", "1,1"], "write T,ROW,COL"),
        (["viz-buckets", "irpe_nd", "--grid", "40x3x3"], "up to 16 frames"),
        (["viz-buckets", "swin", "--grid", "0x5"], "both sides must be at least 1"),
        (["viz-buckets", "swin", "--grid", "five"], "write HEIGHTxWIDTH"),
        (["viz-buckets", "swin", "--query", "20,1"], "outside the 14x14 grid"),
        (["viz-buckets", "alibi"], "this encoding has no buckets"),
        (["viz-buckets", "t5", "--all-methods"], "use it with irpe"),
        (["viz-buckets", "t5", "--out", "a.svg"], "ending in .png"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, _, err = run(capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
