"""The typed recipe: its sections (the kind's schema) and the encoding; what a loaded recipe is,
and a loaded sweep (the recipe with its runs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posenc_cli.params import (
    bounded,
)
from posenc_cli.tasks import DEFAULT_KIND
from posenc_cli.tasks.text.schema import DataConfig, EvalConfig, ModelConfig, TrainConfig


@dataclass
class EncodingConfig:
    name: str = "rope"  # registry name; the task says which dims it takes (ENCODING_DIMS)
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


@dataclass(frozen=True)
class Sweep:
    """A loaded recipe and its runs, each run built and validated once, by the loader."""

    recipe: Recipe
    runs: list[tuple[str, Recipe]]  # (run name, its recipe with sweep=None), in grid order


TOP_KEYS = ("extends", "kind", "seed", "model", "encoding", "data", "train", "eval", "sweep")

Tree = dict[str, Any]  # a recipe before conversion: {"seed": .., "model": {..}, ..., "sweep": ..}
