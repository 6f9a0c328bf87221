"""A recipe back to YAML (a run's ``recipe.yaml``), notes as comments; it loads to the same
recipe."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from posenc_cli.config.recipe import Recipe, Tree
from posenc_cli.config.where import one_line
from posenc_cli.runs.checkpoint import atomic_write_text
from posenc_cli.tasks import DEFAULT_KIND


def format_value(value: Any) -> str:
    """A value as it appears in a run name (which is also a folder name)."""
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, list | tuple):
        text = "_".join(format_value(v) for v in value)
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def to_tree(recipe: Recipe) -> Tree:
    tree = recipe_to_dict(dataclasses.replace(recipe, sweep=None))
    tree.setdefault("sweep", None)
    return tree


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe as plain data: the encoding's parameters beside its name."""
    out: dict[str, Any] = {} if recipe.kind == DEFAULT_KIND else {"kind": recipe.kind}
    out.update(seed=recipe.seed, model=dataclasses.asdict(recipe.model))
    out["encoding"] = {"name": recipe.encoding.name, **copy.deepcopy(recipe.encoding.params)}
    for name in ("data", "train", "eval"):
        out[name] = dataclasses.asdict(getattr(recipe, name))
    if recipe.sweep:
        out["sweep"] = copy.deepcopy(recipe.sweep)
    return out


class Dumper(yaml.SafeDumper):
    """Lists in flow style (``[5, 20]``), mappings in block style."""


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML; ``load_recipe`` of the text gives an equal Recipe."""
    header = [f"# resolved recipe from {recipe.source or 'defaults'}"]
    header += [f"# note: {note}" for note in recipe.notes]
    body = yaml.dump(recipe_to_dict(recipe), Dumper=Dumper, sort_keys=False)
    return "\n".join(one_line(line) for line in header) + "\n" + body


def write_recipe(out: Path, recipe: Recipe) -> None:
    """A run's ``recipe.yaml``: the resolved recipe, written whole or not at all."""
    atomic_write_text(out / "recipe.yaml", dump_recipe(recipe))
