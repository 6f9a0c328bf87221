"""YAML recipes -> typed dataclasses: ``extends``, ``KEY=VALUE`` overrides, sweeps, one-line errors.

A recipe is a YAML mapping with ``seed``, the sections ``model``, ``encoding``, ``data``,
``train`` and ``eval``, an optional ``sweep`` grid and an optional ``extends``. Every value is
converted by the declared type of its field (PyYAML reads ``3e-4`` as a string) and checked;
any bad input raises a UsageError of one line: ``recipe NAME: KEY: problem and fix``.

Rules (each pinned in tests/test_config.py):

- Layers, first to last: the ``extends`` chain (the deepest base first), the file itself, the
  ``KEY=VALUE`` overrides. Each layer merges into the sections key by key. ``extends`` is a path
  relative to the file that names it, else a shipped recipe short name (``text/base``).
- ``sweep`` merges key by key as well: ``sweep: null`` (or the override ``sweep=null``) removes
  the whole grid, ``sweep.KEY: null`` one axis. A layer that sets a key fixes it: the key leaves
  the grid inherited from earlier layers (``seed=3`` on a recipe that sweeps seeds runs seed 3).
- Encoding parameters belong to the encoding named beside them. When a later layer (a recipe
  that extends, an override, a sweep run) changes ``encoding.name``, the parameters set before
  are kept only where the new encoding has a parameter of that name; the others are dropped and
  ``Recipe.notes`` says so (``dump_recipe`` writes the notes as comments). Parameters written in
  the same layer as the name are checked strictly. A swept encoding parameter applies to the
  runs whose encoding has it; one that no run's encoding has is an error (a typo).
  ``encoding.KEY: null`` removes a parameter, so its default applies.
- ``data.corpus`` is relative to the file that sets it (to the working directory in an
  override) and is stored as an absolute path, so a dumped recipe loads anywhere on the machine.
- Loading validates every run of the sweep, including building each run's encoding once on the
  CPU (under a forked RNG, so the caller's random state is untouched): a bad value fails before
  any training starts.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import posixpath
import re
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml

from posenc_cli.encodings import ENCODINGS, check_params, user_params
from posenc_cli.errors import UsageError
from posenc_cli.params import (
    bounded,
    check_fields,
    close_match,
    convert,
    parse_assignments,
)
from posenc_cli.tasks import DEFAULT_KIND, TASKS, task_of
from posenc_cli.tasks.text.schema import DataConfig, EvalConfig, ModelConfig, TrainConfig

if typing.TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only the annotations need it
    from importlib.resources.abc import Traversable


@dataclass
class EncodingConfig:
    name: str = "rope"  # registry name; 1D encodings only
    params: dict[str, Any] = field(default_factory=dict)  # only the ones set; defaults elsewhere


@dataclass
class Recipe:
    seed: int = bounded(0, lambda v: v >= 0, ">= 0", most=2**32 - 1)
    # the sections of the recipe's kind: tasks/<kind>/schema.py (text is the default)
    model: Any = field(default_factory=ModelConfig)
    encoding: EncodingConfig = field(default_factory=EncodingConfig)
    data: Any = field(default_factory=DataConfig)
    train: Any = field(default_factory=TrainConfig)
    eval: Any = field(default_factory=EvalConfig)
    kind: str = DEFAULT_KIND  # a name of posenc_cli.tasks.TASKS
    sweep: dict[str, list] | None = None  # dotted key -> values; runs = cartesian product
    # provenance, not content: two recipes with the same settings are equal
    source: str = field(default="", compare=False)  # the recipe as named by the user
    notes: list[str] = field(default_factory=list, compare=False)  # dropped encoding params


TOP_KEYS = ("extends", "kind", "seed", "model", "encoding", "data", "train", "eval", "sweep")

Tree = dict[str, Any]  # a recipe before conversion: {"seed": .., "model": {..}, ..., "sweep": ..}


# ----------------------------------------------------------------------------- shipped recipes


def recipes_root() -> Traversable:
    """The shipped recipes: the package ``posenc_cli.recipes``, else ``recipes/`` of a checkout."""
    try:
        return resources.files("posenc_cli.recipes")
    except ModuleNotFoundError:  # a checkout whose install does not map the package yet
        return Path(__file__).resolve().parent.parent / "recipes"


def shipped_recipes() -> dict[str, Traversable]:
    """Short name (path without ``.yaml``, e.g. ``text/extrapolation``) -> file."""
    found: dict[str, Traversable] = {}

    def walk(folder: Traversable, prefix: str) -> None:
        for child in sorted(folder.iterdir(), key=lambda c: c.name):
            if child.is_dir() and not child.name.startswith(("_", ".")):
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".yaml"):
                found[prefix + child.name.removesuffix(".yaml")] = child

    root = recipes_root()
    if root.is_dir():
        walk(root, "")
    return found


# ----------------------------------------------------------------------------- errors


class _Where:
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
        return UsageError(_one_line(f"recipe {self.label}: {key}{at}: {problem}"))

    def converted(self, value: Any, annotation: Any, key: str) -> Any:
        """``convert`` with the message re-worded as ``recipe NAME: KEY: problem``."""
        try:
            return convert(value, annotation, key)
        except UsageError as err:
            raise self.error(key, str(err).removeprefix(f"{key}: ")) from None


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def _valid(options: typing.Iterable[str]) -> str:
    return ", ".join(options) or "none"


# ----------------------------------------------------------------------------- reading files


@dataclass(frozen=True)
class _Source:
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


def _short(ref: str) -> str:
    return ref.removesuffix(".yaml")


def _find_recipe(ref: str) -> _Source:
    """A path if that file exists, else a shipped short name."""
    if Path(ref).is_file():
        return _Source(label=ref, path=Path(ref))
    shipped = shipped_recipes()
    if _short(ref) in shipped:
        return _Source(label=_short(ref), shipped=_short(ref))
    raise UsageError(
        f"recipe {ref}: no such file or shipped recipe{close_match(_short(ref), shipped)}; "
        f"shipped: {_valid(shipped)}"
    )


def _find_parent(ref: Any, child: _Source, where: _Where, origin: str) -> _Source:
    """``extends: REF`` of ``child``: a path relative to it, else a shipped short name."""
    if not isinstance(ref, str) or not ref:
        problem = f"expected a file or shipped recipe name, got {ref!r}"
        raise where.error("extends", problem, origin)
    shipped = shipped_recipes()
    if child.path is not None:
        candidate = child.path.parent / Path(ref).expanduser()
        if candidate.is_file():
            return _Source(label=os.path.normpath(candidate), path=candidate)
    else:  # relative to a shipped recipe means a sibling in the shipped tree
        sibling = _short(posixpath.normpath(posixpath.join(posixpath.dirname(child.shipped), ref)))
        if sibling in shipped:
            return _Source(label=sibling, shipped=sibling)
    if _short(ref) in shipped:
        return _Source(label=_short(ref), shipped=_short(ref))
    raise where.error(
        "extends",
        f"{ref!r} is neither a file next to {child.label} nor a shipped recipe"
        f"{close_match(_short(ref), shipped)}; shipped: {_valid(shipped)}",
        origin,
    )


def _parse_yaml(source: _Source, where: _Where) -> Any:
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
            _one_line(
                f"recipe {where.label}: {at}{line}YAML syntax error ({problem}); "
                "fix the indentation or quoting there"
            )
        ) from None
    except yaml.YAMLError as err:
        raise UsageError(_one_line(f"recipe {where.label}: {at}YAML error ({err})")) from None
    if raw is None:  # nothing but blanks and comments: training defaults would be a surprise
        raise UsageError(
            f"recipe {where.label}: {at}is empty; write its settings (see `posenc train "
            "quickstart --dry-run` for every key) or name a shipped recipe"
        )
    return raw


def _chain(source: _Source, where: _Where, seen: tuple[_Source, ...] = ()) -> list[tuple]:
    """``[(origin, raw layer, folder), ...]`` with the deepest ``extends`` first; a cycle is an
    error. Layers are checked later, once the chain has told the recipe's kind."""
    if source.identity in (s.identity for s in seen):
        loop = " -> ".join(s.label for s in (*seen, source))
        raise UsageError(
            f"recipe {where.label}: extends: cycle {loop}; remove one of these extends"
        )
    origin = "" if source.label == where.label else f"set in {source.label}"
    raw = _parse_yaml(source, where)
    base = source.path.parent if source.path is not None else Path.cwd()
    if not isinstance(raw, dict) or "extends" not in raw:
        return [(origin, raw, base)]
    raw = dict(raw)
    parent = _find_parent(raw.pop("extends"), source, where, origin)
    return [*_chain(parent, where, (*seen, source)), (origin, raw, base)]


