"""``load_sweep`` and ``load_recipe``: files, layers and overrides merged, built and validated,
every sweep run included. The runs are built here once; ``load_sweep`` hands them on, so the
sweep runner trains what was checked instead of building every run again."""

from __future__ import annotations

import typing
from pathlib import Path

from posenc_cli.config.build import build_recipe, empty_tree
from posenc_cli.config.files import absolute_corpus, chain_kind, extends_chain, find_recipe
from posenc_cli.config.layers import assignments_layer, check_key, check_layer, in_order, merge
from posenc_cli.config.recipe import Recipe, Sweep
from posenc_cli.config.sweep import expand_sweep
from posenc_cli.config.where import Where
from posenc_cli.encodings import user_params
from posenc_cli.errors import UsageError
from posenc_cli.params import (
    close_match,
    parse_assignments,
)


def load_recipe(ref: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Load a recipe file or shipped short name, apply ``extends`` and ``KEY=VALUE`` overrides,
    convert and validate everything (every sweep run too); raises a one-line UsageError."""
    return load_sweep(ref, overrides).recipe


def load_sweep(ref: str | Path, overrides: typing.Sequence[str] = ()) -> Sweep:
    """``load_recipe``'s recipe together with its runs, as built to validate them."""
    source = find_recipe(str(ref))
    where = Where(source.label)
    chain = extends_chain(source, where)
    where.kind = chain_kind(chain, where)
    tree, notes = empty_tree(where.sections), []
    for origin, raw, base in chain:
        layer = check_layer(raw, origin, where)
        layer.pop("kind", None)
        absolute_corpus(layer, base)
        merge(tree, layer, origin, where, notes)
    if overrides:
        try:
            assignments = parse_assignments(list(overrides))
        except UsageError as err:
            raise UsageError(f"recipe {source.label}: {err}") from None
        origin = "set by an override"
        for key in assignments:
            if key in ("extends", "kind"):
                raise where.error(key, "cannot be overridden; write a recipe that extends", origin)
            if key.partition(".")[0] != "sweep":
                check_key(key, where, origin)
        for group in in_order(assignments):
            layer = check_layer(assignments_layer(group), origin, where)
            absolute_corpus(layer, Path.cwd())
            merge(tree, layer, origin, where, notes)
    recipe = build_recipe(tree, where, notes, source.label)
    runs = expand_sweep(recipe)  # builds and checks every run
    check_swept_params(recipe, runs, where)
    return Sweep(recipe, runs)


def check_swept_params(recipe: Recipe, runs: list[tuple[str, Recipe]], where: Where) -> None:
    """A swept encoding parameter that no run keeps is a typo, not a rule at work."""
    used = sorted({run.encoding.name for _, run in runs})
    for key in recipe.sweep or {}:
        param = key.removeprefix("encoding.")
        if key == param or param == "name":
            continue
        if not any(param in run.encoding.params for _, run in runs):
            names = set().union(*(user_params(n) for n in used))
            raise where.error(
                f"sweep.{key}",
                f"no encoding of this sweep ({', '.join(used)}) has parameter "
                f"{param!r}{close_match(param, names)}; remove the axis with sweep.{key}=null",
            )
