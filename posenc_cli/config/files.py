"""Reading recipe files: a path or a shipped name, the YAML, the ``extends`` chain, the kind."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from posenc_cli.config.recipe import Tree
from posenc_cli.config.shipped import shipped_recipes
from posenc_cli.config.where import Where, one_line, valid_list
from posenc_cli.errors import UsageError
from posenc_cli.params import (
    close_match,
)
from posenc_cli.tasks import DEFAULT_KIND, TASKS


@dataclass(frozen=True)
class Source:
    """A recipe file: shipped (by short name) or on disk."""

    label: str  # what messages call it
    shipped: str | None = None
    path: Path | None = None

    @property
    def identity(self) -> str:
        return f"shipped:{self.shipped}" if self.shipped else str(self.path.resolve())

    def read_text(self) -> str:
        if self.shipped:
            return shipped_recipes()[self.shipped].read_text(encoding="utf-8")
        return self.path.read_text(encoding="utf-8")


def short_name(ref: str) -> str:
    return ref.removesuffix(".yaml")


def find_recipe(ref: str) -> Source:
    """A path if that file exists, else a shipped short name."""
    if Path(ref).is_file():
        return Source(label=ref, path=Path(ref))
    shipped = shipped_recipes()
    if short_name(ref) in shipped:
        return Source(label=short_name(ref), shipped=short_name(ref))
    raise UsageError(
        f"recipe {ref}: no such file or shipped recipe{close_match(short_name(ref), shipped)}; "
        f"shipped: {valid_list(shipped)}"
    )


def find_parent(ref: Any, child: Source, where: Where, origin: str) -> Source:
    """``extends: REF`` of ``child``: a path relative to it, else a shipped short name."""
    if not isinstance(ref, str) or not ref:
        problem = f"expected a file or shipped recipe name, got {ref!r}"
        raise where.error("extends", problem, origin)
    shipped = shipped_recipes()
    if child.path is not None:
        candidate = child.path.parent / Path(ref).expanduser()
        if candidate.is_file():
            return Source(label=os.path.normpath(candidate), path=candidate)
    else:  # relative to a shipped recipe means a sibling in the shipped tree
        sibling = short_name(
            posixpath.normpath(posixpath.join(posixpath.dirname(child.shipped), ref))
        )
        if sibling in shipped:
            return Source(label=sibling, shipped=sibling)
    if short_name(ref) in shipped:
        return Source(label=short_name(ref), shipped=short_name(ref))
    raise where.error(
        "extends",
        f"{ref!r} is neither a file next to {child.label} nor a shipped recipe"
        f"{close_match(short_name(ref), shipped)}; shipped: {valid_list(shipped)}",
        origin,
    )


def parse_yaml(source: Source, where: Where) -> Any:
    at = "" if source.label == where.label else f"{source.label} "
    try:
        text = source.read_text()
    except OSError as err:
        raise UsageError(f"recipe {where.label}: {at}cannot be read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise UsageError(
            f"recipe {where.label}: {at}is not a text file (byte {err.object[err.start]:#04x} at "
            f"offset {err.start} is not UTF-8); give a YAML recipe"
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = err.problem or err.context or "invalid YAML"
        raise UsageError(
            one_line(
                f"recipe {where.label}: {at}{line}YAML syntax error ({problem}); "
                "fix the indentation or quoting there"
            )
        ) from None
    except yaml.YAMLError as err:
        raise UsageError(one_line(f"recipe {where.label}: {at}YAML error ({err})")) from None
    if raw is None:  # nothing but blanks and comments: training defaults would be a surprise
        raise UsageError(
            f"recipe {where.label}: {at}is empty; write its settings (see `posenc train "
            "quickstart --dry-run` for every key) or name a shipped recipe"
        )
    return raw


def extends_chain(source: Source, where: Where, seen: tuple[Source, ...] = ()) -> list[tuple]:
    """``[(origin, raw layer, folder), ...]`` with the deepest ``extends`` first; a cycle is an
    error. Layers are checked later, once the chain has told the recipe's kind."""
    if source.identity in (s.identity for s in seen):
        loop = " -> ".join(s.label for s in (*seen, source))
        raise UsageError(
            f"recipe {where.label}: extends: cycle {loop}; remove one of these extends"
        )
    origin = "" if source.label == where.label else f"set in {source.label}"
    raw = parse_yaml(source, where)
    base = source.path.parent if source.path is not None else Path.cwd()
    if not isinstance(raw, dict) or "extends" not in raw:
        return [(origin, raw, base)]
    raw = dict(raw)
    parent = find_parent(raw.pop("extends"), source, where, origin)
    return [*extends_chain(parent, where, (*seen, source)), (origin, raw, base)]


def chain_kind(chain: list[tuple], where: Where) -> str:
    """The last ``kind`` the chain sets (``DEFAULT_KIND`` if none)."""
    kind, origin = DEFAULT_KIND, ""
    for layer_origin, raw, _ in chain:
        if isinstance(raw, dict) and "kind" in raw:
            kind, origin = raw["kind"], layer_origin
    if kind not in TASKS:
        hint = close_match(str(kind), TASKS)
        raise where.error(
            "kind", f"unknown kind {kind!r}{hint}; valid: {valid_list(TASKS)}", origin
        )
    return kind


def absolute_corpus(layer: Tree, base: Path) -> None:
    data = layer.get("data") or {}
    corpus = data.get("corpus")
    if isinstance(corpus, str) and corpus:
        data["corpus"] = os.path.abspath(base / Path(corpus).expanduser())
