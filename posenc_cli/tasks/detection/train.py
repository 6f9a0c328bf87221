"""The detection task's training: a ``kind: detection`` recipe in, one run directory out.

DETR's recipe at small scale: AdamW with the backbone at its own (lower) learning rate, a
tenfold drop at ``train.lr_drop``, gradient clipping at 0.1, the Hungarian-matched set loss with
auxiliary losses from every decoder layer. After every epoch the model is scored on the
validation set with pycocotools' COCOeval; the best AP is kept in ``best.pt``. The loop is the
one every task runs (``runs/loop.py``), in periods of one epoch. Checkpoints are taken at the
end of every epoch and a stopped run resumes from there; shuffling and the flips are seeded from
(seed, epoch), so a resumed run ends where the uninterrupted one does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch.utils.data import DataLoader

from posenc_cli.config import Recipe
from posenc_cli.runs.cadence import Cadence
from posenc_cli.runs.checkpoint import save_checkpoint
from posenc_cli.runs.epochs import epoch_hooks, epoch_loader, optimize
from posenc_cli.runs.loop import no_score_yet, train_loop
from posenc_cli.runs.resume import resume_from
from posenc_cli.runs.schedule import step_decay
from posenc_cli.runs.summary import write_summary
from posenc_cli.tasks.detection.schema import model_options
from posenc_cli.tasks.run_start import start_run

AP_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def load_detection_data(recipe: Recipe):
    """The recipe's data set, written first when it is a procedural shapes set."""
    from posenc_cli.tasks.detection.coco import build_detection_data
    from posenc_cli.tasks.detection.shapes import make_shapes

    cfg = recipe.data
    if cfg.shapes_images > 0:
        make_shapes(
            Path(cfg.root),
            cfg.shapes_images,
            seed=cfg.shapes_seed,
            size=cfg.image_size,
            max_objects=cfg.shapes_max_objects,
        )
    return build_detection_data(cfg)


def build_detection_model(recipe: Recipe, num_classes: int):
    from posenc_cli.tasks.detection.detr import build_detr

    return build_detr(num_classes, **model_options(recipe))


