"""A recipe, its sweep expanded, each run trained then evaluated at the recipe's lengths."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from posenc_cli.checkpoint import atomic_write_json
from posenc_cli.config import Recipe, expand_sweep
from posenc_cli.distributed import is_main_process
from posenc_cli.evaluate import evaluate_run
from posenc_cli.train import train


def default_out(recipe: Recipe) -> Path:
    name = Path(recipe.source).with_suffix("").name if recipe.source else "run"
    return Path("runs") / name


def run_recipe(recipe: Recipe, out: Path | None, resume: bool, console: Console) -> list[Path]:
    """Train (and evaluate) every run of ``recipe``; returns the run directories."""
    runs = expand_sweep(recipe)
    base = out or default_out(recipe)
    dirs = []
    for i, (name, run) in enumerate(runs, 1):
        run_dir = base if len(runs) == 1 else base / name
        dirs.append(run_dir)
        if resume and (run_dir / "summary.json").is_file():
            console.print(f"[dim]{run_dir}: finished earlier, kept as it is[/]")
            continue
        if len(runs) > 1:
            console.print(f"[bold]run {i}/{len(runs)}[/] {name}")
        if run.kind == "detection":
            from posenc_cli.evaluate_detection import evaluate_detection_run
            from posenc_cli.train_detection import train_detection

            train_detection(run, run_dir, resume=resume, console=console)
            if is_main_process():
                evaluate_detection_run(run_dir)
            continue
        if run.kind == "image":
            from posenc_cli.evaluate_image import evaluate_image_run
            from posenc_cli.train_image import train_image

            train_image(run, run_dir, resume=resume, console=console)
            if is_main_process():
                evaluate_image_run(run_dir)
            continue
        train(run, run_dir, resume=resume, console=console)
        if is_main_process():
            evaluate_run(run_dir)
    if len(runs) > 1 and is_main_process():
        atomic_write_json(
            base / "sweep.json", {"recipe": recipe.source, "runs": [d.name for d in dirs]}
        )
    return dirs
