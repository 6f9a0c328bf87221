"""Layers and keys: each layer's keys checked by name, overrides as a layer, merging in order
(``sweep`` and encoding parameters by the rules in the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc_cli.config.recipe import TOP_KEYS, EncodingConfig, Tree
from posenc_cli.config.where import Where, valid_list
from posenc_cli.encodings import ENCODINGS, user_params
from posenc_cli.errors import UsageError
from posenc_cli.params import (
    close_match,
)


def check_layer(raw: Any, origin: str, where: Where) -> Tree:
    """Check a layer's keys (not its values) and give each section as a dict."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(
            f"recipe {where.label}: expected a mapping of {', '.join(TOP_KEYS)}, "
            f"got {type(raw).__name__}"
        )
    layer: Tree = {}
    for key, value in raw.items():
        key = str(key)
        if key not in TOP_KEYS:
            hint = close_match(key, TOP_KEYS)
            raise where.error(key, f"unknown key{hint}; valid: {valid_list(TOP_KEYS)}", origin)
        if key in where.sections or key == "encoding":
            value = {} if value is None else value
            if not isinstance(value, dict):
                raise where.error(
                    key, f"expected a mapping of {key} settings, got {value!r}", origin
                )
            for sub in value:
                if isinstance(sub, bool):  # YAML 1.1 reads on/off/yes/no as booleans
                    raise where.error(
                        f"{key}.{sub}",
                        'YAML read this key as a boolean; quote it, e.g. "on": qk',
                        origin,
                    )
            value = {str(k): v for k, v in value.items()}
            for sub in value:
                check_key(f"{key}.{sub}", where, origin)
        elif key == "sweep" and value is not None:
            if not isinstance(value, dict):
                raise where.error(
                    key, f"expected a mapping of KEY: [values], got {value!r}", origin
                )
            value = {str(k): v for k, v in value.items()}
            for sub in value:
                if sub.partition(".")[0] in ("sweep", "extends", "kind"):
                    raise where.error(f"sweep.{sub}", f"{sub} cannot be swept", origin)
                check_key(sub, where, origin, f"sweep.{sub}")
        layer[key] = value
    return layer


def check_key(dotted: str, where: Where, origin: str, name: str | None = None) -> None:
    """``dotted`` names a setting (``seed``, ``model.dim``, ``encoding.ANY``); else an error."""
    name = name or dotted
    section, _, rest = dotted.partition(".")
    if section in ("seed", "kind") and not rest:
        return
    sections = where.sections
    if section == "encoding" and rest and "." not in rest:
        return  # encoding parameters are checked against the final encoding name
    if section in sections and rest:
        fields = [f.name for f in dataclasses.fields(sections[section])]
        if rest not in fields:
            hint = close_match(rest, fields)
            raise where.error(name, f"unknown key{hint}; valid: {valid_list(fields)}", origin)
        return
    if section in sections or section == "encoding":
        example = f"{section}.{example_key(section, sections)}"
        raise where.error(name, f"expected {section}.KEY, for example {example}", origin)
    keys = ["seed", *sections, "encoding"]
    raise where.error(
        name, f"unknown key{close_match(section, keys)}; valid: {valid_list(keys)}", origin
    )


def example_key(section: str, sections: dict[str, type]) -> str:
    return "name" if section == "encoding" else dataclasses.fields(sections[section])[0].name


def flat_keys(layer: Tree) -> list[str]:
    """The dotted keys a layer sets, sweep excluded."""
    keys = []
    for key, value in layer.items():
        if key == "seed":
            keys.append(key)
        elif isinstance(value, dict) and key != "sweep":
            keys.extend(f"{key}.{sub}" for sub in value)
    return keys


def assignments_layer(assignments: dict[str, Any]) -> Tree:
    """``{"train.lr": x, "sweep.seed": [..]}`` -> a nested layer (keys already checked)."""
    layer: Tree = {}
    for key, value in assignments.items():
        top, _, rest = key.partition(".")
        if not rest:
            layer[top] = value
        elif top == "sweep":
            if not isinstance(layer.get("sweep"), dict):
                layer["sweep"] = {}
            layer["sweep"][rest] = value
        else:
            layer.setdefault(top, {})[rest] = value
    return layer


def in_order(assignments: dict[str, Any]) -> list[dict[str, Any]]:
    """Overrides as consecutive layers, split at each whole-``sweep`` assignment, so that
    ``sweep=null sweep.KEY=[..]`` first clears the recipe's grid and then adds one axis."""
    groups: list[dict[str, Any]] = [{}]
    for key, value in assignments.items():
        if key == "sweep":
            groups += [{key: value}, {}]
        else:
            groups[-1][key] = value
    return [group for group in groups if group]


def merge(tree: Tree, layer: Tree, origin: str, where: Where, notes: list[str]) -> None:
    """Merge one layer into ``tree`` by the rules in the module docstring."""
    fixed = flat_keys(layer)
    if tree.get("sweep"):
        for key in fixed:  # a later layer fixes the key: it leaves the inherited grid
            tree["sweep"].pop(key, None)
    for key in fixed:
        where.origins[key] = origin  # "" (the recipe itself) is removed below
    for key, value in layer.items():
        if key == "seed":
            tree["seed"] = value
        elif key == "encoding":
            merge_encoding(tree["encoding"], value, where, notes)
        elif isinstance(value, dict) and key != "sweep":  # a section
            tree[key].update(value)
        elif key == "sweep":
            if value is None:
                tree["sweep"] = None
                continue
            grid = dict(tree.get("sweep") or {})
            for axis, values in value.items():
                where.origins[f"sweep.{axis}"] = origin
                if values is None:
                    grid.pop(axis, None)
                else:
                    grid[axis] = values
            tree["sweep"] = grid
    for key in [k for k, v in where.origins.items() if not v]:
        where.origins.pop(key)


def merge_encoding(
    current: dict[str, Any], layer: dict[str, Any], where: Where, notes: list[str]
) -> None:
    """A new name drops the inherited parameters it has no use for; see the module docstring."""
    new = layer.get("name")
    if "name" in layer and new != current.get("name", EncodingConfig.name):
        keep = set(user_params(new)) if isinstance(new, str) and new in ENCODINGS else set()
        keep |= set(layer)  # set again beside the new name: checked strictly, never dropped
        for key in [k for k in current if k != "name" and k not in keep]:
            notes.append(dropped(key, current.pop(key), where, new))
    for key, value in layer.items():
        if value is None and key != "name":
            current.pop(key, None)  # null removes a parameter: its default applies
        else:
            current[key] = value


def dropped(key: str, value: Any, where: Where, name: Any) -> str:
    origin = where.origins.pop(f"encoding.{key}", "")
    at = f" ({origin})" if origin else ""
    return f"encoding.{key}={value!r}{at} dropped: encoding {name!r} has no such parameter"
