"""``expand_sweep``: a recipe's grid as one recipe per run, named ``key=value,...``."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Any

from posenc_cli.config.build import build_recipe
from posenc_cli.config.dump import format_value, to_tree
from posenc_cli.config.layers import assignments_layer, dropped, merge
from posenc_cli.config.recipe import EncodingConfig, Recipe
from posenc_cli.config.where import Where
from posenc_cli.encodings import ENCODINGS, user_params


def expand_sweep(recipe: Recipe) -> list[tuple[str, Recipe]]:
    """``[(run name, recipe with sweep=None), ...]`` in grid order (the last key varies fastest);
    one run named ``run`` when there is no sweep."""
    if not recipe.sweep:
        return [("run", dataclasses.replace(recipe, sweep=None, notes=list(recipe.notes)))]
    base = to_tree(recipe)
    keys = list(recipe.sweep)
    runs = []
    for combo in itertools.product(*(recipe.sweep[k] for k in keys)):
        name = ",".join(f"{k}={format_value(v)}" for k, v in zip(keys, combo, strict=True))
        where = Where(recipe.source or "recipe", recipe.kind)
        tree, notes = copy.deepcopy(base), list(recipe.notes)
        layer = assignments_layer(dict(zip(keys, copy.deepcopy(combo), strict=True)))
        merge(tree, layer, f"in sweep run {name}", where, notes)
        drop_swept_strays(tree["encoding"], layer.get("encoding", {}), where, notes)
        runs.append((name, build_recipe(tree, where, notes, recipe.source)))
    return runs


def drop_swept_strays(
    current: dict[str, Any], swept: dict[str, Any], where: Where, notes: list[str]
) -> None:
    """A swept encoding parameter applies only to the runs whose encoding has it."""
    name = current.get("name", EncodingConfig.name)
    if not isinstance(name, str) or name not in ENCODINGS:
        return  # the name's own error comes first
    spec = user_params(name)
    for key in [k for k in swept if k != "name" and k not in spec and k in current]:
        notes.append(dropped(key, current.pop(key), where, name))
