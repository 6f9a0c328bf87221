"""Checking and converting user-given parameters against a constructor's signature.

Used by the encoding registry and by recipes: a typo gets the valid names and a close match, a
value is converted by its declared type (PyYAML reads ``3e-4`` as a string), and a choice
declared as ``Literal[...]`` is checked against its options.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import yaml

from posenc_cli.errors import UsageError


def close_match(word: str, options: typing.Iterable[str]) -> str:
    """' (did you mean X?)' or '' when nothing is close."""
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean {found[0]!r}?)" if found else ""


def signature_params(fn: Any) -> dict[str, tuple[Any, Any]]:
    """Keyword parameters of ``fn`` as ``name -> (annotation, default)``."""
    hints = typing.get_type_hints(fn)
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self":
            out[name] = (hints.get(name, Any), p.default)
    return out


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin is typing.Union:  # int | Literal['auto'] is a typing.Union, named member by member
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def convert(value: Any, annotation: Any, where: str) -> Any:
    """Convert ``value`` to ``annotation`` or raise a UsageError naming ``where``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        if value in args:
            return value
        choices = ", ".join(repr(a) for a in args)
        hint = close_match(str(value), [str(a) for a in args])
        raise UsageError(f"{where}: {value!r} is not one of {choices}{hint}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(value, option, where)
            except UsageError as err:
                errors.append(str(err))
        raise UsageError(errors[0] if errors else f"{where}: cannot convert {value!r}")
    if origin in (list, tuple):
        items = value if isinstance(value, list | tuple) else [value]
        inner = args[0] if args else Any
        return origin(convert(v, inner, where) for v in items)
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("true", "yes", "1", "on"):
            return True
        if text in ("false", "no", "0", "off"):
            return False
    elif annotation in (int, float):
        if isinstance(value, bool):
            raise UsageError(f"{where}: expected {annotation.__name__}, got a boolean {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is not None and not math.isfinite(number):
            raise UsageError(f"{where}: expected a finite number, got {value!r}")
        if number is not None and annotation is int and number.is_integer():
            whole = int(value) if isinstance(value, int) else int(number)
            if abs(whole) > 2**53:  # past what a float holds exactly; no setting needs it
                raise UsageError(f"{where}: {value!r} is too large; give at most 2**53")
            return whole
        if number is not None and annotation is float:
            return number
    elif annotation is str:
        if isinstance(value, str | int | float):
            return str(value)
    elif isinstance(value, annotation):
        return value
    raise UsageError(f"{where}: expected {type_name(annotation)}, got {value!r}")


def parse_assignments(pairs: typing.Sequence[str]) -> dict[str, Any]:
    """``["a=1", "b.c=x"]`` -> ``{"a": 1, "b.c": "x"}``; values read as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {pair!r} (for example heads=8)")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def bounded(
    default: Any = dataclasses.MISSING,
    test: Callable[[Any], bool] | None = None,
    requirement: str = "",
    *,
    most: int | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A recipe field that carries its own limits: ``test`` (with the ``requirement`` an error
    names) for the values that convert but are impossible, and ``most``, an upper bound far past
    any experiment one machine finishes, so that a typo of extra zeros fails at once instead of
    training for ever or allocating terabytes. A list is checked element by element."""
    metadata = {"test": test, "requirement": requirement, "most": most}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_fields(settings: Any, prefix: str, error: Callable[[str, str], Exception]) -> None:
    """Raise ``error(key, problem)`` for the first field of the dataclass ``settings`` (at the
    dotted ``prefix``) whose value breaks the limits ``bounded`` gave it."""
    for spec in dataclasses.fields(settings):
        value = getattr(settings, spec.name)
        key = f"{prefix}{spec.name}"
        values = value if isinstance(value, list | tuple) else [value]
        most = spec.metadata.get("most")
        for v in values:
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if most is not None and number and v > most:
                raise error(key, f"must be at most {most:,}, got {v!r}; a typo of extra zeros?")
        test = spec.metadata.get("test")
        if test is not None and not test(value):
            raise error(key, f"must be {spec.metadata['requirement']}, got {value!r}")
