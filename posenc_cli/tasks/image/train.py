"""The image task's training: a ``kind: image`` recipe in, one run directory out.

DeiT's recipe with timm's parts: AdamW without weight decay on biases, norms, the class token
and the position tables (``create_optimizer_v2`` reads the model's ``no_weight_decay``), the
cosine schedule with linear warm-up, updated every step (``CosineLRScheduler``), Mixup/CutMix
with label smoothing (``Mixup`` + ``SoftTargetCrossEntropy``) or plain label smoothing, drop path,
and an optional EMA of the weights (``ModelEmaV3``), which is then the model scored and kept.

The loop is the one every task runs (``runs/loop.py``), in periods of one epoch. Checkpoints
are taken at the end of every epoch, and a stopped run resumes from there (the partial epoch is
redone): every source of randomness (shuffling, augmentation, Mixup, drop path) is seeded from
(seed, epoch), so a run stopped and resumed ends with the numbers of the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from rich.console import Console
from torch.utils.data import DataLoader

from posenc_cli.config import Recipe
from posenc_cli.errors import UsageError
from posenc_cli.runs.cadence import Cadence
from posenc_cli.runs.checkpoint import save_checkpoint
from posenc_cli.runs.device import autocast
from posenc_cli.runs.epochs import epoch_hooks, epoch_loader, optimize
from posenc_cli.runs.loop import no_score_yet, train_loop
from posenc_cli.runs.resume import resume_from
from posenc_cli.runs.schedule import timm_cosine
from posenc_cli.runs.summary import write_summary
from posenc_cli.tasks.image.schema import model_overrides
from posenc_cli.tasks.run_start import start_run

if TYPE_CHECKING:
    from posenc_cli.data.images import ImageData


def build_image_model(
    recipe: Recipe,
    num_classes: int,
    channels: int,
    image_size: int,
    caption: tuple[int, int] = (0, 0),
):
    """The recipe's ViT for this data: its classes, channels, side, and the (vocabulary, words)
    of its captions ((0, 0) for images alone)."""
    from posenc_cli.models.vit import build_vit

    m = recipe.model
    if m.window_dilation > 1 and not m.window:
        raise UsageError(
            f"model.window_dilation {m.window_dilation} dilates a local window, and "
            "model.window is 0 (full attention); set model.window too, e.g. 3"
        )
    return build_vit(
        m.arch,
        encoding=recipe.encoding.name,
        encoding_params=dict(recipe.encoding.params),
        num_classes=num_classes,
        img_size=image_size,
        in_chans=channels,
        drop_path=m.drop_path,
        dropout=m.dropout,
        window=m.window or None,
        window_dilation=m.window_dilation,
        pool=m.pool,
        frames=recipe.data.frames,
        caption_vocab=caption[0],
        caption_words=caption[1],
        # DeiT's table beside a relative encoding; learned2d is that table already
        absolute=m.absolute and recipe.encoding.name != "learned2d",
        **model_overrides(m),
    )


def image_model_for(recipe: Recipe, data: ImageData):
    """The recipe's ViT for the data set ``data`` (its classes, channels, side and captions)."""
    caption = (data.caption_vocab, data.caption_words)
    return build_image_model(recipe, data.num_classes, data.channels, data.image_size, caption)


def model_inputs(batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    """What the model is called with: the images, or the images and their captions' word ids
    (a captioned set's items are ``((image, words), label)``)."""
    parts = batch if isinstance(batch, (list, tuple)) else (batch,)
    return tuple(part.to(device) for part in parts)


@torch.no_grad()
def evaluate_images(model, loader: DataLoader, device: torch.device) -> dict[str, float]:
    """Top-1, top-5 (in %) and the cross-entropy over ``loader``."""
    model.eval()
    correct1 = correct5 = seen = 0
    loss = 0.0
    for inputs, labels in loader:
        labels = labels.to(device)
        with autocast(device):
            logits = model(*model_inputs(inputs, device)).float()
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (B, 5)
        correct1 += int((top[:, 0] == labels).sum())
        correct5 += int((top == labels[:, None]).any(dim=-1).sum())
        seen += len(labels)
    return {
        "top1": 100.0 * correct1 / seen,
        "top5": 100.0 * correct5 / seen,
        "loss": loss / seen,
    }


def make_criterion(cfg, num_classes: int):
    """Mixup/CutMix with soft targets when either is on, else label-smoothed cross-entropy."""
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy

    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=cfg.mixup,
            cutmix_alpha=cfg.cutmix,
            label_smoothing=cfg.label_smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    return None, torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)


