"""Accuracy over the positions a task scores: per-token accuracy and exact match.

A prediction is the arg-max id (``logits.argmax(-1)``) with the same shape as the targets: an LM
batch scores every position whose target is not ``IGNORE``; a classification batch ``(B,)`` is
one scored position per example. ``Score`` holds counts, so scores of several batches add up
exactly (``sum(scores, Score())``) before the ratios are taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from posenc_cli.data.batch import IGNORE


@dataclass(frozen=True)
class Score:
    correct: int = 0  # scored positions predicted right
    scored: int = 0  # scored positions
    exact: int = 0  # sequences with every scored position right
    sequences: int = 0  # sequences with at least one scored position

    def __add__(self, other: Score) -> Score:
        return Score(
            self.correct + other.correct,
            self.scored + other.scored,
            self.exact + other.exact,
            self.sequences + other.sequences,
        )

    @property
    def token_accuracy(self) -> float:
        return self.correct / self.scored if self.scored else float("nan")

    @property
    def exact_match(self) -> float:
        return self.exact / self.sequences if self.sequences else float("nan")


def exact_rows(predictions: Tensor, targets: Tensor) -> Tensor:
    """``(B,)`` for ``(B, T)`` inputs: True where a row has scored positions and predicts every
    one right, the rows exact match counts (``posenc evaluate --misses`` lists the others)."""
    scored = targets != IGNORE
    per_row = scored.sum(1)
    return (((predictions == targets) & scored).sum(1) == per_row) & (per_row > 0)


def score(predictions: Tensor, targets: Tensor) -> Score:
    """Counts for one batch; ``predictions`` and ``targets`` are ``(B, T)`` or ``(B,)``."""
    if predictions.shape != targets.shape:
        raise ValueError(
            f"predictions {tuple(predictions.shape)} != targets {tuple(targets.shape)}"
        )
    if targets.dim() == 1:  # classification: one scored position per example
        predictions, targets = predictions[:, None], targets[:, None]
    scored = targets != IGNORE  # (B, T)
    right = (predictions == targets) & scored  # (B, T)
    per_row = scored.sum(1)  # (B,)
    has_any = per_row > 0
    return Score(
        correct=int(right.sum()),
        scored=int(per_row.sum()),
        exact=int(exact_rows(predictions, targets).sum()),
        sequences=int(has_any.sum()),
    )
