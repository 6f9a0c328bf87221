"""The training loop: one recipe in, one run directory out.

Every source of randomness is derived from (seed, rank, step), so a run resumed from its last
checkpoint draws the same batches and dropout masks as the uninterrupted run and ends with the
same numbers. Checkpoints (``last.pt``, ``best.pt``) are written atomically; ``metrics.jsonl``
gets one line per log; ``summary.json`` is written at the end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from posenc_cli.config import Recipe
from posenc_cli.data import build_task
from posenc_cli.metrics import Tally
from posenc_cli.models.positions import random_positions
from posenc_cli.models.text import build_text_model
from posenc_cli.runs import distributed
from posenc_cli.runs.checkpoint import atomic_write_json, load_checkpoint, save_checkpoint
from posenc_cli.runs.curves import Curves
from posenc_cli.runs.device import autocast, pick_device
from posenc_cli.runs.directory import (
    append_metrics,
    last_metrics,
    prepare_directory,
    truncate_metrics,
    write_recipe,
)
from posenc_cli.runs.epochs import optimize
from posenc_cli.runs.progress import progress_bar

EVAL_SEED = 20_000_000  # evaluation batches are the same for every run and every encoding


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1, then cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


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
) -> dict[str, float]:
    """Mean metrics over ``batches`` fixed test batches of problem size ``length``; with
    ``span``, positions drawn by training's rule (after the batch, from its generator)."""
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
    console = console or Console(stderr=True)
    cfg = recipe.train
    device = pick_device(cfg.device)
    world = distributed.start(device)
    last, best_path = out / "last.pt", out / "best.pt"
    if world.main:
        prepare_directory(out, resume)
        write_recipe(out, recipe)
    task = build_task(recipe.data)
    torch.manual_seed(recipe.seed)
    model = build_text_model(recipe.model, recipe.encoding, task, recipe.data).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98)
    )
    start, best, memory = 0, math.inf, None
    if resume and last.is_file():
        state = load_checkpoint(last)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, best = int(state["step"]), float(state["best"])
        memory = [m.to(device) for m in state["memory"]] if state.get("memory") else None
        if world.main:
            truncate_metrics(out / "metrics.jsonl", start)
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

    log_path = out / "metrics.jsonl"
    params = sum(p.numel() for p in model.parameters())
    lo, hi = recipe.data.train_lengths
    eval_length = hi
    span = recipe.model.random_positions  # 0: positions 0 .. T - 1
    tokens_seen, t0 = 0, time.perf_counter()
    step = start
    fitted = False
    train_tally = Tally()

    def checkpoint(path: Path) -> None:
        if world.main:
            save_checkpoint(
                path,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "best": best,
                    "memory": [m.cpu() for m in memory] if memory else None,
                },
            )

    curves = Curves(out, cfg.tensorboard and world.main, resumed_at=start)
    progress = progress_bar(console, world.main)
    try:
        with progress:
            bar = progress.add_task(out.name, total=cfg.steps, completed=start, stats="")
            for step in range(start, cfg.steps):
                if interrupt_at is not None and step == interrupt_at:
                    raise KeyboardInterrupt
                gen = step_generator(recipe.seed, world.rank, step)
                torch.manual_seed(recipe.seed * 1_000_003 + step)  # dropout masks
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr * lr_factor(step, cfg.warmup, cfg.steps)
                if segments is not None:
                    tokens, targets = segments.batch(step)
                    key_mask = None
                else:
                    length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
                    batch = task.batch(cfg.batch_size, length, gen, "train")
                    tokens, targets, key_mask = batch.tokens, batch.targets, batch.key_mask
                positions = drawn_positions(span, tokens, gen)
                with autocast(device):
                    output = trainable(
                        tokens.to(device),
                        key_mask=None if key_mask is None else key_mask.to(device),
                        memory=memory,
                        positions=positions,
                    )
                loss = train_tally.add(output.logits, targets.to(device))
                optimize(
                    loss,
                    model,
                    optimizer,
                    cfg.grad_clip,
                    lambda step=step: stopped_at(step, start, out),
                )
                memory = output.memory
                tokens_seen += tokens.numel() * world.size
                step += 1
                done = step == cfg.steps
                if step % cfg.eval_every == 0 or done:
                    rate = tokens_seen / (time.perf_counter() - t0)
                    row = {
                        "step": step,
                        "lr": optimizer.param_groups[0]["lr"],
                        "tokens_per_s": rate,
                        **{f"train_{k}": v for k, v in train_tally.summary().items()},
                    }
                    train_tally = Tally()
                    if world.main:
                        val = evaluate_length(
                            model,
                            task,
                            eval_length,
                            cfg.eval_batches,
                            cfg.batch_size,
                            device,
                            span=span,
                        )
                        row.update({f"val_{k}": v for k, v in val.items()})
                        append_metrics(log_path, row)
                        curves.add(row)
                        if val["loss"] < best:
                            best = val["loss"]
                            checkpoint(best_path)
                        fitted = cfg.stop_at is not None and val["exact_match"] >= cfg.stop_at
                    progress.update(bar, stats=stats_line(row))
                    fitted = world.broadcast_flag(fitted)
                if step % cfg.checkpoint_every == 0 or done or fitted:
                    checkpoint(last)
                progress.update(bar, completed=step)
                if fitted:
                    break
    except KeyboardInterrupt:
        checkpoint(last)
        raise
    except RuntimeError as err:
        if not distributed.peer_failure(err, world):
            raise
        checkpoint(last)  # this rank's weights are whole: the failed step never reached them
        raise distributed.lost(err, world, out) from None
    summary = {
        "recipe": recipe.source,
        "encoding": recipe.encoding.name,
        "encoding_params": recipe.encoding.params,
        "task": recipe.data.task,
        "seed": recipe.seed,
        "steps": cfg.steps,
        "steps_trained": step,  # fewer than steps where train.stop_at ended the run
        "parameters": params,
        "best_val_loss": best,
        "train_lengths": [lo, hi],
        "device": device.type,
        "world_size": world.size,
        "final": last_metrics(log_path) if world.main else {},
    }
    if world.main:
        atomic_write_json(out / "summary.json", summary)
    curves.close()
    return summary


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
