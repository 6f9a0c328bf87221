"""The sections of a text recipe (the default ``kind: text``): a small Transformer on a
generated algorithmic task or a character language model.

The recipe loader (``config/``) reads these dataclasses as it reads every task's: each value
converted by its declared type, each key checked by name; ``validate`` holds the rules a field's
type cannot say, and ``build_encoding_once`` checks the encoding's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posenc_cli.data import TASKS, AlgorithmicTask
from posenc_cli.data.algorithmic import Parity
from posenc_cli.errors import UsageError
from posenc_cli.params import bounded, close_match

DEFAULT_ENCODING = "rope"
ENCODING_DIMS = (1, 3)  # sequences; N-D encodings put each token at its index on every axis
Error = Callable[[str, str], UsageError]  # (dotted key, problem) -> the one-line error


def _causal(task: str) -> bool:
    """LM tasks are causal decoders; classifiers (``kind == "classify"``) are bidirectional."""
    return TASKS[task].kind == "lm"


@dataclass
class ModelConfig:
    dim: int = bounded(64, lambda v: v >= 1, ">= 1", most=65_536)  # model width
    depth: int = bounded(2, lambda v: v >= 1, ">= 1", most=1_024)  # blocks
    heads: int = bounded(4, lambda v: v >= 1, ">= 1", most=1_024)
    mlp_ratio: float = bounded(4.0, lambda v: v > 0, "> 0")
    dropout: float = bounded(0.0, lambda v: 0 <= v < 1, "in [0, 1)")
    # Transformer-XL segment memory length (LM only); 0 = none
    mem_len: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = no memory)", most=1_000_000)
    # randomized positions (Ruoss et al. 2023): a sorted random subset of [0, N); 0 = off
    random_positions: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = off)", most=100_000_000)
    # softmax, or kernelised linear attention with the position kept (models/linear_form.py)
    attention: Literal["softmax", "linear"] = "softmax"
    # a sparse pattern on the sequence (kernels/visibility.py), the image grid's on one axis:
    # the offsets within window // 2 (a causal model sees the window // 2 + 1 at or behind
    # each token); 0 = full attention
    window: int = bounded(
        0, lambda v: v == 0 or (v > 0 and v % 2 == 1), "0 or an odd number", most=1_000_001
    )
    window_dilation: int = bounded(1, lambda v: v >= 1, ">= 1", most=100_000)  # slots apart
    # Child et al.'s strided lattice beside the window, its slots this far apart; 0 = none
    window_stride: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = none)", most=100_000)
    # the first this many tokens see and are seen by every token (BigBird, Longformer)
    window_global: int = bounded(0, lambda v: v >= 0, ">= 0", most=1_000_000)


@dataclass
class DataConfig:
    task: str = "copy"  # a name of posenc_cli.data.TASKS
    # symbols for algorithmic tasks (ignored by text)
    vocab: int = bounded(16, lambda v: v >= 2, ">= 2", most=10_000_000)
    # inclusive [min, max]
    train_lengths: list[int] = bounded(factory=lambda: [5, 20], most=10_000_000)
    # algorithmic tasks: the largest training size grows from min to max over this many steps,
    # then stays there (a length curriculum); 0 = every size from the first step
    curriculum: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = off)", most=100_000_000)
    # parity tasks, training rows only: the count of ones from fair bits (binomial) or uniform
    # in 0..n, so that rows with many or few ones are as common as balanced ones
    ones: Literal["binomial", "uniform"] = "binomial"
    corpus: str | None = None  # text: a file or folder; None = the built-in stdlib corpus
    # text: held-out fraction (the tail of the corpus)
    val_fraction: float = bounded(0.1, lambda v: 0 < v < 1, "in (0, 1)")


@dataclass
class TrainConfig:
    steps: int = bounded(1000, lambda v: v >= 1, ">= 1", most=100_000_000)
    batch_size: int = bounded(32, lambda v: v >= 1, ">= 1", most=1_000_000)
    lr: float = bounded(3e-4, lambda v: v > 0, "> 0")
    weight_decay: float = bounded(0.01, lambda v: v >= 0, ">= 0")
    # linear warm-up steps, then cosine to 0
    warmup: int = bounded(100, lambda v: v >= 0, ">= 0", most=100_000_000)
    grad_clip: float = bounded(1.0, lambda v: v >= 0, ">= 0 (0 = no clipping)")
    eval_every: int = bounded(200, lambda v: v >= 1, ">= 1", most=100_000_000)
    eval_batches: int = bounded(8, lambda v: v >= 1, ">= 1", most=1_000_000)
    checkpoint_every: int = bounded(200, lambda v: v >= 1, ">= 1", most=100_000_000)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True  # event files beside metrics.jsonl (rank 0)
    # stop once validation exact match at the longest trained size reaches this: the run has
    # fitted its range, and steps past it are compute the other encodings could use
    stop_at: float | None = bounded(
        None, lambda v: v is None or 0 < v <= 1, "in (0, 1], or null to train every step"
    )


@dataclass
class EvalConfig:
    # sizes / text contexts
    lengths: list[int] = bounded(factory=lambda: [10, 20, 40], most=10_000_000)
    batches: int = bounded(8, lambda v: v >= 1, ">= 1", most=1_000_000)
    # add K to every position (translation test)
    shift: int = bounded(0, lambda v: v >= 0, ">= 0", most=1_000_000_000)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}


def validate(recipe: Any, error: Error) -> None:
    """Values that convert but are impossible; the encoding is built once to check its params."""
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
    if data.curriculum and not issubclass(TASKS[data.task], AlgorithmicTask):
        raise error(
            "data.curriculum",
            f"a size curriculum needs an algorithmic task (copy, sort, ...), not "
            f"{data.task!r}; set it to 0",
        )
    if data.ones != "binomial" and not issubclass(TASKS[data.task], Parity):
        raise error(
            "data.ones",
            f"the count of ones is drawn by parity tasks only, not {data.task!r}; "
            "set it to binomial",
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
    if model.random_positions:
        check_random_positions(recipe, error)
    if model.attention == "linear":
        check_linear_attention(recipe, error)
    check_window(model, error)


def check_window(model: ModelConfig, error: Any) -> None:
    """The pattern's options need a window, and a window needs softmax attention over the
    tokens' own consecutive positions."""
    extras = {"window_dilation": model.window_dilation > 1, "window_stride": model.window_stride,
              "window_global": model.window_global}  # fmt: skip
    for key, set_ in extras.items():
        if set_ and not model.window:
            raise error(f"model.{key}", "shapes a sparse window: set model.window too")
    if not model.window:
        return
    clashes = {
        "attention": (model.attention == "linear", "linear attention has no window"),
        "mem_len": (model.mem_len > 0, "window attention takes no memory; set it to 0"),
        "random_positions": (
            model.random_positions > 0,
            "the window counts offsets of consecutive positions; set it to 0",
        ),
    }
    for key, (clash, why) in clashes.items():
        if clash:
            raise error(f"model.{key}", f"{why} (model.window is {model.window})")