def _kind(chain: list[tuple], where: _Where) -> str:
    """The last ``kind`` the chain sets (``DEFAULT_KIND`` if none)."""
    kind, origin = DEFAULT_KIND, ""
    for layer_origin, raw, _ in chain:
        if isinstance(raw, dict) and "kind" in raw:
            kind, origin = raw["kind"], layer_origin
    if kind not in TASKS:
        hint = close_match(str(kind), TASKS)
        raise where.error("kind", f"unknown kind {kind!r}{hint}; valid: {_valid(TASKS)}", origin)
    return kind


def _absolute_corpus(layer: Tree, base: Path) -> None:
    data = layer.get("data") or {}
    corpus = data.get("corpus")
    if isinstance(corpus, str) and corpus:
        data["corpus"] = os.path.abspath(base / Path(corpus).expanduser())


# ----------------------------------------------------------------------------- layers and keys


def _check_layer(raw: Any, origin: str, where: _Where) -> Tree:
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
            raise where.error(key, f"unknown key{hint}; valid: {_valid(TOP_KEYS)}", origin)
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
                _check_key(f"{key}.{sub}", where, origin)
        elif key == "sweep" and value is not None:
            if not isinstance(value, dict):
                raise where.error(
                    key, f"expected a mapping of KEY: [values], got {value!r}", origin
                )
            value = {str(k): v for k, v in value.items()}
            for sub in value:
                if sub.partition(".")[0] in ("sweep", "extends", "kind"):
                    raise where.error(f"sweep.{sub}", f"{sub} cannot be swept", origin)
                _check_key(sub, where, origin, f"sweep.{sub}")
        layer[key] = value
    return layer


