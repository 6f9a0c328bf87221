"""Text models: a decoder-only language model and a bidirectional sequence classifier.

Token embedding, the encoding's ``embed`` at the input (absolute encodings), pre-norm
``TransformerBlock``s whose attention consults the encoding's hooks, a final LayerNorm and a head.

Choices:
- LM (``kind="lm"``): causal attention and an untied linear head (with bias) to the vocabulary.
  Untied so every encoding is compared with the same head, and a tiny algorithmic vocabulary
  gains nothing from tying.
- Classifier (``kind="classify"``): bidirectional attention, mean over the real tokens
  (``key_mask``) of the final normalised states, then a linear head to ``num_classes``. No class
  token: it would carry a position of its own that absolute and relative encodings treat
  differently.
- Encodings with ``per_layer=True`` (Shaw, XL, DeBERTa) are built once per block; the others
  (T5, ALiBi, RoPE, sinusoidal, learned, none) are built once, registered once as
  ``self.encoding`` and handed to every block, so their parameters appear once in
  ``named_parameters``. The input ``embed`` is that shared instance's (or the first block's).
- Positions of the tokens are ``offset + M + arange(T)``, M the memory length: the attention
  module numbers keys ``offset .. offset + M + T - 1`` and takes the queries as the last T.
  ``offset`` shifts everything (translation tests); ``learned`` raises a UsageError past its
  table, which propagates.
- Init: token embedding normal with std 0.02 (GPT-2, BERT); the linear layers keep PyTorch's
  default; each encoding keeps its own paper's init.
- Sparse attention (``window``: ``TransformerBlock``'s window keywords): every block's
  attention sees the pattern's keys only (``kernels/visibility.py``).
- Dropout (``dropout``): on the embedded input, on the attention weights and on both residual
  branches of every block.

Transformer-XL memory (Dai et al. 2019, section 3.2), LM with ``mem_len > 0`` only:
``forward(tokens, memory=out.memory)`` gives block ``l`` the keys ``[memory[l]; x]``; the returned
``memory[l]`` is the last ``mem_len`` positions of ``[memory[l]; input of block l]``, detached
(fewer positions when fewer exist). Keep ``offset`` the same from segment to segment: positions
then continue after the memory, and relative encodings see true distances. A ``key_mask`` given
together with memory must cover memory and tokens, ``(B, M + T)``, as the attention module
expects; carrying the mask of the memory from segment to segment is the caller's job (text LMs
have no padding). A classifier or ``mem_len = 0`` returns ``memory=None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings import ENCODINGS, build_encoding, encoding_class, refuse_dims
from posenc_cli.encodings.base import BackboneFacts, PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.positions import padded_on_the_right
from posenc_cli.models.blocks import TransformerBlock

Kind = Literal["lm", "classify"]


@dataclass
class ModelOutput:
    logits: Tensor  # lm: (B, T, V); classify: (B, C)
    memory: list[Tensor] | None  # lm with mem_len > 0: per layer (B, <=mem_len, D), detached


def mean_pool(x: Tensor, key_mask: Tensor | None) -> Tensor:
    """Mean of ``x`` (B, T, D) over the tokens where ``key_mask`` (B, T) is True: ``(B, D)``."""
    if key_mask is None:
        return x.mean(dim=1)
    weight = key_mask.to(x.dtype)[..., None]  # (B, T, 1)
    return (x * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)


class TextModel(nn.Module):
    """Decoder-only LM or bidirectional classifier over token ids, with any 1D encoding."""

    def __init__(
        self,
        *,
        kind: Kind,
        vocab_size: int,
        num_classes: int = 0,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        mem_len: int = 0,
        attention: str = "softmax",
        window: Mapping[str, int] | None = None,
        encoding: str = "none",
        encoding_params: dict[str, Any] | None = None,
        train_length: int | None = None,
    ) -> None:
        super().__init__()
        check_model_args(kind, vocab_size, num_classes, dim, depth, heads, mem_len)
        refuse_dims(encoding, (1, 3), "a text model")  # N-D ones read (N,) on every axis
        self.kind: Kind = kind
        self.mem_len = mem_len
        causal = kind == "lm"
        params = dict(encoding_params or {})

        facts = BackboneFacts(dim=dim, heads=heads, causal=causal, train_length=train_length)
        args = facts.for_encoding(encoding_class(encoding), params)

        def make() -> PositionEncoding:
            return build_encoding(encoding, **args)

        # Registered before the blocks, so a shared table is named ``encoding.*``.
        self.encoding: PositionEncoding | None = None
        if not ENCODINGS[encoding].per_layer:
            self.encoding = make()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                heads,
                self.encoding if self.encoding is not None else make(),
                causal,
                mlp_ratio,
                dropout,
                form=attention,
                **(window or {}),
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size if causal else num_classes)

    @property
    def input_encoding(self) -> PositionEncoding:
        """The encoding whose ``embed`` is applied to the token embeddings."""
        return self.blocks[0].attn.encoding

    def forward(
        self,
        tokens: Tensor,
        key_mask: Tensor | None = None,
        memory: list[Tensor] | None = None,
        offset: int = 0,
        positions: Tensor | None = None,
    ) -> ModelOutput:
        """``tokens`` (B, T) long; ``key_mask`` (B, T), or (B, M + T) with memory, True = real
        token; ``memory`` per block (B, M, D) from the previous segment's output; ``offset`` added
        to every position; ``positions`` (T,) replaces ``0 .. T - 1`` (randomized positions).
        An LM's logits at padded positions are not defined."""
        plain = memory is None and not self.mem_len and key_mask is not None
        plain = plain and key_mask.shape == tokens.shape
        plain = plain and (positions is None or positions.shape == tokens.shape[1:])
        if self.kind == "lm" and plain:
            groups = self.length_groups(key_mask)
            if groups is not None:
                return self.grouped(groups, tokens, key_mask, offset, positions)
        return self.run(tokens, key_mask, memory, offset, positions)

    def length_groups(self, key_mask: Tensor) -> list[tuple[Tensor, int]] | None:
        """A right-padded LM batch of mixed lengths as two halves, the shorter rows cut to their
        longest, when that saves a quarter of their width: under the causal mask no real token
        sees the padding, so each row's logits are what it gets alone. A length-generalisation
        batch (sizes 1-20) is then cut from 43 tokens to about 24 for half its rows."""
        B, T = key_mask.shape
        if B < 2:
            return None
        lengths = key_mask.sum(-1)
        short, long = lengths.argsort().chunk(2)
        cut = max(1, int(lengths[short].max()))
        if 4 * cut > 3 * T or not padded_on_the_right(key_mask):
            return None
        return [(short, cut), (long, T)]

    def grouped(self, groups, tokens, key_mask, offset, positions) -> ModelOutput:
        """``run`` on each group's rows, cut to its width; the logits padded back with zeros and
        put in the batch's order."""
        T = tokens.shape[1]
        parts, rows = [], []
        for index, width in groups:
            cut = None if positions is None else positions[:width]
            out = self.run(tokens[index, :width], key_mask[index, :width], None, offset, cut)
            parts.append(F.pad(out.logits, (0, 0, 0, T - width)))
            rows.append(index)
        back = torch.cat(rows).argsort()
        return ModelOutput(torch.cat(parts)[back], None)

    def run(
        self,
        tokens: Tensor,
        key_mask: Tensor | None,
        memory: list[Tensor] | None,
        offset: int,
        positions: Tensor | None,
    ) -> ModelOutput:
        """``forward`` on the whole batch at once."""
        B, T = tokens.shape
        M = self.memory_length(memory, key_mask, T)
        explicit = None  # the blocks count from ``offset`` themselves unless told otherwise
        if positions is None:
            positions = torch.arange(offset + M, offset + M + T, device=tokens.device)
        elif memory is not None or positions.shape != (T,):
            raise ValueError(f"positions must be (T,) = ({T},) and come without memory")
        else:
            positions = explicit = positions.to(tokens.device) + offset
        x = self.token_embedding(tokens)  # (B, T, D)
        x = self.drop(self.input_encoding.embed(x, positions))
        new_memory: list[Tensor] | None = [] if self.mem_len else None
        for layer, block in enumerate(self.blocks):
            x, state = block(
                x,
                memory=None if memory is None else memory[layer],
                key_mask=key_mask,
                offset=offset,
                positions=explicit,
                mem_len=self.mem_len,
            )
            if new_memory is not None:
                new_memory.append(state)
        x = self.norm(x)
        if self.kind == "lm":
            return ModelOutput(self.head(x), new_memory)  # (B, T, V)
        return ModelOutput(self.head(mean_pool(x, key_mask)), None)  # (B, C)

    def memory_length(self, memory: list[Tensor] | None, key_mask: Tensor | None, T: int) -> int:
        """M, after checking that ``memory`` and ``key_mask`` fit this model and each other."""
        if memory is None:
            if key_mask is not None and key_mask.shape[-1] != T:
                raise ValueError(f"key_mask covers {key_mask.shape[-1]} tokens, the input has {T}")
            return 0
        if self.kind != "lm" or self.mem_len == 0:
            raise ValueError("memory is for language models built with mem_len > 0")
        if len(memory) != len(self.blocks):
            raise ValueError(f"memory has {len(memory)} layers, the model {len(self.blocks)}")
        M = memory[0].shape[1]
        if any(m.shape[1] != M for m in memory):
            raise ValueError("every layer's memory must have the same length")
        if key_mask is not None and key_mask.shape[-1] != M + T:
            raise ValueError(
                f"with memory, key_mask must cover memory and tokens ({M} + {T}), "
                f"got {key_mask.shape[-1]}"
            )
        return M


