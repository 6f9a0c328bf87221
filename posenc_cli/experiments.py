"""A recipe, its sweep expanded, each run trained then evaluated at the recipe's lengths.

With ``jobs > 1`` the runs of a sweep go to that many worker processes, each with an equal
share of the CPU threads: on a small machine two single-threaded runs side by side finish a
sweep sooner than one two-threaded run after another (small models use a second thread poorly).
Data a sweep writes to disk (the detection shapes set) is written once, before the workers start.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import nullcontext
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from posenc_cli.config import Recipe, Sweep, load_recipe, recipe_to_dict
from posenc_cli.errors import UsageError
from posenc_cli.runs import distributed
from posenc_cli.runs.checkpoint import atomic_write_json
from posenc_cli.runs.device import pick_device
from posenc_cli.runs.directory import DIVERGED, TrainingStopped, record_divergence
from posenc_cli.runs.distributed import World, is_main_process
from posenc_cli.runs.lock import hold
from posenc_cli.runs.terminate import Terminated, sigterm_as_interrupt
from posenc_cli.tasks import task_of


def default_out(recipe: Recipe) -> Path:
    name = Path(recipe.source).with_suffix("").name if recipe.source else "run"
    return Path("runs") / name


def train_and_evaluate(run: Recipe, run_dir: Path, resume: bool, console: Console) -> None:
    """One run of any kind: train into ``run_dir``, then evaluate it there (rank 0 holding the
    folder's lock throughout)."""
    with hold(run_dir) if is_main_process() else nullcontext():
        train_then_evaluate(run, run_dir, resume, console)
    world_of(run).barrier()  # the next run starts together on every rank


def train_then_evaluate(run: Recipe, run_dir: Path, resume: bool, console: Console) -> None:
    task = task_of(run.kind)
    try:
        task.call("train", run, run_dir, resume=resume, console=console)
    except TrainingStopped as err:
        if is_main_process():
            record_divergence(run, run_dir, str(err))
        raise
    if is_main_process():
        task.call("evaluate", run_dir)


def run_recipe(
    sweep: Sweep, out: Path | None, resume: bool, console: Console, jobs: int = 1
) -> list[Path]:
    """Train (and evaluate) every run of ``sweep``, as the loader built them; returns the run
    directories."""
    recipe, runs = sweep.recipe, sweep.runs
    base = out or default_out(recipe)
    world = world_of(recipe)
    if not world.main:  # rank 0 reports and writes; the others train in step with it
        console = Console(stderr=True, quiet=True)
    with hold(base) if world.main else nullcontext():
        dirs = [base if len(runs) == 1 else base / name for name, _ in runs]
        todo = plan_runs(runs, dirs, resume, console)
        world.barrier()  # every rank has read the directories before rank 0 writes any
        if jobs > 1 and len(todo) > 1:
            diverged = run_in_workers(todo, jobs, resume, console)
        else:
            diverged = []
            for title, run, run_dir in todo:
                if len(runs) > 1:
                    console.print(f"[bold]{escape(title)}[/]")
                try:
                    train_and_evaluate(run, run_dir, resume, console)
                except TrainingStopped as err:
                    if len(runs) == 1:
                        raise
                    diverged.append(run_dir)
                    console.print(f"[yellow]{escape(str(err))}; the sweep goes on[/]")
        if diverged and world.main:
            names = ", ".join(d.name for d in diverged)
            console.print(
                f"[yellow]{len(diverged)} of {len(runs)} runs diverged ({escape(names)}); each "
                f"folder holds {DIVERGED}, and compare counts them per encoding[/]",
                soft_wrap=True,
            )
        if len(runs) > 1 and world.main:
            atomic_write_json(
                base / "sweep.json", {"recipe": recipe.source, "runs": [d.name for d in dirs]}
            )
    return dirs


def plan_runs(
    runs: list[tuple[str, Recipe]], dirs: list[Path], resume: bool, console: Console
) -> list[tuple[str, Recipe, Path]]:
    """The runs still to train. ``--resume`` keeps finished runs (saying which of the new
    settings it ignored for them) and refuses to go on with a run under settings other than
    its own: the run would be relabelled while its checkpoint holds the old training."""
    todo, refused = [], []
    for i, ((name, run), run_dir) in enumerate(zip(runs, dirs, strict=True), 1):
        changes = recipe_changes(run, run_dir) if resume else []
        ended = "finished" if (run_dir / "summary.json").is_file() else None
        if (run_dir / DIVERGED).is_file():  # it would diverge again: it draws the same batches
            ended = "diverged"
        if resume and ended:
            ignored = f"; ignored for it: {', '.join(changes)}" if changes else ""
            kept = escape(f"{run_dir}: {ended} earlier, kept as it is{ignored}")
            console.print(f"[dim]{kept}[/]", soft_wrap=True)
            continue
        if changes:
            refused.append((run_dir, changes))
        todo.append((f"run {i}/{len(runs)} {name}", run, run_dir))
    if refused:
        run_dir, changes = refused[0]
        more = f" (and {len(refused) - 1} more runs)" if len(refused) > 1 else ""
        raise UsageError(
            f"--resume: {run_dir}{more} was trained with other settings: {', '.join(changes)}; "
            "resume it with its own recipe (drop the overrides that differ) or train into "
            "another --out"
        )
    return todo


# where a run goes on, not what it computes: these may change when it resumes
FREE_ON_RESUME = ("train.device", "train.workers")


def recipe_changes(run: Recipe, run_dir: Path) -> list[str]:
    """The settings in which ``run`` differs from the recipe ``run_dir`` was trained with, as
    ``KEY (run: OLD, now: NEW)``; none when the folder holds no recipe yet."""
    saved = run_dir / "recipe.yaml"
    if not saved.is_file():
        return []
    before = flat_settings(recipe_to_dict(load_recipe(saved)))
    now = flat_settings(recipe_to_dict(run))
    keys = [k for k in dict.fromkeys([*before, *now]) if k not in FREE_ON_RESUME]
    return [
        f"{k} (run: {before.get(k, 'unset')}, now: {now.get(k, 'unset')})"
        for k in keys
        if before.get(k) != now.get(k)
    ]


def flat_settings(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def world_of(recipe: Recipe) -> World:
    """This process's world (one process group for every run of a sweep)."""
    return distributed.start(pick_device(recipe.train.device))


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give a number of worker processes >= 1")
    if jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError(
            "--jobs runs a sweep in separate processes and cannot be combined with torchrun; "
            "drop --jobs, or run without torchrun"
        )


def prepare_shared_data(runs: list[Recipe]) -> None:
    """Write what the runs would otherwise race to write, as each task says (the shapes set)."""
    for kind in dict.fromkeys(run.kind for run in runs):
        task = task_of(kind)
        if task.prepare is not None:
            task.call("prepare", [run for run in runs if run.kind == kind])


def _worker(run: Recipe, run_dir: Path, resume: bool, threads: int) -> tuple[str, str | None]:
    """The run's name, and why it diverged if it did (a result of the sweep, not a failure)."""
    torch.set_num_threads(threads)
    with sigterm_as_interrupt():
        try:
            train_and_evaluate(run, run_dir, resume, Console(stderr=True, quiet=True))
        except TrainingStopped as err:
            return run_dir.name, str(err)
        except (Terminated, KeyboardInterrupt) as err:
            # The run has saved its checkpoint. Leave the pool instead of returning to it: a
            # worker that returned would start the run already queued to it, so a stopped sweep
            # went on training (tests/test_reliability.py).
            os._exit(143 if isinstance(err, Terminated) else 130)
    return run_dir.name, None


def run_in_workers(
    todo: list[tuple[str, Recipe, Path]], jobs: int, resume: bool, console
) -> list[Path]:
    """Runs in ``jobs`` spawned processes; returns the runs that diverged. Any other failure
    stops the sweep and is raised."""
    from posenc_cli.runs.progress import progress_bar

    prepare_shared_data([run for _, run, _ in todo])
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    console.print(f"{len(todo)} runs in {jobs} processes, {threads} thread(s) each")
    progress = progress_bar(console, True)
    with progress, ProcessPoolExecutor(jobs, mp_context=context) as pool:
        bar = progress.add_task("sweep", total=len(todo), stats="")
        pending = {pool.submit(_worker, run, run_dir, resume, threads) for _, run, run_dir in todo}
        folders = {run_dir.name: run_dir for _, _, run_dir in todo}
        diverged = []
        started = time.monotonic()
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    name, why = future.result()  # re-raises a worker's error here
                    if why is not None:
                        diverged.append(folders[name])
                        console.print(f"[yellow]{escape(why)}; the sweep goes on[/]")
                    progress.update(bar, advance=1, stats=f"finished {name}")
                    if not console.is_terminal:  # a log file gets no bar: a line per run
                        count = int(progress.tasks[0].completed)
                        took = round(time.monotonic() - started)
                        console.print(f"{count}/{len(todo)} finished {name} ({took} s in)")
        except BaseException as err:
            for future in pending:
                future.cancel()
            if isinstance(err, Terminated):  # a terminal's Ctrl-C reaches the workers itself
                for process in pool._processes.values():
                    process.terminate()  # SIGTERM: each saves its checkpoint and stops
            raise
    return diverged
