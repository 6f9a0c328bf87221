"""Evaluate an image run at other resolutions and on translated copies of its validation set.

At a side other than the trained one, the data set is rebuilt at that side (procedural scenes
are drawn there; photos are resized) and the model reads it as it is: ``learned2d`` resizes its
table, ``rope2d`` and iRPE compute positions for the new grid, a table that cannot stretch
(``swin``, 1D ``learned``) is reported as unable to run. A shift moves every validation image by
that many pixels (``data.shift``), the translation-robustness test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from posenc_cli.config import Recipe, load_recipe
from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import load_run_weights
from posenc_cli.runs.device import pick_device
from posenc_cli.runs.evaluation import Evaluated, recipe_file, save_evaluation
from posenc_cli.tasks.image.train import evaluate_images, image_model_for
from posenc_cli.tasks.pictures import curve_picture


def point_name(size: int, shift: int) -> str:
    """The key of one evaluation: ``32`` or ``32+4`` (side 32 px, shifted 4 px)."""
    return str(size) if shift == 0 else f"{size}+{shift}"


def load_image_run(run_dir: Path, overrides: list[str] = ()) -> tuple[Recipe, Any, Any]:
    from posenc_cli.data.images import build_image_data

    recipe = load_recipe(recipe_file(run_dir), list(overrides))
    data = build_image_data(recipe.data)
    model = image_model_for(recipe, data)
    load_run_weights(run_dir, model, ema=True)
    return recipe, model, data


def evaluate_image_run(
    run_dir: Path,
    overrides: list[str] = (),
    sizes: list[int] | None = None,
    shifts: list[int] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    from posenc_cli.data.images import build_image_data

    if min(sizes or [1]) < 1 or min(shifts or [0]) < 0:
        raise UsageError("--sizes must be positive and --shifts >= 0, e.g. --sizes 32,48")
    recipe, model, data = load_image_run(run_dir, overrides)
    device = pick_device(recipe.train.device)
    model.to(device)
    trained = recipe.data.image_size
    sizes = sizes or list(recipe.eval.sizes) or [trained]
    shifts = shifts or list(recipe.eval.shifts) or [0]
    points: dict[str, Any] = {}
    for size in sizes:
        for shift in shifts:
            cfg = dataclasses.replace(recipe.data, image_size=size, shift=shift)
            val = build_image_data(cfg).val
            loader = DataLoader(val, batch_size=recipe.eval.batch_size)
            try:
                points[point_name(size, shift)] = evaluate_images(model, loader, device)
            except UsageError as err:  # a table that cannot stretch to this grid
                points[point_name(size, shift)] = {"error": str(err)}
    result = {
        "run": str(run_dir),
        "kind": "image",
        "encoding": recipe.encoding.name,
        "encoding_params": recipe.encoding.params,
        "seed": recipe.seed,
        "dataset": recipe.data.dataset,
        "trained_size": trained,
        "lengths": points,  # the key compare reads; here image sides (px) with shifts
    }
    if write:
        save_evaluation(run_dir / "eval.json", result)
    return result


def score(run_dir: Path, overrides: list[str], options: dict[str, Any]) -> Evaluated:
    """`posenc evaluate` of an image run: ``options`` sizes, shifts and out (a curve)."""
    result = evaluate_image_run(
        run_dir, overrides, options["sizes"], options["shifts"], write=False
    )
    rows = []
    for key, r in result["lengths"].items():
        if "error" in r:
            rows.append([key, "cannot run", "", r["error"][:60]])
            continue
        rows.append([key, f"{r['top1']:.2f}", f"{r['top5']:.2f}", f"{r['loss']:.4f}"])
    side = result["trained_size"]
    pictures = []
    if options["out"] is not None:
        curve = curve_picture(result, "top1", f"{run_dir} (trained at {side} px)", (side, side))
        pictures.append((options["out"], curve))
    title = f"{run_dir}: {result['encoding']}, trained at {side} px"
    columns = ["side px + shift", "top-1 %", "top-5 %", "loss"]
    return Evaluated(result, run_dir / "eval.json", title, columns, rows, pictures)