def _check_key(dotted: str, where: _Where, origin: str, name: str | None = None) -> None:
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
            raise where.error(name, f"unknown key{hint}; valid: {_valid(fields)}", origin)
        return
    if section in sections or section == "encoding":
        example = f"{section}.{_example(section, sections)}"
        raise where.error(name, f"expected {section}.KEY, for example {example}", origin)
    keys = ["seed", *sections, "encoding"]
    raise where.error(
        name, f"unknown key{close_match(section, keys)}; valid: {_valid(keys)}", origin
    )


def _example(section: str, sections: dict[str, type]) -> str:
    return "name" if section == "encoding" else dataclasses.fields(sections[section])[0].name


def _flat_keys(layer: Tree) -> list[str]:
    """The dotted keys a layer sets, sweep excluded."""
    keys = []
    for key, value in layer.items():
        if key == "seed":
            keys.append(key)
        elif isinstance(value, dict) and key != "sweep":
            keys.extend(f"{key}.{sub}" for sub in value)
    return keys


def _assignments_layer(assignments: dict[str, Any]) -> Tree:
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


def _in_order(assignments: dict[str, Any]) -> list[dict[str, Any]]:
    """Overrides as consecutive layers, split at each whole-``sweep`` assignment, so that
    ``sweep=null sweep.KEY=[..]`` first clears the recipe's grid and then adds one axis."""
    groups: list[dict[str, Any]] = [{}]
    for key, value in assignments.items():
        if key == "sweep":
            groups += [{key: value}, {}]
        else:
            groups[-1][key] = value
    return [group for group in groups if group]


