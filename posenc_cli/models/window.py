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

No ``(B, H, N, K, d)`` tensor of each query's keys is gathered: a slot's keys are a shifted view
of the zero-padded key grid, one slot at a time. Without a value term the slots go through
``kernels/slot_attention.py`` (online softmax, hand-written backward: ``O(N d)`` memory, no
``(N, K)`` logits held) and are joined with the global columns by their log-sum-exp; with one
(Shaw-like ``window_value``) the ``(N, K)`` weights are formed explicitly, slot by slot. At
64 x 64 patches this took the forward + backward from 12x the memory of full flash attention
(the gathered keys) to the figures in the README.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, grid_shape
from posenc_cli.errors import UsageError
from posenc_cli.kernels.slot_attention import grids, shifted, slot_attention


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
        raise UsageError(f"window must be an odd number >= 1 (of tokens or patches), got {window}")
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


def check_global(global_tokens: int, count: int, of: str) -> None:
    """The global tokens must be among the ``count`` tokens there are (``of`` names them:
    "patches of the 3 x 4 grid", "tokens of the sequence")."""
    if global_tokens > count:
        raise UsageError(
            f"global_tokens {global_tokens} exceeds the {count} {of}; give at most {count}"
        )


def check_grid_global(global_tokens: int, height: int, width: int) -> None:
    """The global patches must be patches of the grid."""
    check_global(global_tokens, height * width, f"patches of the {height} x {width} grid")


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a + b


def explicit_slots(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, height: int, width: int
) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """The slots' ``q . k`` ``(B, H, N, K)``, one shifted view at a time, and the function that
    takes weights ``(B, H, N, K)`` to ``sum_s a_s v_s`` ``(B, H, N, d)``; for the value-term
    path, which needs the weights themselves."""
    B, H, N, d = q.shape
    offs, reach, q5, kp, vp = grids(q, k, v, offsets, height, width)
    dots = [torch.linalg.vecdot(q5, shifted(kp, reach, o, slice(0, height), width)) for o in offs]
    logits = torch.stack(dots, dim=-1).reshape(B, H, N, len(offs))

    def weigh(attn: Tensor) -> Tensor:
        a5 = attn.reshape(B, H, height, width, len(offs))
        out = None
        for s, o in enumerate(offs):
            term = a5[..., s : s + 1] * shifted(vp, reach, o, slice(0, height), width)
            out = term if out is None else out + term
        return out.reshape(B, H, N, d)

    return logits, weigh


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
    check_grid_global(global_tokens, height, width)
    n_global = prefix + global_tokens  # the first tokens: prefix, then the first patches
    glob, grid = slice(0, n_global), slice(prefix, None)
    pattern = (height, width, window, dilation, stride, global_tokens, q.device)
    offsets, keys, valid = slot_table(*pattern)

    # every patch query, the global patches too: their rows are dropped at the end
    q_grid, k_grid, v_grid = q[:, :, grid], k[:, :, grid], v[:, :, grid]  # (B, H, N, d)
    bias = encoding.window_bias(q_grid, k_grid, offsets, keys)  # (B|1, H|1, N|1, K) or None
    if n_global:
        k_glob, pos_glob, pos_grid = k[:, :, glob], positions[glob], positions[grid]
        to_glob = q_grid @ k_glob.transpose(-2, -1) * scale  # (B, H, N, P + G)
        to_glob = _plus(to_glob, encoding.bias(q_grid, k_glob, pos_grid, pos_glob))
    if encoding.uses_value:
        logits, weigh = explicit_slots(q_grid, k_grid, v_grid, offsets, height, width)
        logits = _plus(logits * scale, bias).masked_fill(~valid, torch.finfo(q.dtype).min)
        if n_global:
            logits = torch.cat([to_glob, logits], dim=-1)  # (B, H, N, P + G + K)
        attn = logits.softmax(dim=-1)
        attn_glob, attn_win = attn[..., :n_global], attn[..., n_global:]
        out = _plus(weigh(attn_win), encoding.window_value(attn_win, offsets))
        if n_global:
            out = out + attn_glob @ v[:, :, glob]
            out = _plus(out, encoding.value(attn_glob, positions[grid], positions[glob]))
    else:
        out, lse = slot_attention(
            q_grid, k_grid, v_grid, offsets, valid, scale, height, width, bias
        )
        if n_global:  # join the slots and the global columns by their log-sum-exps
            lse_glob = to_glob.logsumexp(dim=-1)
            both = torch.logaddexp(lse, lse_glob)
            out_glob = to_glob.softmax(dim=-1) @ v[:, :, glob]
            out = (
                out * (lse - both).exp()[..., None] + out_glob * (lse_glob - both).exp()[..., None]
            )
    if n_global:
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
