"""One-line recipe errors: the recipe's name, the key, and where the key was set."""

from __future__ import annotations

import typing
from typing import Any

from posenc_cli.errors import UsageError
from posenc_cli.params import (
    convert,
)
from posenc_cli.tasks import DEFAULT_KIND, task_of


class Where:
    """Builds the one-line errors: the recipe's name, the key, and where the key was set."""

    def __init__(self, label: str, kind: str = DEFAULT_KIND) -> None:
        self.label = label
        self.kind = kind  # the recipe's kind decides which keys exist
        self.origins: dict[str, str] = {}  # dotted key -> "set in text/base", ...

    @property
    def sections(self) -> dict[str, type]:
        return task_of(self.kind).schema.SECTIONS

    def error(self, key: str, problem: str, origin: str | None = None) -> UsageError:
        """``origin`` None: where ``key`` was set, as recorded; "" for the recipe itself."""
        origin = self.origins.get(key, "") if origin is None else origin
        at = f" ({origin})" if origin else ""
        return UsageError(one_line(f"recipe {self.label}: {key}{at}: {problem}"))

    def converted(self, value: Any, annotation: Any, key: str) -> Any:
        """``convert`` with the message re-worded as ``recipe NAME: KEY: problem``."""
        try:
            return convert(value, annotation, key)
        except UsageError as err:
            raise self.error(key, str(err).removeprefix(f"{key}: ")) from None


def one_line(text: str) -> str:
    return " ".join(text.splitlines())


def valid_list(options: typing.Iterable[str]) -> str:
    return ", ".join(options) or "none"