def _merge(tree: Tree, layer: Tree, origin: str, where: _Where, notes: list[str]) -> None:
    """Merge one layer into ``tree`` by the rules in the module docstring."""
    fixed = _flat_keys(layer)
    if tree.get("sweep"):
        for key in fixed:  # a later layer fixes the key: it leaves the inherited grid
            tree["sweep"].pop(key, None)
    for key in fixed:
        where.origins[key] = origin  # "" (the recipe itself) is removed below
    for key, value in layer.items():
        if key == "seed":
            tree["seed"] = value
        elif key == "encoding":
            _merge_encoding(tree["encoding"], value, where, notes)
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


def _merge_encoding(
    current: dict[str, Any], layer: dict[str, Any], where: _Where, notes: list[str]
) -> None:
    """A new name drops the inherited parameters it has no use for; see the module docstring."""
    new = layer.get("name")
    if "name" in layer and new != current.get("name", EncodingConfig.name):
        keep = set(user_params(new)) if isinstance(new, str) and new in ENCODINGS else set()
        keep |= set(layer)  # set again beside the new name: checked strictly, never dropped
        for key in [k for k in current if k != "name" and k not in keep]:
            notes.append(_dropped(key, current.pop(key), where, new))
    for key, value in layer.items():
        if value is None and key != "name":
            current.pop(key, None)  # null removes a parameter: its default applies
        else:
            current[key] = value


def _dropped(key: str, value: Any, where: _Where, name: Any) -> str:
    origin = where.origins.pop(f"encoding.{key}", "")
    at = f" ({origin})" if origin else ""
    return f"encoding.{key}={value!r}{at} dropped: encoding {name!r} has no such parameter"


# ----------------------------------------------------------------------------- building


def _empty_tree(sections: dict[str, type]) -> Tree:
    return {"seed": 0, "encoding": {}, "sweep": None, **{name: {} for name in sections}}


def _section(cls: type, values: dict[str, Any], name: str, where: _Where) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {
        key: where.converted(value, hints[key], f"{name}.{key}") for key, value in values.items()
    }
    return cls(**kwargs)


def _encoding(values: dict[str, Any], where: _Where) -> EncodingConfig:
    schema = task_of(where.kind).schema
    name = where.converted(values.get("name", schema.DEFAULT_ENCODING), str, "encoding.name")
    valid = [n for n, cls in ENCODINGS.items() if cls.dims in schema.ENCODING_DIMS]
    if name not in ENCODINGS:
        raise where.error(
            "encoding.name",
            f"unknown encoding {name!r}{close_match(name, valid)}; valid: {_valid(valid)}",
        )
    if ENCODINGS[name].dims not in schema.ENCODING_DIMS:
        raise where.error(
            "encoding.name",
            f"{name!r} is a 2D (image grid) encoding; {where.kind} tasks need a 1D one: "
            f"{_valid(valid)}",
        )
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


def _key_type(dotted: str, sections: dict[str, type]) -> Any:
    """The declared type of a dotted key; ``Any`` for encoding parameters (name-dependent)."""
    section, _, rest = dotted.partition(".")
    if section == "seed":
        return int
    if section == "encoding":
        return str if rest == "name" else Any
    return typing.get_type_hints(sections[section])[rest]


def _sweep(grid: dict[str, Any] | None, where: _Where) -> dict[str, list] | None:
    if not grid:
        return None
    out = {}
    for key, values in grid.items():
        where_key = f"sweep.{key}"
        if not isinstance(values, list) or not values:
            raise where.error(where_key, f"expected a non-empty list of values, got {values!r}")
        declared = _key_type(key, where.sections)
        # a list-valued setting is swept over lists: [[8, 16], [32]]
        converted = [where.converted(v, declared, where_key) for v in values]
        names = [_format(v) for v in converted]
        for i, text in enumerate(names):
            if text in names[:i]:
                raise where.error(where_key, f"value {values[i]!r} is listed twice; list it once")
        out[key] = converted
    return out