def train_image(
    recipe: Recipe,
    out: Path,
    resume: bool = False,
    console: Console | None = None,
    interrupt_at: int | None = None,
) -> dict[str, Any]:
    """Train an image recipe into ``out``; returns the summary. ``interrupt_at`` simulates a
    Ctrl-C before that global step (tests use it)."""
    from timm.optim import create_optimizer_v2
    from timm.utils import ModelEmaV3

    from posenc_cli.data.images import build_image_data

    data = build_image_data(recipe.data)  # first: a bad data setting writes no run folder
    console, device, world = start_run(recipe, out, resume, console)
    cfg = recipe.train
    torch.manual_seed(recipe.seed)
    model = image_model_for(recipe, data).to(device)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    # train.batch_size is the global batch; each of the world's processes takes its share
    batch = min(cfg.batch_size, len(data.train))
    if batch % world.size:
        raise UsageError(
            f"train.batch_size {batch} does not split over {world.size} processes; "
            "use a multiple of the process count"
        )
    per_epoch = max(1, len(data.train) // batch)  # drop_last: Mixup needs full, even batches
    cadence = Cadence.epochs(cfg.epochs, per_epoch)
    schedule = timm_cosine(
        optimizer,
        total=cadence.total,
        warmup=cfg.warmup_epochs * per_epoch,
        min_lr=cfg.min_lr,
        warmup_lr=min(1e-6, cfg.lr),
    )
    ema = ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema else None
    mixup, criterion = make_criterion(cfg, data.num_classes)
    val_loader = DataLoader(data.val, batch_size=recipe.eval.batch_size, num_workers=cfg.workers)

    last, log_path = out / "last.pt", out / "metrics.jsonl"
    start, best = 0, no_score_yet(lower_is_better=False)
    resumed = resume_from(last, model, optimizer, world, log_path, cadence) if resume else None
    if resumed is not None:
        start, best = resumed.steps, resumed.best
        if ema is not None and resumed.state.get("ema"):
            ema.module.load_state_dict(resumed.state["ema"])
    trainable = model
    if world.size > 1:
        trainable = torch.nn.parallel.DistributedDataParallel(model)

    def checkpoint(path: Path, position: dict[str, int], best: float) -> None:
        save_checkpoint(
            path,
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "ema": None if ema is None else ema.module.state_dict(),
                **position,
                "best": best,
            },
        )

    def loader(epoch: int):
        return epoch_loader(
            data.train,
            batch // world.size,
            world,
            recipe.seed,
            epoch,
            cfg.workers,
            drop_last=True,  # Mixup needs full, even batches
        )

    def train_step(step: int, pair) -> tuple[float, int]:
        inputs, labels = model_inputs(pair[0], device), pair[1].to(device)
        if mixup is not None:  # images alone: a captioned set refuses Mixup and CutMix
            images, labels = mixup(inputs[0], labels)
            inputs = (images,)
        with autocast(device):
            loss = criterion(trainable(*inputs).float(), labels)

        def stopped() -> str:
            return (
                f"at step {step + 1}; the last good checkpoint (epoch {step // per_epoch}) is "
                f"kept in {out}; lower train.lr or set train.grad_clip"
            )

        value = optimize(loss, model, optimizer, cfg.grad_clip, stopped)
        if ema is not None:
            ema.update(model, step=step)
        return value, len(labels)

    def score() -> tuple[dict[str, float], float]:
        val = evaluate_images(scored, val_loader, device)
        model.train()  # scoring left it in eval mode (without EMA it is the model scored)
        return val, val["top1"]

    scored = model if ema is None else ema.module
    hooks = epoch_hooks(
        per_epoch, loader, train_step, score, "val top-1 %", checkpoint, schedule,
        optimizer=optimizer, log_path=log_path,
    )  # fmt: skip
    trained = train_loop(
        hooks, cadence, out, world, start, best, console, cfg.tensorboard, interrupt_at
    )
    return write_summary(
        out, recipe, model, world, device, log_path,
        kind="image", dataset=recipe.data.dataset, epochs=cfg.epochs, steps=cadence.total,
        encoding_parameters=model.encoding_parameters(), best_val_top1=trained.best,
        image_size=data.image_size,
    )  # fmt: skip
