"""Loss and accuracy of one batch, the same for training, evaluation and comparison.

Language-model tasks score only the target positions (targets != -100): per-token accuracy and
whole-sequence exact match, because at laptop budgets exact match past the trained length is
often 0 for every encoding and only per-token figures separate them. Classification scores one
label per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100


@dataclass
class Tally:
    """Sums over batches; ``summary()`` turns them into means."""

    loss_sum: float = 0.0
    tokens: int = 0
    correct: int = 0
    sequences: int = 0
    exact: int = 0
    extra: dict = field(default_factory=dict)

    def add(self, logits: Tensor, targets: Tensor, kind: str) -> Tensor:
        """Score a batch and return its mean loss (a tensor, for backward)."""
        if kind == "classify":
            loss = F.cross_entropy(logits.float(), targets)
            right = logits.argmax(-1) == targets  # (B,)
            self.loss_sum += float(loss.detach()) * len(targets)
            self.tokens += len(targets)
            self.correct += int(right.sum())
            self.sequences += len(targets)
            self.exact += int(right.sum())
            return loss
        flat = logits.float().reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE)
        scored = targets != IGNORE  # (B, T)
        right = (logits.argmax(-1) == targets) & scored
        count = int(scored.sum())
        self.loss_sum += float(loss.detach()) * count
        self.tokens += count
        self.correct += int(right.sum())
        self.sequences += len(targets)
        self.exact += int((right | ~scored).all(dim=-1).sum())
        return loss

    def merge(self, other: Tally) -> None:
        self.loss_sum += other.loss_sum
        self.tokens += other.tokens
        self.correct += other.correct
        self.sequences += other.sequences
        self.exact += other.exact

    def summary(self) -> dict[str, float]:
        loss = self.loss_sum / max(self.tokens, 1)
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "token_accuracy": self.correct / max(self.tokens, 1),
            "exact_match": self.exact / max(self.sequences, 1),
        }

    def as_tensor(self) -> Tensor:
        return torch.tensor(
            [self.loss_sum, self.tokens, self.correct, self.sequences, self.exact],
            dtype=torch.float64,
        )

    @classmethod
    def from_tensor(cls, t: Tensor) -> Tally:
        loss_sum, tokens, correct, sequences, exact = t.tolist()
        return cls(loss_sum, int(tokens), int(correct), int(sequences), int(exact))
