"""From the merged tree to a typed ``Recipe``: each value converted by its field's type, then
checked."""

from __future__ import annotations

import typing
from typing import Any

import torch

from posenc_cli.config.dump import format_value
from posenc_cli.config.recipe import EncodingConfig, Recipe, Tree
from posenc_cli.config.where import Where, valid_list
from posenc_cli.encodings import ENCODINGS, check_params, refuse_dims, user_params
from posenc_cli.errors import UsageError
from posenc_cli.params import (
    check_fields,
    close_match,
)
from posenc_cli.tasks import task_of


def empty_tree(sections: dict[str, type]) -> Tree:
    return {"seed": 0, "encoding": {}, "sweep": None, **{name: {} for name in sections}}


def section_of(cls: type, values: dict[str, Any], name: str, where: Where) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {
        key: where.converted(value, hints[key], f"{name}.{key}") for key, value in values.items()
    }
    return cls(**kwargs)


def encoding_section(values: dict[str, Any], where: Where) -> EncodingConfig:
    schema = task_of(where.kind).schema
    also = getattr(schema, "ENCODINGS_ALSO", ())  # names taken whatever their dims
    name = where.converted(values.get("name", schema.DEFAULT_ENCODING), str, "encoding.name")
    valid = [n for n, cls in ENCODINGS.items() if cls.dims in schema.ENCODING_DIMS or n in also]
    if name not in ENCODINGS:
        raise where.error(
            "encoding.name",
            f"unknown encoding {name!r}{close_match(name, valid)}; valid: {valid_list(valid)}",
        )
    try:
        refuse_dims(name, schema.ENCODING_DIMS, f"a {where.kind} recipe", also)
    except UsageError as err:
        raise where.error("encoding.name", str(err)) from None
    spec = user_params(name)
    params = {}
    for key, value in values.items():
        if key == "name":
            continue
        if key not in spec:
            valid = f"valid: {', '.join(spec)}" if spec else f"it takes none; remove encoding.{key}"
            raise where.error(
                f"encoding.{key}",
                f"encoding {name!r} has no parameter {key!r}{close_match(key, spec)}; {valid}",
            )
        try:
            params.update(check_params(name, {key: value}))
        except UsageError as err:
            raise where.error(f"encoding.{key}", str(err).removeprefix(f"{name}.{key}: ")) from None
    return EncodingConfig(name=name, params=params)


def key_type(dotted: str, sections: dict[str, type]) -> Any:
    """The declared type of a dotted key; ``Any`` for encoding parameters (name-dependent)."""
    section, _, rest = dotted.partition(".")
    if section == "seed":
        return int
    if section == "encoding":
        return str if rest == "name" else Any
    return typing.get_type_hints(sections[section])[rest]


def sweep_section(grid: dict[str, Any] | None, where: Where) -> dict[str, list] | None:
    if not grid:
        return None
    out = {}
    for key, values in grid.items():
        where_key = f"sweep.{key}"
        if not isinstance(values, list) or not values:
            raise where.error(where_key, f"expected a non-empty list of values, got {values!r}")
        declared = key_type(key, where.sections)
        # a list-valued setting is swept over lists: [[8, 16], [32]]
        converted = [where.converted(v, declared, where_key) for v in values]
        names = [format_value(v) for v in converted]
        for i, text in enumerate(names):
            if text in names[:i]:
                raise where.error(where_key, f"value {values[i]!r} is listed twice; list it once")
        out[key] = converted
    return out


def build_recipe(tree: Tree, where: Where, notes: list[str], source: str) -> Recipe:
    sections = where.sections
    recipe = Recipe(
        seed=where.converted(tree["seed"], int, "seed"),
        model=section_of(sections["model"], tree["model"], "model", where),
        encoding=encoding_section(tree["encoding"], where),
        data=section_of(sections["data"], tree["data"], "data", where),
        train=section_of(sections["train"], tree["train"], "train", where),
        eval=section_of(sections["eval"], tree["eval"], "eval", where),
        kind=where.kind,
        sweep=sweep_section(tree.get("sweep"), where),
        source=source,
        notes=list(notes),
    )
    check_fields(recipe, "", where.error)  # the seed; the sections' limits live on their fields
    for name in ("model", "data", "train", "eval"):
        check_fields(getattr(recipe, name), f"{name}.", where.error)
    rules = task_of(recipe.kind).schema  # every task's schema by the same route
    rules.validate(recipe, where.error)
    try:
        with torch.random.fork_rng(devices=[]):
            rules.build_encoding_once(recipe)
    except UsageError as err:
        raise where.error("encoding", str(err)) from None
    return recipe
