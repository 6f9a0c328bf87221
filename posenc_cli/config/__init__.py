"""YAML recipes -> typed dataclasses: ``extends``, ``KEY=VALUE`` overrides, sweeps, one-line errors.

One module per concern: ``recipe`` (the types), ``shipped`` and ``files`` (finding and reading
recipes), ``layers`` (keys and merging), ``build`` (conversion), ``loader`` (``load_recipe``,
and ``load_sweep`` for the recipe with its runs), ``sweep`` (``expand_sweep``) and ``dump``
(back to YAML), with ``where`` for the errors.

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
  any training starts. ``load_sweep`` returns those runs, so ``posenc train`` trains the runs
  that were checked and never expands the sweep a second time.
"""

from posenc_cli.config.dump import dump_recipe, recipe_to_dict, write_recipe
from posenc_cli.config.loader import load_recipe, load_sweep
from posenc_cli.config.recipe import TOP_KEYS, EncodingConfig, Recipe, Sweep
from posenc_cli.config.shipped import recipes_root, shipped_recipes
from posenc_cli.config.sweep import expand_sweep

__all__ = [
    "TOP_KEYS",
    "EncodingConfig",
    "Recipe",
    "Sweep",
    "dump_recipe",
    "expand_sweep",
    "write_recipe",
    "load_recipe",
    "load_sweep",
    "recipe_to_dict",
    "recipes_root",
    "shipped_recipes",
]