def _build(tree: Tree, where: _Where, notes: list[str], source: str) -> Recipe:
    sections = where.sections
    recipe = Recipe(
        seed=where.converted(tree["seed"], int, "seed"),
        model=_section(sections["model"], tree["model"], "model", where),
        encoding=_encoding(tree["encoding"], where),
        data=_section(sections["data"], tree["data"], "data", where),
        train=_section(sections["train"], tree["train"], "train", where),
        eval=_section(sections["eval"], tree["eval"], "eval", where),
        kind=where.kind,
        sweep=_sweep(tree.get("sweep"), where),
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


# ----------------------------------------------------------------------------- public API


def load_recipe(ref: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Load a recipe file or shipped short name, apply ``extends`` and ``KEY=VALUE`` overrides,
    convert and validate everything (every sweep run too); raises a one-line UsageError."""
    source = _find_recipe(str(ref))
    where = _Where(source.label)
    chain = _chain(source, where)
    where.kind = _kind(chain, where)
    tree, notes = _empty_tree(where.sections), []
    for origin, raw, base in chain:
        layer = _check_layer(raw, origin, where)
        layer.pop("kind", None)
        _absolute_corpus(layer, base)
        _merge(tree, layer, origin, where, notes)
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
                _check_key(key, where, origin)
        for group in _in_order(assignments):
            layer = _check_layer(_assignments_layer(group), origin, where)
            _absolute_corpus(layer, Path.cwd())
            _merge(tree, layer, origin, where, notes)
    recipe = _build(tree, where, notes, source.label)
    _check_swept_params(recipe, expand_sweep(recipe), where)  # builds and checks every run
    return recipe


def _check_swept_params(recipe: Recipe, runs: list[tuple[str, Recipe]], where: _Where) -> None:
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


def expand_sweep(recipe: Recipe) -> list[tuple[str, Recipe]]:
    """``[(run name, recipe with sweep=None), ...]`` in grid order (the last key varies fastest);
    one run named ``run`` when there is no sweep."""
    if not recipe.sweep:
        return [("run", dataclasses.replace(recipe, sweep=None, notes=list(recipe.notes)))]
    base = _to_tree(recipe)
    keys = list(recipe.sweep)
    runs = []
    for combo in itertools.product(*(recipe.sweep[k] for k in keys)):
        name = ",".join(f"{k}={_format(v)}" for k, v in zip(keys, combo, strict=True))
        where = _Where(recipe.source or "recipe", recipe.kind)
        tree, notes = copy.deepcopy(base), list(recipe.notes)
        layer = _assignments_layer(dict(zip(keys, copy.deepcopy(combo), strict=True)))
        _merge(tree, layer, f"in sweep run {name}", where, notes)
        _drop_swept_strays(tree["encoding"], layer.get("encoding", {}), where, notes)
        runs.append((name, _build(tree, where, notes, recipe.source)))
    return runs


def _drop_swept_strays(
    current: dict[str, Any], swept: dict[str, Any], where: _Where, notes: list[str]
) -> None:
    """A swept encoding parameter applies only to the runs whose encoding has it."""
    name = current.get("name", EncodingConfig.name)
    if not isinstance(name, str) or name not in ENCODINGS:
        return  # the name's own error comes first
    spec = user_params(name)
    for key in [k for k in swept if k != "name" and k not in spec and k in current]:
        notes.append(_dropped(key, current.pop(key), where, name))


def _format(value: Any) -> str:
    """A value as it appears in a run name (which is also a folder name)."""
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, list | tuple):
        text = "_".join(_format(v) for v in value)
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def _to_tree(recipe: Recipe) -> Tree:
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


class _Dumper(yaml.SafeDumper):
    """Lists in flow style (``[5, 20]``), mappings in block style."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, True)
)


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML; ``load_recipe`` of the text gives an equal Recipe."""
    header = [f"# resolved recipe from {recipe.source or 'defaults'}"]
    header += [f"# note: {note}" for note in recipe.notes]
    body = yaml.dump(recipe_to_dict(recipe), Dumper=_Dumper, sort_keys=False)
    return "\n".join(_one_line(line) for line in header) + "\n" + body
