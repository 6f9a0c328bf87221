"""Sparse attention on an image grid: local, dilated and strided windows, global tokens.

Every pattern here is a fixed list of slots, each a 2D offset (query minus key) shared by every
patch query, which is what lets a relative encoding compute its term per slot once
(``window_bias`` / ``window_value``). Cost O(N K d) for K slots instead of O(N^2 d).

- Local window (``window`` k): the ``k x k`` patches around the query, the source article's
  suggestion for long image sequences.
- Dilated window (``dilation`` d, as in dilated convolutions and the sparse patterns of the source
  article's section 5): the ``k x k`` slots d patches apart, reaching ``(k - 1) d + 1`` patches for
  the same cost.
- Strided window (``stride`` s): the local slots plus a ``k x k`` lattice of slots s patches
  apart centred on the query, reach ``(k // 2) s``. It carries Child et al. 2019 ("Generating Long
  Sequences with Sparse Transformers") strided pattern to the 2D grid: their query sees the
  previous l positions and every l-th one; here it sees its window and every s-th patch of a
  coarse lattice. Child's lattice spans the whole sequence (O(N sqrt N) at l = sqrt N); this one
  is bounded to k x k points so the cost stays O(N k^2). With ``s = k`` (Child's l = stride)
  two hops, a lattice slot then a local one, reach every patch of a ``k^2 x k^2`` square.
  Lattice slots that coincide with local ones are dropped, so no key is counted twice.
- Global tokens: the prefix (class) tokens, and with ``global_tokens`` G also the first G patches
  in row-major order (BigBird's ITC form, Zaheer et al. 2020, "Big Bird: Transformers for Longer
  Sequences"; Longformer's global attention, Beltagy et al. 2020), attend to every token and are
  attended by every token. Their pairs take the encoding's ordinary ``bias`` / ``value`` hooks
  on the real positions, so the relative terms stay exact; a window slot that lands on a global
  patch is masked, the pair being counted once, as a global one.

Keys of each query's slots are gathered into ``(B, H, N, K, d)``: memory linear in the number of
patches, traded for one batched contraction instead of a Python loop over slots.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, grid_shape
from posenc_cli.errors import UsageError


def _square(window: int, spacing: int, device=None) -> Tensor:
    """Offsets of a ``window x window`` square of slots ``spacing`` apart, ``(k*k, 2)``, in the
    row-major order of the key's place (the first slot is the key up and left)."""
    r = window // 2
    steps = torch.arange(-r, r + 1, device=device) * spacing
    key_rows, key_cols = torch.meshgrid(steps, steps, indexing="ij")
    return -torch.stack([key_rows.flatten(), key_cols.flatten()], dim=-1)


def slot_offsets(window: int, device=None, dilation: int = 1, stride: int | None = None) -> Tensor:
    """(row, col) of the query minus that of the key for each slot, ``(K, 2)``: the local (or
    dilated) window's ``k*k`` slots, then the strided lattice's that the window lacks."""
    local = _square(window, dilation, device)
    if stride is None:
        return local
    lattice = _square(window, stride, device)
    seen = (lattice[:, None] == local[None]).all(-1).any(-1)  # (k*k,) already a local slot
    return torch.cat([local, lattice[~seen]])


def slot_keys(height: int, width: int, offsets: Tensor) -> Tensor:
    """Index of each query's key in every slot, ``(h*w, K)``; ``h*w`` (one past the last patch)
    where the slot falls off the grid."""
    device = offsets.device
    rows = torch.arange(height, device=device).repeat_interleave(width)[:, None]
    cols = torch.arange(width, device=device).repeat(height)[:, None]
    key_rows, key_cols = rows - offsets[:, 0], cols - offsets[:, 1]  # (h*w, K)
    on_grid = (key_rows >= 0) & (key_rows < height) & (key_cols >= 0) & (key_cols < width)
    return torch.where(on_grid, key_rows * width + key_cols, height * width)


def gather_slots(x: Tensor, keys: Tensor) -> Tensor:
    """``(B, H, h*w, d)`` patches -> ``(B, H, Nq, K, d)``, the keys of ``keys`` ``(Nq, K)``;
    off-grid slots read a zero row. Any list of slots."""
    B, H, _, d = x.shape
    padded = torch.cat([x, x.new_zeros(B, H, 1, d)], dim=2)
    return padded.index_select(2, keys.flatten()).view(B, H, *keys.shape, d)


