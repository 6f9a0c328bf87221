"""Evaluate a detection run: COCO AP on the validation set and a picture of its predictions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc_cli.config import load_recipe
from posenc_cli.runs.checkpoint import load_run_weights
from posenc_cli.runs.device import pick_device
from posenc_cli.runs.evaluation import Evaluated, recipe_file, save_evaluation
from posenc_cli.tasks.detection.train import (
    build_detection_model,
    evaluate_detection,
    load_detection_data,
)


def score_detection_run(
    run_dir: Path, overrides: list[str] = ()
) -> tuple[dict[str, Any], Callable[[Path], None]]:
    """The run's scores, and a function that draws its kept predictions into a PNG (nothing
    when none were kept); nothing is written here."""
    from posenc_cli.tasks.detection.criterion import SetCriterion
    from posenc_cli.tasks.detection.draw import draw_predictions
    from posenc_cli.tasks.detection.matcher import HungarianMatcher

    recipe = load_recipe(recipe_file(run_dir), list(overrides))
    data = load_detection_data(recipe)
    model = build_detection_model(recipe, data.num_classes)
    load_run_weights(run_dir, model)
    device = pick_device(recipe.train.device)
    model.to(device)
    # rank 0 scores alone, while the other ranks of a torchrun sweep wait at a barrier
    criterion = SetCriterion(
        data.num_classes, HungarianMatcher(), eos_coef=recipe.train.eos_coef, across_ranks=False
    )
    scores, (images, predictions, targets) = evaluate_detection(
        model, data, criterion, recipe, device, keep=recipe.eval.pictures
    )
    result = {
        "run": str(run_dir),
        "kind": "detection",
        "encoding": recipe.encoding.name,
        "encoding_params": recipe.encoding.params,
        "sine": recipe.model.sine,
        "seed": recipe.seed,
        "lengths": {"val": scores},  # the key compare reads: one column, the validation set
    }

    def draw(path: Path) -> None:
        if images:
            import torch

            draw_predictions(
                torch.stack(images),
                predictions,
                targets,
                data.class_names,
                path,
                score_threshold=recipe.eval.score_threshold,
            )

    return result, draw


def evaluate_detection_run(
    run_dir: Path, overrides: list[str] = (), write: bool = True
) -> dict[str, Any]:
    result, draw = score_detection_run(run_dir, overrides)
    if write:  # the picture first: a failure there leaves eval.json as it was
        draw(run_dir / "predictions.png")
        save_evaluation(run_dir / "eval.json", result)
    return result


def score(run_dir: Path, overrides: list[str], options: dict[str, Any]) -> Evaluated:
    """`posenc evaluate` of a detection run: COCO AP on the validation set and its pictures."""
    result, draw = score_detection_run(run_dir, overrides)
    scores = result["lengths"]["val"]
    picture = run_dir / "predictions.png"
    return Evaluated(
        result,
        run_dir / "eval.json",
        f"{run_dir}: COCO AP (%) on the validation set",
        list(scores),
        [[f"{v:.2f}" for v in scores.values()]],
        [(picture, draw)],
        note=f"predictions drawn in {picture}",
    )
