"""A recipe, its sweep expanded, each run trained then evaluated at the recipe's lengths.

With ``jobs > 1`` the runs of a sweep go to that many worker processes, each with an equal
share of the CPU threads: on a small machine two single-threaded runs side by side finish a
sweep sooner than one two-threaded run after another (small models use a second thread poorly).
Data a sweep writes to disk (the detection shapes set) is written once, before the workers start.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
from rich.console import Console

from posenc_cli.checkpoint import atomic_write_json
from posenc_cli.config import Recipe, expand_sweep
from posenc_cli.distributed import is_main_process
from posenc_cli.errors import UsageError


def default_out(recipe: Recipe) -> Path:
    name = Path(recipe.source).with_suffix("").name if recipe.source else "run"
    return Path("runs") / name


def train_and_evaluate(run: Recipe, run_dir: Path, resume: bool, console: Console) -> None:
    """One run of any kind: train into ``run_dir``, then evaluate it there."""
    if run.kind == "detection":
        from posenc_cli.evaluate_detection import evaluate_detection_run
        from posenc_cli.train_detection import train_detection

        train_detection(run, run_dir, resume=resume, console=console)
        evaluate = evaluate_detection_run
    elif run.kind == "image":
        from posenc_cli.evaluate_image import evaluate_image_run
        from posenc_cli.train_image import train_image

        train_image(run, run_dir, resume=resume, console=console)
        evaluate = evaluate_image_run
    else:
        from posenc_cli.evaluate import evaluate_run
        from posenc_cli.train import train

        train(run, run_dir, resume=resume, console=console)
        evaluate = evaluate_run
    if is_main_process():
        evaluate(run_dir)


def run_recipe(
    recipe: Recipe, out: Path | None, resume: bool, console: Console, jobs: int = 1
) -> list[Path]:
    """Train (and evaluate) every run of ``recipe``; returns the run directories."""
    runs = expand_sweep(recipe)
    base = out or default_out(recipe)
    dirs = [base if len(runs) == 1 else base / name for name, _ in runs]
    todo = []
    for i, ((name, run), run_dir) in enumerate(zip(runs, dirs, strict=True), 1):
        if resume and (run_dir / "summary.json").is_file():
            console.print(f"[dim]{run_dir}: finished earlier, kept as it is[/]")
        else:
            todo.append((f"run {i}/{len(runs)} {name}", run, run_dir))
    if jobs > 1 and len(todo) > 1:
        run_in_workers(todo, jobs, resume, console)
    else:
        for title, run, run_dir in todo:
            if len(runs) > 1:
                console.print(f"[bold]{title}[/]")
            train_and_evaluate(run, run_dir, resume, console)
    if len(runs) > 1 and is_main_process():
        atomic_write_json(
            base / "sweep.json", {"recipe": recipe.source, "runs": [d.name for d in dirs]}
        )
    return dirs


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give a number of worker processes >= 1")
    if jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError(
            "--jobs runs a sweep in separate processes and cannot be combined with torchrun; "
            "drop --jobs, or run without torchrun"
        )


def prepare_shared_data(runs: list[Recipe]) -> None:
    """Write what the runs would otherwise race to write: each detection shapes set, once."""
    written = set()
    for run in runs:
        if run.kind == "detection" and run.data.shapes_images > 0:
            from posenc_cli.train_detection import load_detection_data

            key = (run.data.root, run.data.shapes_images, run.data.shapes_seed)
            if key not in written:
                load_detection_data(run)
                written.add(key)


def _worker(run: Recipe, run_dir: Path, resume: bool, threads: int) -> str:
    torch.set_num_threads(threads)
    train_and_evaluate(run, run_dir, resume, Console(stderr=True, quiet=True))
    return run_dir.name


def run_in_workers(todo: list[tuple[str, Recipe, Path]], jobs: int, resume: bool, console) -> None:
    """Runs in ``jobs`` spawned processes; the first failure stops the sweep and is raised."""
    from posenc_cli.train import progress_bar

    prepare_shared_data([run for _, run, _ in todo])
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    console.print(f"{len(todo)} runs in {jobs} processes, {threads} thread(s) each")
    progress = progress_bar(console, True)
    with progress, ProcessPoolExecutor(jobs, mp_context=context) as pool:
        bar = progress.add_task("sweep", total=len(todo), stats="")
        pending = {pool.submit(_worker, run, run_dir, resume, threads) for _, run, run_dir in todo}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    name = future.result()  # re-raises a worker's error here
                    progress.update(bar, advance=1, stats=f"finished {name}")
        except BaseException:
            for future in pending:
                future.cancel()
            raise