def check_linear_attention(recipe: Any, error: Any) -> None:
    """Linear attention keeps rotation, a bias of j - i, or input embeddings; nothing else."""
    from posenc_cli.encodings import encoding_class
    from posenc_cli.encodings.base import BackboneFacts
    from posenc_cli.models import linear_form

    cls = encoding_class(recipe.encoding.name)
    facts = BackboneFacts(dim=recipe.model.dim, heads=recipe.model.heads, causal=True)
    probe = cls(**facts.for_encoding(cls, dict(recipe.encoding.params)))
    if not linear_form.supports(probe):
        raise error(
            "model.attention",
            f"'linear' cannot keep {recipe.encoding.name!r}'s position term as set (it needs "
            "the softmax's pairwise logits, or a rotation beyond plain whole-head RoPE); use "
            "rope, alibi, t5, kerple, sandwich, none or an absolute encoding, or attention "
            "'softmax'",
        )
    if recipe.model.mem_len:
        raise error("model.attention", "'linear' takes no Transformer-XL memory; set mem_len 0")
    if recipe.model.random_positions and probe.toeplitz:
        raise error(
            "model.attention",
            "'linear' applies a bias of j - i over token indices; randomized positions would "
            "skip it: set model.random_positions 0",
        )
    if recipe.data.task != "text":
        raise error(
            "model.attention",
            f"'linear' runs on the corpus language model (data.task text), whose batches need no "
            f"padding mask; {recipe.data.task!r} pads its sequences",
        )


def longest_training_sequence(data: Any) -> int:
    """Tokens in the longest training sequence: an algorithmic task's layout, else the length."""
    cls = TASKS[data.task]
    if hasattr(cls, "layout"):
        return cls.from_config(data).layout(data.train_lengths[1]).length
    return data.train_lengths[1]


def check_random_positions(recipe: Any, error: Error) -> None:
    """Randomized positions that change nothing are an error, not a silent no-op."""
    span, key = recipe.model.random_positions, "model.random_positions"
    from posenc_cli.encodings import encoding_class

    if not encoding_class(recipe.encoding.name).reads_positions:
        raise error(
            key,
            f"encoding {recipe.encoding.name} reads no positions (its order comes from the "
            "content and the causal mask), so drawing them changes nothing",
        )
    if recipe.model.mem_len:
        raise error(key, "Transformer-XL memory counts positions across segments; set mem_len 0")
    longest = longest_training_sequence(recipe.data)
    if span <= longest:
        raise error(
            key,
            f"{span} <= the {longest} tokens of the longest training sequence: every position "
            f"would be drawn, a no-op; set it well above the longest test sequence (or 0)",
        )


def build_encoding_once(recipe: Any) -> None:
    """Build the recipe's encoding as the text model would, to check its parameters."""
    from posenc_cli.encodings import build_encoding, encoding_class
    from posenc_cli.encodings.base import BackboneFacts

    model, encoding = recipe.model, recipe.encoding
    # the longest trained size stands in for its length in tokens, which the model computes
    # from the task (reading a corpus here would slow every recipe load); any positive length
    # validates an 'auto' range the same way
    facts = BackboneFacts(
        dim=model.dim, heads=model.heads, causal=_causal(recipe.data.task),
        train_length=max(recipe.data.train_lengths),
    )  # fmt: skip
    cls = encoding_class(encoding.name)
    build_encoding(encoding.name, **facts.for_encoding(cls, dict(encoding.params)))
