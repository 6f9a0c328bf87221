"""Evaluate a detection run: COCO AP on the validation set and a picture of its predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc_cli.checkpoint import atomic_write_json, load_checkpoint
from posenc_cli.config import load_recipe
from posenc_cli.train import pick_device
from posenc_cli.train_detection import (
    build_detection_model,
    evaluate_detection,
    load_detection_data,
)


def evaluate_detection_run(
    run_dir: Path, overrides: list[str] = (), write: bool = True
) -> dict[str, Any]:
    from posenc_cli.detection.criterion import SetCriterion
    from posenc_cli.detection.draw import draw_predictions
    from posenc_cli.detection.matcher import HungarianMatcher

    recipe = load_recipe(run_dir / "recipe.yaml", list(overrides))
    data = load_detection_data(recipe)
    model = build_detection_model(recipe, data.num_classes)
    best = run_dir / "best.pt"
    model.load_state_dict(load_checkpoint(best if best.is_file() else run_dir / "last.pt")["model"])
    device = pick_device(recipe.train.device)
    model.to(device)
    criterion = SetCriterion(data.num_classes, HungarianMatcher(), eos_coef=recipe.train.eos_coef)
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
    if write:
        atomic_write_json(run_dir / "eval.json", result)
        if images:
            import torch

            draw_predictions(
                torch.stack(images),
                predictions,
                targets,
                data.class_names,
                run_dir / "predictions.png",
                score_threshold=recipe.eval.score_threshold,
            )
    return result
