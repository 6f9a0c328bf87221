"""Evaluate a trained run at other lengths and under a position shift.

For each length the run is scored on fixed test batches (the same for every run): loss,
perplexity, per-token accuracy and exact match. A length an encoding cannot run at (a learned
table past its end) is reported as such, not as a crash. A language model with Transformer-XL
memory is also scored over the validation text in consecutive segments, memory carried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posenc_cli.config import Recipe, load_recipe
from posenc_cli.data import build_task
from posenc_cli.errors import UsageError
from posenc_cli.metrics import Tally
from posenc_cli.models.text import build_text_model
from posenc_cli.runs.checkpoint import load_run_weights
from posenc_cli.runs.device import autocast, pick_device
from posenc_cli.runs.evaluation import Evaluated, recipe_file, save_evaluation
from posenc_cli.tasks.pictures import curve_picture, position_picture
from posenc_cli.tasks.text.by_count import CountTally, check_countable, count_rows
from posenc_cli.tasks.text.by_position import PositionTally, position_rows
from posenc_cli.tasks.text.misses import check_listable, missed, write_misses
from posenc_cli.tasks.text.train import evaluate_length


def eval_name(shift: int, by_count: bool = False) -> str:
    """The file an evaluation is saved in; ``--by-count`` draws other problems (every count of
    ones alike), so its scores go beside the fair-bit ones, not over them."""
    stem = "eval_by_count" if by_count else "eval"
    return f"{stem}.json" if shift == 0 else f"{stem}_shift{shift}.json"


def load_run(run_dir: Path, overrides: list[str] = ()) -> tuple[Recipe, torch.nn.Module, Any]:
    recipe = load_recipe(recipe_file(run_dir), list(overrides))
    task = build_task(recipe.data)
    model = build_text_model(recipe.model, recipe.encoding, task, recipe.data)
    load_run_weights(run_dir, model)
    return recipe, model, task


@torch.no_grad()
def evaluate_stream(model, task, segment: int, device, max_segments: int = 64) -> dict[str, float]:
    """Perplexity over the validation text read in order, memory carried between segments."""
    model.eval()
    stream = task.stream("test")
    tally, memory = Tally(), None
    usable = min(len(stream) - 1, segment * max_segments)
    for begin in range(0, usable - segment + 1, segment):
        window = stream[begin : begin + segment + 1][None].to(device)
        with autocast(device):
            out = model(window[:, :-1], memory=memory)
        tally.add(out.logits, window[:, 1:])
        memory = out.memory
    return tally.summary()


def evaluate_run(
    run_dir: Path,
    overrides: list[str] = (),
    lengths: list[int] | None = None,
    shift: int | None = None,
    write: bool = True,
    misses: list | None = None,
    positions: PositionTally | None = None,
    counts: bool = False,
) -> dict[str, Any]:
    """Score the run at ``lengths`` (the recipe's by default); with ``misses``, every test
    problem it gets wrong is appended to that list (``misses.py``); with ``positions``, the
    answers are counted position by position (``by_position.py``); with ``counts`` (parity),
    the problems hold every count of ones alike and each count is scored (``by_count.py``)."""
    if any(n < 1 for n in lengths or ()) or (shift is not None and shift < 0):
        raise UsageError("--lengths must be positive and --shift >= 0, e.g. --lengths 16,32,64")
    recipe, model, task = load_run(run_dir, overrides)
    if misses is not None:
        check_listable(task, "--misses", "has no problems to list")
    if positions is not None:
        check_listable(task, "--by-position", "has no answer positions")
    tally = None
    if counts:
        check_countable(task)
        task.test_ones, tally = "uniform", CountTally(task)

    def watch(length: int, index: int, batch: Any, logits: torch.Tensor) -> None:
        if misses is not None:
            misses.extend(missed(task, length, index, batch.tokens, batch.targets, logits))
        if positions is not None:
            positions.add(length, batch, logits)
        if tally is not None:
            tally.add(length, batch, logits)

    device = pick_device(recipe.train.device)
    model.to(device)
    lengths = lengths or list(recipe.eval.lengths)
    shift = recipe.eval.shift if shift is None else shift
    rows: dict[str, Any] = {}
    for length in lengths:
        try:
            rows[str(length)] = evaluate_length(
                model,
                task,
                length,
                recipe.eval.batches,
                recipe.train.batch_size,
                device,
                offset=shift,
                span=recipe.model.random_positions,
                watch=watch,
            )
        except UsageError as err:  # e.g. a learned table shorter than this length
            rows[str(length)] = {"error": str(err)}
    result = {
        "run": str(run_dir),
        "encoding": recipe.encoding.name,
        "encoding_params": recipe.encoding.params,
        "seed": recipe.seed,
        "task": recipe.data.task,
        "train_lengths": list(recipe.data.train_lengths),
        "shift": shift,
        "lengths": rows,
    }
    if tally is not None:
        result["ones"] = "uniform"
        for n, accuracy in tally.accuracy().items():
            rows[n]["by_count"], rows[n]["by_count_problems"] = accuracy, tally.drawn[int(n)]
    if task.kind == "lm" and recipe.model.mem_len > 0 and hasattr(task, "stream"):
        result["stream"] = evaluate_stream(model, task, recipe.data.train_lengths[1], device)
    if write:
        save_evaluation(run_dir / eval_name(shift, counts), result)
    return result


def score(run_dir: Path, overrides: list[str], options: dict[str, Any]) -> Evaluated:
    """`posenc evaluate` of a text run: ``options`` lengths, shift, out (a curve), misses
    (a JSON Lines file of the problems it got wrong) and by_position (accuracy per answer
    position, which then makes the table and the curve)."""
    records = None if options.get("misses") is None else []
    tally = PositionTally() if options["by_position"] else None
    by_count = bool(options.get("by_count"))
    result = evaluate_run(
        run_dir, overrides, options["lengths"], options["shift"], write=False,
        misses=records, positions=tally, counts=by_count,
    )  # fmt: skip
    note = None
    if records is not None:
        write_misses(options["misses"], records)
        note = f"{len(records)} missed problem(s) written to {options['misses']}"
    if tally is not None:
        # inside each length's entry, so a later score of that length replaces it as a whole
        for n, accuracy in tally.accuracy().items():
            result["lengths"][n]["by_position"] = accuracy
    low, high = result["train_lengths"]
    title = (
        f"{run_dir}: {result['encoding']}, trained on lengths {low}-{high}, shift {result['shift']}"
    )
    curve = f"{run_dir} (shift {result['shift']})"
    if tally is not None:
        return by_position_table(result, run_dir, title, curve, options["out"], note)
    if by_count:
        return by_count_table(result, run_dir, title, note)
    rows = []
    for n, r in result["lengths"].items():
        if "error" in r:
            rows.append([n, "cannot run", "", "", r["error"][:60]])
            continue
        rows.append([n, f"{r['loss']:.4f}", f"{r['perplexity']:.3f}",
                     f"{r['token_accuracy']:.4f}", f"{r['exact_match']:.4f}"])  # fmt: skip
    if "stream" in result:
        s = result["stream"]
        rows.append(["stream", f"{s['loss']:.4f}", f"{s['perplexity']:.3f}",
                     f"{s['token_accuracy']:.4f}", ""])  # fmt: skip
    columns = ["length", "loss", "perplexity", "token accuracy", "exact match"]
    pictures = []
    if options["out"] is not None:
        pictures.append(
            (options["out"], curve_picture(result, "token_accuracy", curve, (low, high)))
        )
    saved_to = run_dir / eval_name(result["shift"])
    return Evaluated(result, saved_to, title, columns, rows, pictures, note)


def per_length(result: dict[str, Any], key: str, flag: str) -> tuple[dict[str, Any], list[str]]:
    """Each length's ``key`` entry, and a note for every length the encoding cannot run at; if
    none could run, that is the error (``flag`` names the option asking)."""
    by_length = {n: r[key] for n, r in result["lengths"].items() if key in r}
    failed = [f"n={n}: {r['error']}" for n, r in result["lengths"].items() if "error" in r]
    if not by_length:
        raise UsageError(
            f"{flag}: no length could run ({failed[0]}); give lengths this encoding can run at"
        )
    return by_length, [f"cannot run at {line}" for line in failed]


def by_position_table(
    result: dict[str, Any],
    run_dir: Path,
    title: str,
    curve: str,
    out: Path | None,
    note: str | None,
) -> Evaluated:
    """`--by-position`: the table (and curve) of accuracy per answer position, one column per
    length; lengths the encoding cannot run at are named below it, and if none could run that
    is the error."""
    by_length, notes = per_length(result, "by_position", "--by-position")
    notes = ([note] if note else []) + notes
    columns, rows = position_rows(by_length)
    pictures = [] if out is None else [(out, position_picture(by_length, curve))]
    saved_to = run_dir / eval_name(result["shift"])
    return Evaluated(result, saved_to, title, columns, rows, pictures, "\n".join(notes) or None)


def by_count_table(
    result: dict[str, Any], run_dir: Path, title: str, note: str | None
) -> Evaluated:
    """`--by-count`: exact match per count of ones, one column per length; saved beside the
    fair-bit evaluation (``eval_name``)."""
    by_length, notes = per_length(result, "by_count", "--by-count")
    drawn = [d for r in result["lengths"].values() for d in r.get("by_count_problems", [])]
    notes = [
        "exact match per count of ones, every count drawn alike",
        f"{min(drawn)}-{max(drawn)} problems per count (more: eval.batches=N)",
        *([note] if note else []),
        *notes,
    ]
    columns, rows = count_rows(by_length)
    saved_to = run_dir / eval_name(result["shift"], by_count=True)
    return Evaluated(result, saved_to, title, columns, rows, [], "\n".join(notes))
