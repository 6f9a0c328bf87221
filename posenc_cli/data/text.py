"""Character-level language modelling on a real text corpus.

Conventions:
- Corpus: ``data.corpus`` is a file (read whatever its suffix) or a folder (every ``*.txt``,
  ``*.py`` and ``*.md`` file below it, sorted by relative path, concatenated as is, uncapped).
  ``null`` means the built-in corpus: the top-level ``*.py`` files of the running Python's
  standard library (``sysconfig.get_paths()["stdlib"]``), sorted by name, concatenated and cut
  at ``DEFAULT_CHARS`` characters. Top level only keeps ``site-packages`` and the test suite out.
  The text is deterministic for one Python version; another version gives another corpus.
  The built-in corpus is built once per process (``functools.lru_cache``).
- Files are read as UTF-8; undecodable bytes become U+FFFD instead of failing the run.
- Vocabulary: the sorted set of characters of the whole corpus (by code point), ids 0..C-1,
  plus one unknown id C for characters of other text passed to ``encode``. There is no padding.
- Split: the last ``val_fraction`` of the characters is the validation ("test") split, the rest
  is training; no window crosses the boundary.
- ``batch(B, T, gen, split)`` draws B window starts uniformly, takes T + 1 characters, and
  returns tokens = the first T and targets = the last T (every position scored). Unlike the
  algorithmic tasks, ``length`` is honoured in both splits.
- ``stream(split)`` is the whole split as one id tensor, for long-text evaluation with memory.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from posenc_cli.data.batch import Batch, Split
from posenc_cli.errors import UsageError

SUFFIXES = (".txt", ".py", ".md")
DEFAULT_CHARS = 3_000_000  # about 3 MB of stdlib source: large enough to learn, quick to build
FIX = "give a text file, a folder of .txt/.py/.md files, or null for the built-in stdlib corpus"


def corpus_files(path: Path) -> list[Path]:
    """The files a corpus path stands for, in a fixed order."""
    if path.is_file():
        return [path]
    found = [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(found, key=lambda p: p.relative_to(path).as_posix())


def read_files(files: list[Path], limit: int | None = None) -> str:
    """Concatenate files in order, stopping at ``limit`` characters when one is given."""
    parts: list[str] = []
    total = 0
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if limit is not None and total + len(text) >= limit:
            parts.append(text[: limit - total])
            break
        parts.append(text)
        total += len(text)
    return "".join(parts)


def read_corpus(corpus: str | Path | None) -> str:
    """The corpus text; a missing path or an empty corpus is a UsageError naming data.corpus."""
    if corpus is None:
        return stdlib_text()
    path = Path(corpus).expanduser()
    if not path.exists():
        raise UsageError(f"data.corpus: no such file or folder {str(path)!r}; {FIX}")
    text = read_files(corpus_files(path))
    if not text:
        raise UsageError(f"data.corpus: {str(path)!r} holds no text; {FIX}")
    return text


@functools.lru_cache(maxsize=2)
def stdlib_text(limit: int = DEFAULT_CHARS) -> str:
    """The built-in corpus: top-level standard-library sources, sorted, cut at ``limit``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py")) if root.is_dir() else []
    text = read_files(files, limit)
    if not text:
        raise UsageError(
            f"data.corpus: the built-in corpus found no Python sources in {str(root)!r}; "
            "set data.corpus to a text file or folder"
        )
    return text


def code_points(text: str) -> Tensor:
    """Unicode code points of ``text``, ``(len,)`` int32, without a Python loop per character."""
    if not text:
        return torch.zeros(0, dtype=torch.int32)
    return torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)


def build_vocabulary(text: str) -> tuple[Tensor, Tensor]:
    """Sorted distinct code points ``(C,)`` long and the text as ids into them ``(len,)`` long."""
    codes = code_points(text).long()
    present = torch.bincount(codes) > 0  # (max code + 1,): linear time, unlike a sort
    rank = present.cumsum(0) - 1  # code point -> its index among the present ones
    return present.nonzero().squeeze(1), rank[codes]


@functools.lru_cache(maxsize=2)
def stdlib_vocabulary(limit: int = DEFAULT_CHARS) -> tuple[Tensor, Tensor]:
    """The built-in corpus, encoded once per process (the ids are shared: do not modify)."""
    return build_vocabulary(stdlib_text(limit))


class TextTask:
    kind: Literal["lm"] = "lm"
    num_classes = 0
    name = "text"

    def __init__(self, *, corpus: str | Path | None = None, val_fraction: float = 0.1) -> None:
        if not 0.0 < val_fraction < 1.0:
            raise UsageError(
                f"data.val_fraction: must be between 0 and 1 (exclusive), got {val_fraction}"
            )
        if corpus is None:
            self.points, ids = stdlib_vocabulary()
        else:
            self.points, ids = build_vocabulary(read_corpus(corpus))
        self.chars = "".join(map(chr, self.points.tolist()))
        self.unknown_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1
        cut = len(ids) - round(len(ids) * val_fraction)
        if cut <= 1 or cut >= len(ids) - 1:
            raise UsageError(
                f"data.val_fraction: {val_fraction} leaves an empty split of a "
                f"{len(ids)}-character corpus; use a larger data.corpus or another fraction"
            )
        self.splits = {"train": ids[:cut], "test": ids[cut:]}  # views, (N_train,), (N_val,)

    def tokens(self, length: int) -> int:
        """A segment of ``length`` characters is ``length`` tokens."""
        return length

    @classmethod
    def from_config(cls, cfg: Any) -> TextTask:
        return cls(corpus=cfg.corpus, val_fraction=cfg.val_fraction)

    def encode(self, text: str) -> Tensor:
        """Ids of any text, ``(len,)`` long; characters outside the corpus get ``unknown_id``."""
        points = code_points(text).long()
        where = torch.searchsorted(self.points, points).clamp(max=len(self.chars) - 1)
        known = self.points[where] == points
        return torch.where(known, where, torch.full_like(where, self.unknown_id))

    def decode(self, ids: Tensor) -> str:
        return "".join(
            self.chars[i] if i < self.unknown_id else "\ufffd" for i in ids.reshape(-1).tolist()
        )

    def stream(self, split: Split) -> Tensor:
        """The whole split as ids, ``(N,)`` long; a shared view, so read it, do not write it."""
        if split not in self.splits:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return self.splits[split]

    def batch(
        self, batch_size: int, length: int, generator: torch.Generator, split: Split
    ) -> Batch:
        data = self.stream(split)
        if length < 1 or length + 1 > len(data):
            raise UsageError(
                f"length: text windows of {length} + 1 characters do not fit the {split} split "
                f"({len(data)} characters); use shorter lengths or a larger data.corpus"
            )
        starts = torch.randint(0, len(data) - length, (batch_size, 1), generator=generator)
        window = data[starts + torch.arange(length + 1)]  # (B, T + 1)
        return Batch(window[:, :-1].contiguous(), window[:, 1:].contiguous(), None)
