"""One registry of tasks: what a recipe's ``kind`` names, and everything that differs by it.

The loader, the sweep runner, the commands, compare and profile ask the task, never test the
kind. A task is a folder beside this file: a schema module (its recipe sections, limits and
rules: ``tasks/KIND/schema.py``) plus the functions that train and evaluate its runs, imported on
first use so that reading a recipe does not import every model. Adding a task is that folder
and one ``Task`` here. Backbones (``models/``) and data (``data/``) stay layers of their own:
the profiler and the public API use them without any task.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from posenc_cli.errors import UsageError

DEFAULT_KIND = "text"


def resolve(target: str) -> Any:
    """``"package.module:name"`` -> that object, imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Task:
    """One kind of experiment. Strings name ``module:function`` and are resolved on use."""

    kind: str
    # SECTIONS (its train section has ``device``), DEFAULT_ENCODING, ENCODING_DIMS, validate,
    # build_encoding_once
    schema_module: str
    train: str  # (recipe, out, resume=, console=) -> summary
    evaluate: str  # (run_dir) -> the evaluation written to eval.json
    score: str  # (run_dir, overrides, options) -> runs.evaluation.Evaluated, for `evaluate`
    evaluate_flags: tuple[str, ...]  # the flags of `posenc evaluate` it takes
    evaluate_hint: str  # what it takes instead of the others
    metrics: tuple[str, ...]  # compare's metrics, the first the default
    column: Callable[[str], str]  # compare's column title of an evaluation key
    workload: str  # (recipe, overrides) -> (profiling workload, encodings that fit it)
    profile_unit: str  # what `posenc profile` sizes count: "tokens" (--lengths) or "px" (--sizes)
    prepare: str | None = None  # (runs) -> None: data a sweep's runs would race to write
    # its data tasks that model running text: the report reads them by perplexity, as LM studies
    language_modelling: tuple[str, ...] = ()
    # whether its studies answer the article's multimodal advice (the report ranks them)
    multimodal: bool = False
    extras: dict[str, str] = field(default_factory=dict)  # further task-specific entry points

    @property
    def schema(self) -> ModuleType:
        return importlib.import_module(self.schema_module)

    def call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """Run the entry point ``what`` (``train``, ``evaluate``, a name in ``extras``)."""
        target = self.extras[what] if what in self.extras else getattr(self, what)
        return resolve(target)(*args, **kwargs)


def image_column(key: str) -> str:
    size, _, shift = key.partition("+")
    return f"{size}px" + (f" +{shift}" if shift else "")


TASKS: dict[str, Task] = {
    "text": Task(
        kind="text",
        schema_module="posenc_cli.tasks.text.schema",
        workload="posenc_cli.profiling.workloads:text_workload",
        profile_unit="tokens",
        train="posenc_cli.tasks.text.train:train",
        evaluate="posenc_cli.tasks.text.evaluate:evaluate_run",
        score="posenc_cli.tasks.text.evaluate:score",
        evaluate_flags=("lengths", "shift", "out", "misses", "by_position", "by_count"),
        evaluate_hint="for image runs; a text run takes --lengths, --shift, --misses, "
        "--by-position and (parity) --by-count, e.g. --lengths 16,32",
        metrics=("token_accuracy", "exact_match", "loss", "perplexity"),
        column=lambda key: f"n={key}",
        language_modelling=("text",),
    ),
    "image": Task(
        kind="image",
        schema_module="posenc_cli.tasks.image.schema",
        workload="posenc_cli.profiling.workloads:image_workload",
        profile_unit="px",
        train="posenc_cli.tasks.image.train:train_image",
        evaluate="posenc_cli.tasks.image.evaluate:evaluate_image_run",
        score="posenc_cli.tasks.image.evaluate:score",
        evaluate_flags=("sizes", "shifts", "out"),
        evaluate_hint="for text runs; an image run takes --sizes (sides in px) and --shifts (px), "
        "e.g. --sizes 32,48 --shifts 0,4",
        metrics=("top1", "top5", "loss"),  # columns: image side in px, "+K" for a K px shift
        column=image_column,
        multimodal=True,
    ),
    "detection": Task(
        kind="detection",
        schema_module="posenc_cli.tasks.detection.schema",
        workload="posenc_cli.profiling.workloads:detection_workload",
        profile_unit="px",
        train="posenc_cli.tasks.detection.train:train_detection",
        evaluate="posenc_cli.tasks.detection.evaluate:evaluate_detection_run",
        score="posenc_cli.tasks.detection.evaluate:score",
        evaluate_flags=(),
        evaluate_hint="a detection run takes none of these: it is scored on its validation set "
        "and draws predictions.png in the run directory",
        metrics=("AP", "AP50", "AP75", "APs", "APm", "APl", "loss"),  # COCO, in %
        column=lambda key: key,
        prepare="posenc_cli.tasks.detection.train:prepare_shared_data",
    ),
}


def task_of(kind: str) -> Task:
    if kind not in TASKS:
        raise UsageError(f"unknown kind {kind!r}; valid: {', '.join(TASKS)}")
    return TASKS[kind]


def task_of_run(run_dir: Path) -> Task:
    """The task of a run directory, from its saved recipe's top-level ``kind`` alone: the
    task's own evaluation loads and checks the recipe, once."""
    import yaml

    from posenc_cli.runs.evaluation import recipe_file

    try:
        saved = yaml.safe_load(recipe_file(run_dir).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        saved = None  # the full load that follows says what is wrong with it
    kind = saved.get("kind", DEFAULT_KIND) if isinstance(saved, dict) else DEFAULT_KIND
    return TASKS[kind if isinstance(kind, str) and kind in TASKS else DEFAULT_KIND]
