"""The text task's training: one recipe in, one run directory out.

The loop is the one every task runs (``runs/loop.py``); this module gives it the text hooks:
the batch of each step, the forward pass with Transformer-XL memory carried between steps, a
report every ``train.eval_every`` steps (training figures, validation at the longest trained
length), checkpoints that also hold the memory, and the early stop at ``train.stop_at``. Every
source of randomness is derived from (seed, rank, step), so a run resumed from a checkpoint
at any step draws the same batches and dropout masks as the uninterrupted run and ends with the
same numbers; that is why a stopped text run saves where it stopped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from posenc_cli.config import Recipe
from posenc_cli.data import build_task
from posenc_cli.data.batch import curriculum_largest
from posenc_cli.metrics import Tally
from posenc_cli.models.positions import random_positions
from posenc_cli.models.text import build_text_model
from posenc_cli.runs.cadence import Cadence
from posenc_cli.runs.checkpoint import load_checkpoint, save_checkpoint
from posenc_cli.runs.device import autocast, seed_device
from posenc_cli.runs.directory import append_metrics
from posenc_cli.runs.epochs import optimize
from posenc_cli.runs.loop import TrainingHooks, no_score_yet, train_loop
from posenc_cli.runs.resume import resume_from
from posenc_cli.runs.schedule import warmup_cosine
from posenc_cli.runs.summary import write_summary
from posenc_cli.tasks.run_start import start_run

EVAL_SEED = 20_000_000  # evaluation batches are the same for every run and every encoding


def step_generator(seed: int, rank: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + step)


@dataclass
class Segments:
    """Contiguous streams for Transformer-XL training: row b of step s continues row b of step
    s - 1, so the memory carried between steps is the text that came just before."""

    stream: torch.Tensor
    starts: torch.Tensor  # (B,)
    length: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        span = len(self.stream) - self.length - 1
        begin = (self.starts + step * self.length) % span  # (B,)
        index = begin[:, None] + torch.arange(self.length + 1)  # (B, T + 1)
        window = self.stream[index]
        return window[:, :-1], window[:, 1:]


def drawn_positions(span: int, tokens: torch.Tensor, gen: torch.Generator):
    """Randomized positions for this batch when ``span`` (model.random_positions) is set."""
    return random_positions(tokens.shape[1], span, gen) if span else None


@torch.no_grad()
def evaluate_length(
    model,
    task,
    length: int,
    batches: int,
    batch_size: int,
    device,
    offset: int = 0,
    span: int = 0,
    watch: Callable[[int, int, Any, torch.Tensor], None] | None = None,
) -> dict[str, float]:
    """Mean metrics over ``batches`` fixed test batches of problem size ``length``; with
    ``span``, positions drawn by training's rule (after the batch, from its generator);
    ``watch(length, index, batch, logits)`` sees every batch (``--misses``, ``--by-position``)."""
    model.eval()
    tally = Tally()
    for i in range(batches):
        gen = torch.Generator().manual_seed(EVAL_SEED + 1000 * length + i)
        batch = task.batch(batch_size, length, gen, "test")
        mask = None if batch.key_mask is None else batch.key_mask.to(device)
        positions = drawn_positions(span, batch.tokens, gen)
        with autocast(device):
            out = model(batch.tokens.to(device), key_mask=mask, offset=offset, positions=positions)
        tally.add(out.logits, batch.targets.to(device))
        if watch is not None:
            watch(length, i, batch, out.logits)
    model.train()
    return tally.summary()


def train(
    recipe: Recipe,
    out: Path,
    resume: bool = False,
    console: Console | None = None,
    interrupt_at: int | None = None,
) -> dict[str, Any]:
    """Train ``recipe`` into ``out``; returns the summary. ``interrupt_at`` simulates a Ctrl-C
    after that many steps (tests use it; it takes the same path as a real one)."""
    task = build_task(recipe.data)  # first: a bad data setting writes no run folder
    console, device, world = start_run(recipe, out, resume, console)
    cfg = recipe.train
    torch.manual_seed(recipe.seed)
    model = build_text_model(recipe.model, recipe.encoding, task, recipe.data).to(device)
    # fused: one kernel per step instead of about ten ops per tensor (2 ms of a 30 ms step)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98),
        fused=True,
    )  # fmt: skip
    cadence = Cadence.steps(cfg.steps, report_every=cfg.eval_every, save_every=cfg.checkpoint_every)
    last, log_path = out / "last.pt", out / "metrics.jsonl"
    start, best, memory = 0, no_score_yet(lower_is_better=True), None
    resumed = resume_from(last, model, optimizer, world, log_path, cadence) if resume else None
    if resumed is not None:
        start, best = resumed.steps, resumed.best
        saved = resumed.state.get("memory")
        memory = [m.to(device) for m in saved] if saved else None
    trainable = model
    if world.size > 1:
        trainable = torch.nn.parallel.DistributedDataParallel(model)

    segments = None
    if task.kind == "lm" and recipe.model.mem_len > 0:
        stream = task.stream("train")
        gen = torch.Generator().manual_seed(recipe.seed * 31 + world.rank)
        span = len(stream) - cfg.batch_size * 2
        starts = torch.randint(0, max(span, 1), (cfg.batch_size,), generator=gen)
        segments = Segments(stream, starts, recipe.data.train_lengths[1])

    lo, hi = recipe.data.train_lengths
    curriculum = recipe.data.curriculum  # 0: every size from the first step
    span = recipe.model.random_positions  # 0: positions 0 .. T - 1
    tally = Tally()  # this period's training figures; only rank 0 reports and renews it

    def batches(first: int):
        for step in itertools.count(first):
            gen = step_generator(recipe.seed, world.rank, step)
            seed_device(recipe.seed * 1_000_003 + step, device)  # dropout masks
            if segments is not None:
                tokens, targets = segments.batch(step)
                key_mask = None
            else:
                length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
                if curriculum:
                    largest = curriculum_largest(step, (lo, hi), curriculum)
                    batch = task.batch(cfg.batch_size, length, gen, "train", largest=largest)
                else:
                    batch = task.batch(cfg.batch_size, length, gen, "train")
                tokens, targets, key_mask = batch.tokens, batch.targets, batch.key_mask
            yield tokens, targets, key_mask, drawn_positions(span, tokens, gen)

    def train_step(step: int, batch) -> tuple[float, int]:
        nonlocal memory
        tokens, targets, key_mask, positions = batch
        with autocast(device):
            output = trainable(
                tokens.to(device),
                key_mask=None if key_mask is None else key_mask.to(device),
                memory=memory,
                positions=positions,
            )
        loss = tally.add(output.logits, targets.to(device))
        value = optimize(
            loss, model, optimizer, cfg.grad_clip, lambda: stopped_at(step, start, out)
        )
        memory = output.memory
        return value, tokens.numel()

    def report(done: int, losses: list[float], per_second) -> tuple[dict[str, Any], float]:
        nonlocal tally
        row = {
            "step": done,
            "lr": optimizer.param_groups[0]["lr"],
            "tokens_per_s": per_second(),  # before validating: the training throughput
            **{f"train_{k}": v for k, v in tally.summary().items()},
        }
        tally = Tally()
        val = evaluate_length(model, task, hi, cfg.eval_batches, cfg.batch_size, device, span=span)
        row.update({f"val_{k}": v for k, v in val.items()})
        append_metrics(log_path, row)
        return row, val["loss"]

    def checkpoint(path: Path, position: dict[str, int], best: float) -> None:
        save_checkpoint(
            path,
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                **position,
                "best": best,
                "memory": [m.cpu() for m in memory] if memory else None,
            },
        )

    def fitted(row: dict[str, Any]) -> bool:
        return cfg.stop_at is not None and row["val_exact_match"] >= cfg.stop_at

    hooks = TrainingHooks(
        batches=batches,
        train_step=train_step,
        report=report,
        checkpoint=checkpoint,
        stats=lambda row, score: stats_line(row),
        schedule=warmup_cosine(optimizer, cfg.lr, cfg.warmup, cfg.steps),
        lower_is_better=True,
        stop_early=fitted,
    )
    trained = train_loop(
        hooks, cadence, out, world, start, best, console, cfg.tensorboard, interrupt_at
    )
    return write_summary(
        out, recipe, model, world, device, log_path,
        task=recipe.data.task, steps=cfg.steps,
        steps_trained=trained.steps,  # fewer than steps where train.stop_at ended the run
        best_val_loss=trained.best, train_lengths=[lo, hi],
    )  # fmt: skip


def stopped_at(step: int, start: int, out: Path) -> str:
    """Where a NaN stop happened and which checkpoint is kept (read only when it happens)."""
    kept = f"step {start}" if start else "none yet"
    if (out / "last.pt").is_file():
        kept = f"step {load_checkpoint(out / 'last.pt')['step']}"
    return (
        f"at step {step + 1}; the last good checkpoint ({kept}) is kept in {out}; "
        "lower train.lr or train.grad_clip"
    )


def stats_line(row: dict[str, Any]) -> str:
    parts = [f"loss {row['train_loss']:.3f}", f"acc {row['train_token_accuracy']:.3f}"]
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.3f}/{row['val_token_accuracy']:.3f}")
    parts.append(f"{row['tokens_per_s']:.0f} tok/s")
    return "  ".join(parts)
