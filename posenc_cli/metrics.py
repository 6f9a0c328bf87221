"""Loss and accuracy over batches, the same for training, evaluation and comparison.

Counting is ``posenc_cli.data.score``'s (target positions only: per-token accuracy and
whole-sequence exact match, because at laptop budgets exact match past the trained length is
often 0 for every encoding and only per-token figures separate them); this adds the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor

from posenc_cli.data import Score, score
from posenc_cli.data.batch import IGNORE


@dataclass
class Tally:
    """Sums over batches; ``summary()`` turns them into means."""

    loss_sum: float = 0.0
    counts: Score = field(default_factory=Score)

    def add(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Score a batch and return its mean loss (a tensor, for backward)."""
        flat = logits.float().reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE)
        batch = score(logits.argmax(-1), targets)
        self.loss_sum += float(loss.detach()) * batch.scored
        self.counts = self.counts + batch
        return loss

    def summary(self) -> dict[str, float]:
        c = self.counts
        loss = self.loss_sum / max(c.scored, 1)
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "token_accuracy": c.correct / max(c.scored, 1),
            "exact_match": c.exact / max(c.sequences, 1),
        }
