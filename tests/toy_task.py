"""A fourth task, written only in this file and registered by one line (``tests/test_tasks.py``):
proof that the loader, the sweep runner, evaluate and compare serve any task the registry names.

The "model" guesses a constant; its score is a made-up number derived from the seed, so a test
can recompute every figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.config import write_recipe
from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import atomic_write_json
from posenc_cli.runs.directory import prepare_directory
from posenc_cli.runs.evaluation import Evaluated

DEFAULT_ENCODING = "none"
ENCODING_DIMS = (1,)


@dataclass
class ToyModel:
    width: int = 4


@dataclass
class ToyData:
    size: int = 10


@dataclass
class ToyTrain:
    steps: int = 3
    device: str = "cpu"  # every task's train section says where it runs


@dataclass
class ToyEval:
    points: list[int] = field(default_factory=lambda: [1, 2])


SECTIONS = {"model": ToyModel, "data": ToyData, "train": ToyTrain, "eval": ToyEval}


def validate(recipe: Any, error) -> None:
    if recipe.train.steps < 1:
        raise error("train.steps", f"must be >= 1, got {recipe.train.steps}")


def build_encoding_once(recipe: Any) -> None:
    if recipe.encoding.params:
        raise UsageError("the toy task takes no encoding parameters")


def figure(seed: int, point: int) -> float:
    return 0.5 + 0.01 * seed + 0.1 * point


def train(recipe: Any, out: Path, resume: bool = False, console: Any = None) -> dict[str, Any]:
    prepare_directory(out, resume)
    write_recipe(out, recipe)
    summary = {"kind": "toy", "seed": recipe.seed, "final": {"steps": recipe.train.steps}}
    atomic_write_json(out / "summary.json", summary)
    return summary


def result(run_dir: Path) -> dict[str, Any]:
    from posenc_cli.config import load_recipe

    recipe = load_recipe(run_dir / "recipe.yaml")
    points = {str(p): {"score": figure(recipe.seed, p)} for p in recipe.eval.points}
    return {"kind": "toy", "encoding": recipe.encoding.name, "encoding_params": {},
            "seed": recipe.seed, "lengths": points}  # fmt: skip


def evaluate(run_dir: Path) -> dict[str, Any]:
    atomic_write_json(run_dir / "eval.json", result(run_dir))
    return result(run_dir)


def score(run_dir: Path, overrides: list[str], options: dict[str, Any]) -> Evaluated:
    found = result(run_dir)
    rows = [[key, f"{cell['score']:.2f}"] for key, cell in found["lengths"].items()]
    return Evaluated(found, run_dir / "eval.json", f"{run_dir}: toy", ["point", "score"], rows)
