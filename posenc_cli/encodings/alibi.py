"""Placeholder: being written."""

from posenc_cli.encodings.base import PositionEncoding


class ALiBi(PositionEncoding):
    pass
