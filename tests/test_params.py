"""Parameter conversion by declared type; the messages users see."""

from __future__ import annotations

from typing import Literal

import pytest

from posenc_cli.errors import UsageError
from posenc_cli.params import close_match, convert, parse_assignments


def test_yaml_style_scientific_strings_become_floats():
    assert convert("3e-4", float, "train.lr") == pytest.approx(3e-4)


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("No", False), (1, True), ("0", False)])
def test_booleans(raw, value):
    assert convert(raw, bool, "x") is value


def test_int_rejects_fractions_and_booleans():
    assert convert("12", int, "n") == 12
    assert convert(12.0, int, "n") == 12
    with pytest.raises(UsageError, match="n: expected int"):
        convert(1.5, int, "n")
    with pytest.raises(UsageError, match="boolean"):
        convert(True, int, "n")


def test_literal_choices_name_the_options_and_a_close_match():
    kind = Literal["interleaved", "half"]
    assert convert("half", kind, "rope.layout") == "half"
    with pytest.raises(UsageError, match=r"rope.layout: 'interleave' is not one of .*did you mean"):
        convert("interleave", kind, "rope.layout")


def test_optional_values():
    assert convert(None, bool | None, "x") is None
    assert convert("yes", bool | None, "x") is True


def test_assignments_read_values_as_yaml_scalars():
    assert parse_assignments(["a=1", "b=x", "c=3e-4", "d=true"]) == {
        "a": 1,
        "b": "x",
        "c": "3e-4",  # PyYAML's reading; convert() turns it into a float by the declared type
        "d": True,
    }
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        parse_assignments(["novalue"])


def test_close_match():
    assert "num_buckets" in close_match("num_bucket", ["num_buckets", "max_distance"])
    assert close_match("zzz", ["num_buckets"]) == ""
