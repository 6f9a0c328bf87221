"""The sections of a text recipe (the default ``kind: text``): a small Transformer on a
generated algorithmic task or a character language model.

The recipe loader (``config.py``) reads these dataclasses as it reads every task's: each value
converted by its declared type, each key checked by name; ``validate`` holds the rules a field's
type cannot say, and ``build_encoding_once`` checks the encoding's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from posenc_cli.data import TASKS
from posenc_cli.errors import UsageError
from posenc_cli.params import Limit, check_limits, close_match

DEFAULT_ENCODING = "rope"
ENCODING_DIMS = (1,)  # sequences only
Error = Callable[[str, str], UsageError]  # (dotted key, problem) -> the one-line error


def _causal(task: str) -> bool:
    """LM tasks are causal decoders; classifiers (``kind == "classify"``) are bidirectional."""
    return TASKS[task].kind == "lm"


@dataclass
class ModelConfig:
    dim: int = 64  # model width
    depth: int = 2  # blocks
    heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    mem_len: int = 0  # Transformer-XL segment memory length (LM only); 0 = none


@dataclass
class DataConfig:
    task: str = "copy"  # a name of posenc_cli.data.TASKS
    vocab: int = 16  # symbols for algorithmic tasks (ignored by text)
    train_lengths: list[int] = field(default_factory=lambda: [5, 20])  # inclusive [min, max]
    corpus: str | None = None  # text: a file or folder; None = the built-in stdlib corpus
    val_fraction: float = 0.1  # text: held-out fraction (the tail of the corpus)


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 0.01
    warmup: int = 100  # linear warm-up steps, then cosine to 0
    grad_clip: float = 1.0  # 0 = no clipping
    eval_every: int = 200
    eval_batches: int = 8
    checkpoint_every: int = 200
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True  # event files beside metrics.jsonl (rank 0)


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=lambda: [10, 20, 40])  # sizes / text contexts
    batches: int = 8
    shift: int = 0  # add K to every position (translation test)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}


# (key, test, requirement): values each field must satisfy
LIMITS: list[Limit] = [
    ("seed", lambda v: v >= 0, ">= 0"),
    ("model.dim", lambda v: v >= 1, ">= 1"),
    ("model.depth", lambda v: v >= 1, ">= 1"),
    ("model.heads", lambda v: v >= 1, ">= 1"),
    ("model.mlp_ratio", lambda v: v > 0, "> 0"),
    ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model.mem_len", lambda v: v >= 0, ">= 0 (0 = no memory)"),
    ("data.vocab", lambda v: v >= 2, ">= 2"),
    ("data.val_fraction", lambda v: 0 < v < 1, "in (0, 1)"),
    ("train.steps", lambda v: v >= 1, ">= 1"),
    ("train.batch_size", lambda v: v >= 1, ">= 1"),
    ("train.lr", lambda v: v > 0, "> 0"),
    ("train.weight_decay", lambda v: v >= 0, ">= 0"),
    ("train.warmup", lambda v: v >= 0, ">= 0"),
    ("train.grad_clip", lambda v: v >= 0, ">= 0 (0 = no clipping)"),
    ("train.eval_every", lambda v: v >= 1, ">= 1"),
    ("train.eval_batches", lambda v: v >= 1, ">= 1"),
    ("train.checkpoint_every", lambda v: v >= 1, ">= 1"),
    ("eval.batches", lambda v: v >= 1, ">= 1"),
    ("eval.shift", lambda v: v >= 0, ">= 0"),
]


def validate(recipe: Any, error: Error) -> None:
    """Values that convert but are impossible; the encoding is built once to check its params."""
    check_limits(recipe, LIMITS, error)
    model, data = recipe.model, recipe.data
    if model.dim % model.heads:
        options = [h for h in (1, 2, 4, 8, 16) if model.dim % h == 0]
        raise error(
            "model.heads",
            f"{model.heads} does not divide model.dim {model.dim}; "
            f"pick one that does ({', '.join(map(str, options))})",
        )
    if data.task not in TASKS:
        raise error(
            "data.task",
            f"unknown task {data.task!r}{close_match(data.task, TASKS)}; valid: {', '.join(TASKS)}",
        )
    lengths = data.train_lengths
    if len(lengths) != 2 or not 1 <= lengths[0] <= lengths[1]:
        raise error(
            "data.train_lengths", f"expected [min, max] with 1 <= min <= max, got {lengths!r}"
        )
    if data.corpus is not None and not Path(data.corpus).exists():
        raise error(
            "data.corpus",
            f"no such file or folder {data.corpus!r}; give a text file or folder, "
            "or null for the built-in standard-library corpus",
        )
    if not recipe.eval.lengths or min(recipe.eval.lengths) < 1:
        raise error(
            "eval.lengths",
            f"expected a non-empty list of lengths >= 1, got {recipe.eval.lengths!r}",
        )
    if model.mem_len and not _causal(data.task):
        raise error(
            "model.mem_len", f"memory needs a language-model task, not {data.task!r}; set it to 0"
        )


def build_encoding_once(recipe: Any) -> None:
    """Build the recipe's encoding as the text model would, to check its parameters."""
    from posenc_cli.encodings import build_encoding

    model, encoding = recipe.model, recipe.encoding
    build_encoding(
        encoding.name,
        dim=model.dim,
        heads=model.heads,
        head_dim=model.dim // model.heads,
        causal=_causal(recipe.data.task),
        **encoding.params,
    )