def gather_windows(
    x: Tensor, height: int, width: int, window: int, dilation: int = 1, stride: int | None = None
) -> Tensor:
    """``(B, H, h*w, d)`` patches -> ``(B, H, h*w, K, d)``: each patch's slots, zero-padded, in
    ``slot_offsets``' order."""
    if stride is not None:
        offsets = slot_offsets(window, x.device, dilation, stride)
        return gather_slots(x, slot_keys(height, width, offsets))
    # a square of slots: unfold, which measured 15-25% faster in the forward than gather_slots
    B, H, _, d = x.shape
    r = (window // 2) * dilation
    span = 2 * r + 1
    grid = x.reshape(B, H, height, width, d)
    padded = F.pad(grid, (0, 0, r, r, r, r))  # (B, H, h + 2r, w + 2r, d)
    windows = padded.unfold(2, span, 1).unfold(3, span, 1)  # (B, H, h, w, d, span, span)
    windows = windows[..., ::dilation, ::dilation]  # (B, H, h, w, d, k, k)
    return windows.permute(0, 1, 2, 3, 5, 6, 4).reshape(B, H, height * width, window**2, d)


def valid_slots(
    height: int, width: int, window: int, device=None, dilation: int = 1, stride: int | None = None
) -> Tensor:
    """True where a slot falls on the grid, ``(h*w, K)``."""
    offsets = slot_offsets(window, device, dilation, stride)
    return slot_keys(height, width, offsets) < height * width


@lru_cache(maxsize=16)
def slot_table(
    height: int,
    width: int,
    window: int,
    dilation: int,
    stride: int | None,
    global_tokens: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """The pattern's ``(K, 2)`` offsets, and for every patch query ``(N, K)`` its key indices
    and which slots count: on the grid, and not a global patch (whose pair the global columns
    already hold). Cached: on a loaded CPU these small integer ops measured a fifth of a
    4,096-patch forward."""
    offsets = slot_offsets(window, device, dilation, stride)
    keys = slot_keys(height, width, offsets)
    return offsets, keys, (keys < height * width) & (keys >= global_tokens)


def check_pattern(
    window: int | None, dilation: int = 1, stride: int | None = None, global_tokens: int = 0
) -> None:
    """One-line errors for a sparse pattern's options, before any grid is seen."""
    if window is not None and (window < 1 or window % 2 == 0):
        raise UsageError(f"window must be an odd number of patches >= 1, got {window}")
    if dilation < 1 or (dilation > 1 and window is None):
        raise UsageError(
            f"dilation must be an integer >= 1 and needs a window, got dilation={dilation} "
            f"with window={window}"
        )
    if stride is not None and (stride < 1 or window is None):
        raise UsageError(
            f"stride must be an integer >= 1 and needs a window (the lattice has its k x k "
            f"slots), got stride={stride} with window={window}"
        )
    if global_tokens < 0 or (global_tokens > 0 and window is None):
        raise UsageError(
            f"global_tokens must be >= 0 and needs a window (full attention is global "
            f"already), got global_tokens={global_tokens} with window={window}"
        )


def check_global(global_tokens: int, height: int, width: int) -> None:
    """The global patches must be patches of the grid."""
    if global_tokens > height * width:
        raise UsageError(
            f"global_tokens {global_tokens} exceeds the {height * width} patches of the "
            f"{height} x {width} grid; give at most {height * width}"
        )


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a + b


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: PositionEncoding,
    positions: Tensor,
    window: int,
    scale: float,
    dilation: int = 1,
    stride: int | None = None,
    global_tokens: int = 0,
) -> Tensor:
    """Attention of ``(B, H, P + h*w, d)`` tokens laid out by ``grid_positions``; returns the
    same shape. Patch queries see their slots and the global tokens (the P prefix tokens and the
    first ``global_tokens`` patches); global queries see everything."""
    height, width, prefix = grid_shape(positions)
    check_global(global_tokens, height, width)
    n_global = prefix + global_tokens  # the first tokens: prefix, then the first patches
    glob, grid = slice(0, n_global), slice(prefix, None)
    pattern = (height, width, window, dilation, stride, global_tokens, q.device)
    offsets, keys, valid = slot_table(*pattern)
    neg = torch.finfo(q.dtype).min

    # every patch query, the global patches too: their rows are dropped at the end, which costs
    # G rows where slicing the gathered keys would copy all of them
    q_grid = q[:, :, grid]  # (B, H, N, d)
    if stride is None:  # a square of slots: unfold
        k_win = gather_windows(k[:, :, grid], height, width, window, dilation)  # (B, H, N, K, d)
        v_win = gather_windows(v[:, :, grid], height, width, window, dilation)
    else:
        k_win, v_win = gather_slots(k[:, :, grid], keys), gather_slots(v[:, :, grid], keys)
    logits = torch.einsum("bhnd,bhnkd->bhnk", q_grid, k_win) * scale  # (B, H, N, K)
    logits = _plus(logits, encoding.window_bias(q_grid, k_win, offsets))
    logits = logits.masked_fill(~valid, neg)
    if n_global:
        k_glob, pos_glob, pos_grid = k[:, :, glob], positions[glob], positions[grid]
        to_glob = q_grid @ k_glob.transpose(-2, -1) * scale  # (B, H, N, P + G)
        to_glob = _plus(to_glob, encoding.bias(q_grid, k_glob, pos_grid, pos_glob))
        logits = torch.cat([to_glob, logits], dim=-1)  # (B, H, N, P + G + K)
    attn = logits.softmax(dim=-1)
    attn_glob, attn_win = attn[..., :n_global], attn[..., n_global:]
    out = torch.einsum("bhnk,bhnkd->bhnd", attn_win, v_win)
    out = _plus(out, encoding.window_value(attn_win, offsets))
    if n_global:
        out = out + attn_glob @ v[:, :, glob]
        out = _plus(out, encoding.value(attn_glob, positions[grid], positions[glob]))
        globals_out = global_attention(q[:, :, glob], k, v, encoding, positions, scale)
        out = torch.cat([globals_out, out[:, :, global_tokens:]], dim=2)
    return out


def global_attention(
    q: Tensor, k: Tensor, v: Tensor, encoding: PositionEncoding, positions: Tensor, scale: float
) -> Tensor:
    """The first ``q.shape[2]`` tokens (the global ones) as queries over every key, with the
    encoding's dense hooks."""
    q_pos = positions[: q.shape[2]]
    logits = _plus(q @ k.transpose(-2, -1) * scale, encoding.bias(q, k, q_pos, positions))
    attn = logits.softmax(dim=-1)
    return _plus(attn @ v, encoding.value(attn, q_pos, positions))