def to_device(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    return [
        {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
        for t in targets
    ]


@torch.no_grad()
def evaluate_detection(model, data, criterion, recipe: Recipe, device, keep: int = 0):
    """COCO AP (in %) and the set loss over the validation set; with ``keep`` > 0 also the
    first ``keep`` images, targets and predictions, for a picture."""
    from posenc_cli.tasks.detection.coco import collate
    from posenc_cli.tasks.detection.coco_eval import coco_evaluate
    from posenc_cli.tasks.detection.criterion import postprocess

    model.eval()
    loader = DataLoader(data.val, batch_size=recipe.eval.batch_size, collate_fn=collate)
    predictions: dict[int, dict[str, torch.Tensor]] = {}
    loss, batches = 0.0, 0
    kept: tuple[list, list, list] = ([], [], [])
    for images, targets in loader:
        outputs = model(images.to(device))
        loss += float(criterion(outputs, to_device(targets, device))["loss"])
        batches += 1
        sizes = torch.stack([t["orig_size"] for t in targets])
        for target, pred, image in zip(targets, postprocess(outputs, sizes), images, strict=True):
            pred = {k: v.cpu() for k, v in pred.items()}
            predictions[int(target["image_id"])] = pred
            if len(kept[0]) < keep:
                kept[0].append(image)
                kept[1].append(pred)
                kept[2].append(target)
    scores = coco_evaluate(data.val.coco, predictions, data.label_to_category)
    result = {k: 100.0 * v for k, v in scores.items() if not math.isnan(v)}  # no such objects
    result["loss"] = loss / max(batches, 1)
    model.train()
    return result, kept


def param_groups(model, cfg) -> list[dict[str, Any]]:
    """The backbone at ``lr_backbone`` (frozen when 0), everything else at ``lr``."""
    backbone = [p for n, p in model.named_parameters() if n.startswith("backbone.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("backbone.")]
    if cfg.lr_backbone == 0:
        for p in backbone:
            p.requires_grad_(False)
        return [{"params": rest, "lr": cfg.lr}]
    return [{"params": rest, "lr": cfg.lr}, {"params": backbone, "lr": cfg.lr_backbone}]


def prepare_shared_data(runs: list[Recipe]) -> None:
    """Write each shapes set of a sweep once, before its runs start side by side (two runs
    writing one set at once raced in a pilot)."""
    written = set()
    for run in runs:
        key = (run.data.root, run.data.shapes_images, run.data.shapes_seed)
        if run.data.shapes_images > 0 and key not in written:
            load_detection_data(run)
            written.add(key)


def train_detection(
    recipe: Recipe,
    out: Path,
    resume: bool = False,
    console: Console | None = None,
    interrupt_at: int | None = None,
) -> dict[str, Any]:
    """Train a detection recipe into ``out``; returns the summary. ``interrupt_at`` simulates
    a Ctrl-C before that global step (tests use it)."""
    from posenc_cli.tasks.detection.coco import collate
    from posenc_cli.tasks.detection.criterion import SetCriterion
    from posenc_cli.tasks.detection.matcher import HungarianMatcher

    console, device, world = start_run(recipe, out, resume, console)
    cfg = recipe.train
    if world.main:
        data = load_detection_data(recipe)  # rank 0 writes a shapes set, if any, first
    world.barrier()
    if not world.main:
        data = load_detection_data(recipe)
    torch.manual_seed(recipe.seed)
    model = build_detection_model(recipe, data.num_classes).to(device)
    groups = param_groups(model, cfg)
    optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    criterion = SetCriterion(data.num_classes, HungarianMatcher(), eos_coef=cfg.eos_coef)
    # rank 0 scores alone: its loss must not wait for the other ranks
    scoring = SetCriterion(
        data.num_classes, HungarianMatcher(), eos_coef=cfg.eos_coef, across_ranks=False
    )
    # train.batch_size is per process, as in DETR (4 per GPU)
    per_epoch = math.ceil(len(data.train) / (cfg.batch_size * world.size))
    cadence = Cadence.epochs(cfg.epochs, per_epoch)
    base_lrs = [g["lr"] for g in groups]
    schedule = step_decay(optimizer, base_lrs, drop_at=cfg.lr_drop * per_epoch, factor=0.1)

    last, log_path = out / "last.pt", out / "metrics.jsonl"
    start, best = 0, no_score_yet(lower_is_better=False)
    resumed = resume_from(last, model, optimizer, world, log_path, cadence) if resume else None
    if resumed is not None:
        start, best = resumed.steps, resumed.best
    trainable = model
    if world.size > 1:
        trainable = torch.nn.parallel.DistributedDataParallel(model)

    def checkpoint(path: Path, position: dict[str, int], best: float) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        save_checkpoint(path, {**state, **position, "best": best})

    def loader(epoch: int):
        return epoch_loader(
            data.train, cfg.batch_size, world, recipe.seed, epoch, cfg.workers, False, collate
        )

    def train_step(step: int, pair) -> tuple[float, int]:
        images, targets = pair
        outputs = trainable(images.to(device))
        loss = criterion(outputs, to_device(targets, device))["loss"]

        def stopped() -> str:
            return (
                f"at step {step + 1}; the last good checkpoint (epoch {step // per_epoch}) is "
                f"kept in {out}; lower train.lr"
            )

        return optimize(loss, model, optimizer, cfg.grad_clip, stopped), len(images)

    def score() -> tuple[dict[str, float], float]:
        val, _ = evaluate_detection(model, data, scoring, recipe, device)  # back in train mode
        return val, val.get("AP", 0.0)

    hooks = epoch_hooks(
        per_epoch, loader, train_step, score, "val AP", checkpoint, schedule,
        optimizer=optimizer, log_path=log_path,
    )  # fmt: skip
    trained = train_loop(
        hooks, cadence, out, world, start, best, console, cfg.tensorboard, interrupt_at
    )
    return write_summary(
        out, recipe, model, world, device, log_path,
        kind="detection", sine=recipe.model.sine, epochs=cfg.epochs, steps=cadence.total,
        encoding_parameters=model.encoding_parameters(), best_val_AP=trained.best,
    )  # fmt: skip
