"""Procedural sequence-to-sequence tasks for a causal LM: copy, reverse, sort, recall, addition
(also with index hints), summation and parity, the last two also with a scratchpad.

Small algorithmic tasks are where length generalisation of position encodings is usually
measured (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization
in Transformers": train on sizes up to 20, test up to 40).

Layout of one example (``Layout`` computes the indices)::

    [BOS] input [SEP] output [EOS]      then PAD up to the longest row of the batch

Targets are the next token on the output span only: ``targets[t] = tokens[t + 1]`` for ``t``
from the SEP position to the last output token (so the model predicts every output token and
then EOS from everything before it), ``IGNORE`` everywhere else.

Conventions:
- Token ids: PAD=0, BOS=1, SEP=2, EOS=3, then the task's own specials (addition: PLUS=4;
  addition-hints: PLUS and then its 64 index hints), then
  the ``vocab`` symbols from ``symbol_offset``. ``vocab_size`` counts all of them.
- ``length`` is the problem size n: the number of input symbols (copy, reverse, sort), the
  number of key-value pairs (recall), the digits per operand (addition).
- In training the size is drawn per example, uniformly in ``train_lengths`` (see batch.py),
  so a training batch mixes sizes and is right-padded; a test batch has one size, no padding.
- copy / reverse / sort: n symbols drawn uniformly with replacement; sort is ascending by id.
- recall: n pairs ``k1 v1 ... kn vn`` with distinct keys and free values, then a query key
  drawn among the n keys; the output is its value (one token). Keys and values share the symbol
  set, so a key is told from a value only by its position in the pair (even offset), which makes
  the task position-sensitive on purpose. It needs n <= vocab.
- addition: base = ``vocab`` (vocab 10 is decimal). Input ``a PLUS b``, two n-digit operands
  drawn digit by digit, so leading zeros occur; output the n + 1 digits of a + b (the top digit
  is the final carry, 0 or 1). Every number is written least-significant digit first: output
  digit i then depends only on input digits i and the carry of the digit just emitted, so a
  left-to-right decoder can compute the sum one digit at a time; most-significant-first would
  need the whole carry chain before the first output digit.
- addition-hints: the same sums with a hint before every digit, ``h a0 h' a1 ... + h b0 h' b1 ...``
  and ``h c0 h' c1 ...``, so digit i's partners share its hint; the hints of the sum are given
  (their targets IGNORE). See ``AdditionHints``.
- summation: n digits in base ``vocab``; the output is one token, their sum modulo ``vocab``
  (Kazemnejad et al.'s "summation", there in base 10).
- parity: n bits (``vocab`` is ignored: the symbols are always 0 and 1); the output is one
  token, 1 when the count of ones is odd. It is summation in base 2.
- parity with ``ones="uniform"`` (``data.ones``): training rows draw their count of ones
  uniformly in 0..n, then where the ones go. With fair bits a count far from n / 2 is rare (15
  or more ones of 20: 2 %), and a model that counts misses just those rows; test batches keep
  fair bits, so the test is the published one.
- summation-scratchpad / parity-scratchpad: the same inputs; the output writes the running sum
  after every digit (n tokens), so the answer is the last one. Each step then needs only the
  digit it has reached and the step before it, as copy needs one input symbol per output; the
  one-token versions ask for all n digits at once. Kazemnejad et al. study scratchpads on
  these tasks and find that their format matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from posenc_cli.data.batch import (
    IGNORE,
    Batch,
    Split,
    key_mask_for,
    length_range,
    problem_sizes,
    size_groups,
)
from posenc_cli.errors import UsageError

PAD, BOS, SEP, EOS = 0, 1, 2, 3
PLUS = 4  # addition only: between the two operands


@dataclass(frozen=True)
class Layout:
    """Where things sit in one unpadded example: ``[BOS] input [SEP] output [EOS]``."""

    input_len: int
    output_len: int

    @property
    def length(self) -> int:
        return self.input_len + self.output_len + 3

    @property
    def sep(self) -> int:
        return self.input_len + 1

    @property
    def input(self) -> slice:
        return slice(1, self.sep)

    @property
    def output(self) -> slice:
        return slice(self.sep + 1, self.sep + 1 + self.output_len)

    @property
    def targets(self) -> slice:
        """Positions that carry a loss: SEP .. last output token (they predict outputs + EOS)."""
        return slice(self.sep, self.sep + 1 + self.output_len)


class AlgorithmicTask:
    """Shared batching; a subclass says how long input and output are and how to make them."""

    kind: Literal["lm"] = "lm"
    num_classes = 0
    name = ""
    symbol_offset = 4  # first symbol id, after PAD, BOS, SEP, EOS
    min_vocab = 2

    def __init__(self, *, vocab: int = 16, train_lengths: Sequence[int] = (5, 20)) -> None:
        if vocab < self.min_vocab:
            raise UsageError(
                f"data.vocab: {self.name} needs vocab >= {self.min_vocab}, got {vocab}"
            )
        self.vocab = vocab
        self.vocab_size = self.symbol_offset + vocab
        self.train_lengths = length_range(train_lengths, minimum=1)
        self.check_size(self.train_lengths[1], "data.train_lengths")

    @classmethod
    def from_config(cls, cfg: Any) -> AlgorithmicTask:
        return cls(vocab=cfg.vocab, train_lengths=tuple(cfg.train_lengths))

    def input_length(self, n: int) -> int:
        return n

    def tokens(self, n: int) -> int:
        """Tokens of one problem of size n, BOS, SEP and EOS included."""
        return self.layout(n).length

    def output_length(self, n: int) -> int:
        return n

    def layout(self, n: int) -> Layout:
        return Layout(self.input_length(n), self.output_length(n))

    def check_size(self, n: int, where: str) -> None:
        if n < 1:
            raise UsageError(f"{where}: {self.name} needs a problem size >= 1, got {n}")

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``count`` problems of size n as token ids: inputs ``(c, Lin)``, outputs ``(c, Lout)``."""
        raise NotImplementedError

    def symbols(self, count: int, n: int, generator: torch.Generator) -> Tensor:
        """Uniform symbols with replacement, as token ids, ``(count, n)``."""
        return torch.randint(0, self.vocab, (count, n), generator=generator) + self.symbol_offset

    def make_train(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Training problems: the test's distribution unless a task says otherwise."""
        return self.make(count, n, generator)

    def examples(
        self, n: int, count: int, generator: torch.Generator, split: Split = "test"
    ) -> tuple[Tensor, Tensor]:
        """Unpadded sequences and targets of one size, both ``(count, layout.length)``."""
        lay = self.layout(n)
        make = self.make_train if split == "train" else self.make
        inputs, outputs = make(count, n, generator)
        col = torch.full((count, 1), 0, dtype=torch.long)
        tokens = torch.cat([col + BOS, inputs, col + SEP, outputs, col + EOS], dim=1)  # (c, L)
        targets = torch.full_like(tokens, IGNORE)
        span = lay.targets
        targets[:, span] = tokens[:, span.start + 1 : span.stop + 1]
        return tokens, targets

    def batch(
        self,
        batch_size: int,
        length: int,
        generator: torch.Generator,
        split: Split,
        largest: int | None = None,
    ) -> Batch:
        """``largest``: training draws sizes up to it only (a length curriculum)."""
        lo, hi = self.train_lengths
        sizes_from = (lo, hi if largest is None else max(lo, min(hi, largest)))
        sizes = problem_sizes(batch_size, length, sizes_from, generator, split)
        if split == "test":
            self.check_size(length, "length")
        lengths = torch.tensor([self.layout(n).length for n in sizes.tolist()], dtype=torch.long)
        width = int(lengths.max())
        tokens = torch.full((batch_size, width), PAD, dtype=torch.long)  # (B, T)
        targets = torch.full((batch_size, width), IGNORE, dtype=torch.long)  # (B, T)
        for n, rows in size_groups(sizes):
            seq, tgt = self.examples(n, len(rows), generator, split)
            tokens[rows, : seq.shape[1]] = seq
            targets[rows, : seq.shape[1]] = tgt
        return Batch(tokens, targets, key_mask_for(lengths, width))


class Copy(AlgorithmicTask):
    name = "copy"

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = self.symbols(count, n, generator)
        return x, x.clone()


class Reverse(AlgorithmicTask):
    name = "reverse"

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = self.symbols(count, n, generator)
        return x, x.flip(1)


class Sort(AlgorithmicTask):
    name = "sort"

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x = self.symbols(count, n, generator)
        return x, x.sort(dim=1).values


class Recall(AlgorithmicTask):
    name = "recall"

    def input_length(self, n: int) -> int:
        return 2 * n + 1

    def output_length(self, n: int) -> int:
        return 1

    def check_size(self, n: int, where: str) -> None:
        super().check_size(n, where)
        if n > self.vocab:
            raise UsageError(
                f"{where}: recall with {n} pairs needs {n} distinct keys but data.vocab is "
                f"{self.vocab}; raise data.vocab to at least {n} or use smaller sizes"
            )

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        # distinct keys: the first n of a random permutation of the symbols, per row
        order = torch.rand(count, self.vocab, generator=generator).argsort(dim=1)  # (c, V)
        keys = order[:, :n] + self.symbol_offset  # (c, n)
        values = self.symbols(count, n, generator)  # (c, n)
        pick = torch.randint(0, n, (count, 1), generator=generator)  # (c, 1)
        pairs = torch.stack([keys, values], dim=2).reshape(count, 2 * n)  # k1 v1 k2 v2 ...
        inputs = torch.cat([pairs, keys.gather(1, pick)], dim=1)  # (c, 2n + 1)
        return inputs, values.gather(1, pick)


class Addition(AlgorithmicTask):
    name = "addition"
    symbol_offset = 5  # PAD, BOS, SEP, EOS, PLUS

    def input_length(self, n: int) -> int:
        return 2 * n + 1

    def output_length(self, n: int) -> int:
        return n + 1

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a, b, total = self.operands(count, n, generator)
        return torch.cat([a, plus_column(count), b], dim=1), total

    def operands(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, ...]:
        """Both operands ``(c, n)`` and their sum ``(c, n + 1)``, least significant digit first,
        as token ids."""
        base, off = self.vocab, self.symbol_offset
        a = torch.randint(0, base, (count, n), generator=generator)
        b = torch.randint(0, base, (count, n), generator=generator)
        return a + off, b + off, add_digits(a, b, base) + off


class AdditionHints(Addition):
    """Addition with index hints (Zhou et al. 2024): every digit follows a hint token naming its
    place, the same hint in both operands and the sum, so digit i of a and of b can be found by
    content where plain addition must find them by position, 2n + 1 tokens apart.

    A row's hints are ``hints`` consecutive symbols of an ordered set, from a random start, so a
    longer test problem uses hints (and hint successions) that training has shown. The hints in
    the sum are given, not scored: the model answers the digits and the end token."""

    name = "addition-hints"
    hints = 64  # ordered hint symbols; a problem of n digits uses n + 1 of them
    first_hint = PLUS + 1
    symbol_offset = first_hint + hints

    def input_length(self, n: int) -> int:
        return 4 * n + 1

    def output_length(self, n: int) -> int:
        return 2 * (n + 1)

    def check_size(self, n: int, where: str) -> None:
        super().check_size(n, where)
        if n + 1 > self.hints:
            raise UsageError(
                f"{where}: addition-hints has {self.hints} hint symbols, enough for "
                f"{self.hints - 1} digits per operand; got {n}; use smaller sizes"
            )

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a, b, total = self.operands(count, n, generator)  # drawn first: plain addition's digits
        start = torch.randint(0, self.hints - n, (count, 1), generator=generator)  # (c, 1)
        hint = start + torch.arange(n + 1) + self.first_hint  # (c, n + 1)
        inputs = [interleave(hint[:, :n], a), plus_column(count), interleave(hint[:, :n], b)]
        return torch.cat(inputs, dim=1), interleave(hint, total)

    def examples(
        self, n: int, count: int, generator: torch.Generator, split: Split = "test"
    ) -> tuple[Tensor, Tensor]:
        tokens, targets = super().examples(n, count, generator, split)
        given = (targets >= self.first_hint) & (targets < self.symbol_offset)
        return tokens, targets.masked_fill(given, IGNORE)


def plus_column(count: int) -> Tensor:
    """The ``+`` between the operands, one per row, ``(count, 1)``."""
    return torch.full((count, 1), PLUS, dtype=torch.long)


def interleave(hints: Tensor, digits: Tensor) -> Tensor:
    """``h0 d0 h1 d1 ...`` from ``(c, m)`` hints and digits -> ``(c, 2m)``."""
    return torch.stack([hints, digits], dim=2).reshape(hints.shape[0], -1)


class Summation(AlgorithmicTask):
    name = "summation"
    scratchpad = False  # True: write every running sum, not only the last

    def output_length(self, n: int) -> int:
        return n if self.scratchpad else 1

    def base(self) -> int:
        return self.vocab

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.answer(torch.randint(0, self.base(), (count, n), generator=generator))

    def answer(self, digits: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and outputs as token ids for digits ``(c, n)``."""
        base, off = self.base(), self.symbol_offset
        running = digits.cumsum(1) % base  # (c, n)
        answer = running if self.scratchpad else running[:, -1:]
        return digits + off, answer + off


class Parity(Summation):
    name = "parity"

    def __init__(
        self,
        *,
        vocab: int = 2,
        train_lengths: Sequence[int] = (5, 20),
        ones: Literal["binomial", "uniform"] = "binomial",
    ) -> None:
        super().__init__(vocab=2, train_lengths=train_lengths)  # bits, whatever data.vocab says
        self.ones = ones  # training rows' draw
        self.test_ones: Literal["binomial", "uniform"] = "binomial"  # `evaluate --by-count`

    @classmethod
    def from_config(cls, cfg: Any) -> AlgorithmicTask:
        return cls(train_lengths=tuple(cfg.train_lengths), ones=cfg.ones)

    def base(self) -> int:
        return 2

    def make(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.answer(draw_bits(count, n, generator, self.test_ones))

    def make_train(self, count: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.answer(draw_bits(count, n, generator, self.ones))


def draw_bits(
    count: int, n: int, generator: torch.Generator, ones: Literal["binomial", "uniform"]
) -> Tensor:
    """``(count, n)`` bits: fair ones (their count binomial), or a count of ones uniform in 0..n
    at random places."""
    if ones == "binomial":
        return torch.randint(0, 2, (count, n), generator=generator)
    drawn = torch.randint(0, n + 1, (count, 1), generator=generator)  # (c, 1)
    places = torch.rand(count, n, generator=generator).argsort(dim=1)  # a random order
    return (places < drawn).long()  # the first `drawn` places of it hold a 1


class SummationScratchpad(Summation):
    name = "summation-scratchpad"
    scratchpad = True


class ParityScratchpad(Parity):
    name = "parity-scratchpad"
    scratchpad = True


def add_digits(a: Tensor, b: Tensor, base: int) -> Tensor:
    """Digit-wise sum of least-significant-first numbers ``(c, n)`` -> ``(c, n + 1)``."""
    out = torch.zeros(a.shape[0], a.shape[1] + 1, dtype=torch.long)
    carry = torch.zeros(a.shape[0], dtype=torch.long)
    for i in range(a.shape[1]):
        s = a[:, i] + b[:, i] + carry
        out[:, i] = s % base
        carry = s // base
    out[:, -1] = carry
    return out