def check_model_args(
    kind: str, vocab_size: int, num_classes: int, dim: int, depth: int, heads: int, mem_len: int
) -> None:
    """Raise a one-line UsageError for a model that cannot be built."""
    if kind not in ("lm", "classify"):
        raise UsageError(f"task kind must be 'lm' or 'classify', got {kind!r}")
    if heads < 1 or dim < 1 or dim % heads:
        raise UsageError(
            f"model.dim ({dim}) must be a positive multiple of model.heads ({heads}); "
            "change one of them"
        )
    if depth < 1:
        raise UsageError(f"model.depth must be >= 1, got {depth}")
    if mem_len < 0:
        raise UsageError(f"model.mem_len must be >= 0 (0 = no memory), got {mem_len}")
    if kind == "classify" and mem_len:
        raise UsageError("model.mem_len is for language-model tasks; set model.mem_len=0")
    if vocab_size < 1:
        raise UsageError(f"the task's vocabulary must have >= 1 symbol, got {vocab_size}")
    if kind == "classify" and num_classes < 2:
        raise UsageError(f"a classification task needs >= 2 classes, got {num_classes}")


def sequence_window(model: Any) -> dict[str, int] | None:
    """``TransformerBlock``'s sparse-pattern keywords from a recipe's model section, or None
    for full attention."""
    if not getattr(model, "window", 0):
        return None
    return {
        "window": model.window,
        "dilation": model.window_dilation,
        "stride": model.window_stride or None,
        "global_tokens": model.window_global,
    }


def build_text_model(model: Any, encoding: Any, task: Any, data: Any = None) -> TextModel:
    """Build from a ``ModelConfig``, an ``EncodingConfig`` and a ``Task`` (read by attribute);
    with the ``data`` section, encodings also learn the longest trained sequence in tokens
    (``train_length``, which 'auto' ranges derive from)."""
    train_length = None
    if data is not None:  # randomized positions spread a sequence over their whole span
        span = getattr(model, "random_positions", 0) or 0
        train_length = max(task.tokens(max(data.train_lengths)), span)
    return TextModel(
        kind=task.kind,
        vocab_size=task.vocab_size,
        num_classes=getattr(task, "num_classes", 0),
        dim=model.dim,
        depth=model.depth,
        heads=model.heads,
        mlp_ratio=model.mlp_ratio,
        dropout=model.dropout,
        mem_len=model.mem_len,
        attention=getattr(model, "attention", "softmax"),
        window=sequence_window(model),
        encoding=encoding.name,
        encoding_params=encoding.params,
        train_length=train_length,
    )
