"""Word order as a classification task: is A before B?

The source article's example: "I hit him" and "he hit me" hold the same words, and only their
order tells who hit whom. Here a sequence of ``length`` random filler tokens holds two marked
tokens A and B at distinct random positions; the label is 1 if A comes first, else 0.

Conventions:
- Token ids: PAD=0, A=1, B=2, then the ``vocab`` filler tokens from 3; no BOS (the classifier
  mean-pools over real tokens).
- Examples come in antithetic pairs: rows 2k and 2k+1 hold the same fillers, the second with A
  and B swapped, so they hold the same multiset of tokens and opposite labels. A model that sees
  no position (a bag of tokens, or a bidirectional encoder without position encoding) gives both
  rows the same output and scores exactly 50% on every even-sized batch, not just on average;
  each even batch is also exactly label-balanced. The row holding A first is a coin flip.
- ``length`` is the sequence length (>= 2). In training it is drawn per pair, uniformly in
  ``train_lengths``, and the batch is right-padded; see batch.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from posenc_cli.data.batch import (
    Batch,
    Split,
    key_mask_for,
    length_range,
    problem_sizes,
    size_groups,
)
from posenc_cli.errors import UsageError

PAD, A, B = 0, 1, 2
FILLER_OFFSET = 3


class WordOrder:
    kind: Literal["classify"] = "classify"
    num_classes = 2
    name = "word-order"

    def __init__(self, *, vocab: int = 16, train_lengths: Sequence[int] = (5, 20)) -> None:
        if vocab < 1:
            raise UsageError(f"data.vocab: word-order needs vocab >= 1, got {vocab}")
        self.vocab = vocab
        self.vocab_size = FILLER_OFFSET + vocab
        self.train_lengths = length_range(train_lengths, minimum=2)

    def tokens(self, length: int) -> int:
        """A sequence of ``length`` words is ``length`` tokens."""
        return length

    @classmethod
    def from_config(cls, cfg: Any) -> WordOrder:
        return cls(vocab=cfg.vocab, train_lengths=tuple(cfg.train_lengths))

    def pairs(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``count`` antithetic pairs of length n: tokens ``(2c, n)``, labels ``(2c,)``."""
        fill = torch.randint(0, self.vocab, (count, n), generator=generator) + FILLER_OFFSET
        i = torch.randint(0, n, (count,), generator=generator)
        j = torch.randint(0, n - 1, (count,), generator=generator)
        j = j + (j >= i).long()  # uniform over the positions other than i
        rows = torch.arange(count)
        first, second = fill.clone(), fill.clone()
        first[rows, i], first[rows, j] = A, B
        second[rows, i], second[rows, j] = B, A
        label = (i < j).long()  # (count,): 1 if A is first in `first`
        tokens = torch.stack([first, second], dim=1).reshape(2 * count, n)  # pairs on adjacent rows
        labels = torch.stack([label, 1 - label], dim=1).reshape(2 * count)
        return tokens, labels

    def batch(
        self, batch_size: int, length: int, generator: torch.Generator, split: Split
    ) -> Batch:
        if split == "test" and length < 2:
            raise UsageError(f"length: word-order needs a sequence length >= 2, got {length}")
        n_pairs = (batch_size + 1) // 2
        pair_sizes = problem_sizes(n_pairs, length, self.train_lengths, generator, split)
        lengths = pair_sizes.repeat_interleave(2)  # (2 n_pairs,)
        width = int(lengths.max())
        tokens = torch.full((2 * n_pairs, width), PAD, dtype=torch.long)  # (2P, T)
        labels = torch.zeros(2 * n_pairs, dtype=torch.long)  # (2P,)
        for n, pair_rows in size_groups(pair_sizes):
            rows = torch.stack([2 * pair_rows, 2 * pair_rows + 1], dim=1).reshape(-1)
            seq, lab = self.pairs(len(pair_rows), n, generator)
            tokens[rows, :n] = seq
            labels[rows] = lab
        lengths = lengths[:batch_size]  # an odd batch drops the last pair's second row
        width = int(lengths.max())
        tokens = tokens[:batch_size, :width]
        return Batch(tokens, labels[:batch_size], key_mask_for(lengths, width))
