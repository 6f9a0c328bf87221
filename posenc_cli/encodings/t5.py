"""Placeholder: being written."""

from posenc_cli.encodings.base import PositionEncoding


class T5Bias(PositionEncoding):
    pass
