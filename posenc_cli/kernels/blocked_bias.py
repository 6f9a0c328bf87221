"""Attention with a content-free bias, built one block of queries at a time, on the CPU flash
kernel, forward and backward.

Handing SDPA a whole ``(H, Nq, Nk)`` bias costs twice: the tensor itself (memory quadratic in N)
and, under a causal mask, the full square, since a mask passed as ``attn_mask`` stops the kernel
from skipping the upper triangle the way ``is_causal`` does. Content-free biases (ALiBi, T5,
KERPLE, Sandwich, FIRE, Swin, iRPE's bias mode) are a function of the positions alone, so the
bias of queries ``[s, e)`` can be asked of the encoding when that block is reached:

- forward: per block, ``bias(q_pos[s:e], k_pos[:visible])`` with the causal mask folded in, one
  flash call, its output and logsumexp kept; causal blocks see keys up to their own end only (the
  staircase), so about half the square is computed;
- backward: per block, the flash backward takes the same bias and the saved logsumexp and gives
  dq, dk and dv; when the bias has learned parameters, ``dS = P * (dO v^T - rowsum(dO * O))`` of
  the block is the bias's gradient, sent to the parameters through the encoding's own ``bias``,
  recomputed for the block with autograd on; that pass goes over the block's keys in tiles of
  ``KEY_TILE``, whose ``P`` and ``dS`` stay in cache.

Only one block's bias exists at a time, so memory grows linearly in N (q, k, v, the output, the
logsumexp and one ``(H, BLOCK, Nk)`` block). Often not even that: a bias of ``j - i`` over
consecutive positions (``DistanceTable``) is a view of its table per distance that the kernel
reads in place, and so is a grid bias of the 2D offset, column by column (``grid_bias``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc_cli.kernels.biased_sdpa import probabilities_, reduce_to
from posenc_cli.kernels.grid_bias import GridTable
from posenc_cli.kernels.positions import consecutive
from posenc_cli.kernels.scratch import Scratch
from posenc_cli.kernels.visibility import Band, Visibility

BLOCK = 256  # query rows per block
# Keys per tile of the backward passes that form P and dS themselves: a block's (B, H, rows,
# keys) intermediates then stay small enough to be read back from cache. With B=4, H=8, d=64 and
# 256 rows, one block's pass over 1024 keys measured 78 ms whole and 52 ms in tiles of 256, over
# 2048 keys 166 ms and 107 ms (tiles of 128 and 512 were no faster).
KEY_TILE = 256
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

# (the block's q, the keys it sees, their positions) -> bias (1|B, H, rows, keys); one that
# reads content and whose pairs cost the same however its keys are cut sets ``tiles_freely``,
# and one that knows its own gradient may give ``add_grads(d_bias, rows, keys, q_pos, k_pos,
# d_rows, d_keys)``: it adds the gradients of the rows and keys it read into those two views in
# place and returns its leaves' (no autograd pass, no zeroed buffers of its intermediates); one
# whose every call returns a tensor of its own sets ``fresh``, and the mask goes into it in place
BiasOfBlock = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


# From here on (benchmarks/attention_overhead.py shape, B=4, H=8, d=64) the kernel is at least as
# fast as one (H, N, N) bias: under a causal mask, at 512 keys, it measured 0.94x (ALiBi) and
# 0.81x (KERPLE) of the dense path in training, and at 1024 ALiBi took 1.06x of causal `none`
# against 2.02x. Without a mask, in training, ALiBi pays 1.05-1.09x of its dense bias at 512-1024
# tokens (KERPLE 0.96x), the price of memory that grows linearly; without gradients 0.85-1.07x
# (KERPLE 0.3-0.5x). 512 tokens is also the smallest probe of profiling/budget.py, so the
# memory it extrapolates is this kernel's.
CAUSAL_MIN_KEYS = 512
MIN_PAIRS = 512 * 512


def worth(q: Tensor, k: Tensor, causal: bool) -> bool:
    """Whether the kernel can run (the CPU flash kernel in float32/64) and pays: from
    ``CAUSAL_MIN_KEYS`` keys under a causal mask, from ``MIN_PAIRS`` pairs without."""
    if q.device.type != "cpu" or q.dtype not in (torch.float32, torch.float64):
        return False
    Nq, Nk = q.shape[-2], k.shape[-2]
    return Nk >= CAUSAL_MIN_KEYS if causal else Nq * Nk >= MIN_PAIRS


def blocks(q_pos: Tensor, k_pos: Tensor, seen: Visibility, block: int):
    """``(rows, keys)`` of every query block, the keys a slice or, beside a band's global
    tokens, an index. Over consecutive positions a block sees only the keys it may: under a
    causal mask those up to its last query (the staircase), under a band those within its reach
    of the block and the global tokens (the rest are masked anyway)."""
    Nq, Nk = len(q_pos), len(k_pos)
    ordered = consecutive(k_pos)
    first = Nk - Nq  # the key index of query 0
    band = seen.band if ordered else None
    for s in range(0, Nq, block):
        e = min(Nq, s + block)
        lo, hi = 0, first + e if seen.causal and ordered else Nk
        if band is not None and first + s >= band.global_tokens:  # no global query here
            lo, hi = max(0, first + s - band.reach), min(hi, first + e + band.reach)
            if 0 < band.global_tokens < lo:
                glob = torch.arange(band.global_tokens, device=k_pos.device)
                yield slice(s, e), torch.cat([glob, torch.arange(lo, hi, device=k_pos.device)])
                continue
            lo = 0 if lo <= band.global_tokens else lo
        yield slice(s, e), slice(lo, hi)


def key_tiles(keys: slice | Tensor) -> list[slice | Tensor]:
    """``keys`` cut into ranges of at most ``KEY_TILE``; an index (a band's global tokens
    beside its reach) stays whole."""
    if isinstance(keys, Tensor):
        return [keys]
    return [slice(a, min(keys.stop, a + KEY_TILE)) for a in range(keys.start, keys.stop, KEY_TILE)]


def flash_blocks(q_pos: Tensor, k_pos: Tensor, seen: Visibility, block: int, viewed: bool):
    """The ``blocks`` of the flash calls: a viewed bias costs no memory, so where every query
    sees every key all rows go in one call."""
    return blocks(q_pos, k_pos, seen, block if seen.hides_some or not viewed else len(q_pos))


def masked_bias(
    bias_of_block: BiasOfBlock, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
    seen: Visibility,
) -> Tensor:  # fmt: skip
    """The block's bias in q's dtype, the causal mask and the band folded in as the dtype's
    lowest value: in place where the block says its bias is a new tensor (``fresh``) and no
    autograd graph runs through it, which saves a copy of every pair."""
    dtype = q.dtype
    bias = bias_of_block(q, k, q_pos, k_pos).to(dtype)
    hidden = seen.hidden(q_pos, k_pos)  # (rows, keys) or None
    if hidden is None:
        return bias
    own = getattr(bias_of_block, "fresh", False) and not torch.is_grad_enabled()
    fill = bias.masked_fill_ if own else bias.masked_fill
    return fill(hidden, torch.finfo(dtype).min)


class DistanceTable:
    """The blocks of a bias of ``j - i`` alone from its value per distance, ``table`` ``(H, n)``
    starting at distance ``low``.

    Called, it gathers a block (for the backward of a learned table: the gather's autograd
    backward sums each diagonal of the block's gradient into the table). ``flipped`` gives the
    same block with its rows in reverse order as a view of the table itself, no copy: over
    consecutive positions, row ``r`` (query ``e - 1 - r``) and key ``j`` read entry ``j + r``
    from the block's start, so both strides are 1. The flash kernel reads an ``attn_mask`` by its
    strides, so it takes that view in place, and no ``(rows, keys)`` tensor exists at all."""

    def __init__(self, table: Tensor, low: int) -> None:
        self.table, self.low = table, low
        self._read: dict[tuple[torch.dtype, Visibility], Tensor] = {}  # what the views read

    def __call__(self, q: Tensor, k: Tensor, rows: Tensor, keys: Tensor) -> Tensor:
        # int32 ids, shifted before the broadcast: one (rows, keys) index tensor, half the bytes
        ids = keys.to(torch.int32)[None, :] - (rows.to(torch.int32) + self.low)[:, None]
        return self.table.index_select(1, ids.flatten()).view(1, -1, *ids.shape)

    def start(self, rows: Tensor, keys: Tensor) -> int:
        """The table entry row 0 of the block's ``flipped`` view begins at: the distance from
        its last query to its first key."""
        return int(keys[0] - rows[-1]) - self.low

    def flipped(self, rows: Tensor, keys: Tensor, seen: Visibility, dtype: torch.dtype) -> Tensor:
        """``(1, H, rows, keys)``, row ``r`` holding the bias of query ``rows[-1 - r]``, the causal
        mask and the band folded into the table (the dtype's lowest value at every distance
        they hide)."""
        table = self._readable(dtype, seen)
        shape = (1, table.shape[0], len(rows), len(keys))
        offset = table.storage_offset() + self.start(rows, keys)
        return table.as_strided(shape, (0, table.stride(0), 1, 1), offset)

    def _readable(self, dtype: torch.dtype, seen: Visibility) -> Tensor:
        """The table detached, contiguous, in ``dtype`` and masked where ``seen`` hides a
        distance: built once per call of the kernel, however many blocks read it."""
        if (dtype, seen) not in self._read:
            table = self.table.detach().to(dtype)
            if seen.hides_some:
                distance = torch.arange(table.shape[1], device=table.device) + self.low
                table = table.masked_fill(seen.hidden_distance(distance), torch.finfo(dtype).min)
            self._read[dtype, seen] = table.contiguous()
        return self._read[dtype, seen]


def _flipped_flash(q_b, k_b, v_b, mask, scale):
    """One flash call on a block whose bias is a ``flipped`` view: the queries go in reversed to
    match it, and the output and logsumexp come back in order."""
    out, lse = _flash(q_b.flip(-2), k_b, v_b, attn_mask=mask, scale=scale)
    return out.flip(-2), lse.flip(-1)


class _BlockedBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, q_pos, k_pos, scale, seen, block, bias_of_block, read_q, read_k, *leaves
    ):
        reads = read_q is not None
        read = (read_q, read_k) if reads else ()
        ctx.settings = (scale, seen, block, bias_of_block, reads)
        grid = isinstance(bias_of_block, GridTable) and seen.band is None
        if grid and bias_of_block.serves(q_pos, k_pos, seen.causal):
            out, lse = bias_of_block.attend(q, k, v, scale)
            ctx.save_for_backward(q, k, v, out, lse, q_pos, k_pos, *read, *leaves)
            return out
        bias_q, bias_k = read or (q, k)
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1])
        viewed = _viewable(bias_of_block, q_pos, k_pos, seen)
        for rows, keys in flash_blocks(q_pos, k_pos, seen, block, viewed):
            q_b, k_b, v_b = q[:, :, rows], k[:, :, keys], v[:, :, keys]
            if viewed:
                mask = bias_of_block.flipped(q_pos[rows], k_pos[keys], seen, q.dtype)
                out[:, :, rows], lse[:, :, rows] = _flipped_flash(q_b, k_b, v_b, mask, scale)
                continue
            bias = masked_bias(
                bias_of_block, bias_q[:, :, rows], bias_k[:, :, keys], q_pos[rows], k_pos[keys],
                seen,
            )  # fmt: skip
            out[:, :, rows], lse[:, :, rows] = _flash(q_b, k_b, v_b, attn_mask=bias, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, q_pos, k_pos, *read, *leaves)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, q_pos, k_pos, *leaves = ctx.saved_tensors
        scale, seen, block, bias_of_block, reads = ctx.settings
        read = [leaves.pop(0), leaves.pop(0)] if reads else []
        read_grads = [None, None]
        needs = ctx.needs_input_grad[11:]  # the leaves' flags, after the eleven other inputs
        learned = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        viewed = _viewable(bias_of_block, q_pos, k_pos, seen)
        if not reads and viewed and _table_is_the_leaf(bias_of_block, learned):
            leaf_grads = [torch.zeros_like(learned[0])]
            _grads_through_table(
                (q, k, v, out, lse, q_pos, k_pos, grad_out), (dq, dk, dv, leaf_grads[0]),
                bias_of_block, scale, seen, block,
            )  # fmt: skip
        elif learned or reads:  # the bias has a gradient to pass on
            read_grads = [torch.zeros_like(t) for t in read] or read_grads
            # a block that knows its gradient gives every leaf's, so only when all are wanted
            own = reads and hasattr(bias_of_block, "add_grads") and len(learned) == len(leaves)
            leaf_grads = _grads_through_bias(
                (q, k, v, out, lse, q_pos, k_pos, grad_out), (dq, dk, dv), learned,
                bias_of_block, scale, seen, block, (read, read_grads), own,
            )  # fmt: skip
        else:
            _flash_grads(
                (q, k, v, out, lse, q_pos, k_pos, grad_out), (dq, dk, dv), bias_of_block, scale,
                seen, block,
            )  # fmt: skip
            leaf_grads = []
        per_leaf = iter(leaf_grads)
        grads = [next(per_leaf) if need else None for need in needs]
        return dq, dk, dv, None, None, None, None, None, None, *read_grads, *grads


def _table_is_the_leaf(bias_of_block: BiasOfBlock, learned: list[Tensor]) -> bool:
    """Whether the one learned tensor is a ``DistanceTable``'s own table, so its gradient is the
    diagonal sums of ``dS`` (a leaf the table was computed from goes through autograd)."""
    table = getattr(bias_of_block, "table", None)
    return len(learned) == 1 and learned[0] is table


def _viewable(bias_of_block: BiasOfBlock, q_pos: Tensor, k_pos: Tensor, seen: Visibility) -> bool:
    """Whether each block's bias can be a ``flipped`` view of a distance table: consecutive
    positions, and no global tokens (whose keys are no range of distances)."""
    table = isinstance(bias_of_block, DistanceTable)
    no_globals = seen.band is None or not seen.band.global_tokens
    return table and no_globals and consecutive(q_pos) and consecutive(k_pos)


def _flash_grads(tensors, grads, bias_of_block, scale, seen, block) -> None:
    """dq, dk and dv from the flash backward, block by block, when the bias needs no gradient."""
    q, k, v, out, lse, q_pos, k_pos, grad_out = tensors
    dq, dk, dv = grads
    viewed = _viewable(bias_of_block, q_pos, k_pos, seen)
    for rows, keys in flash_blocks(q_pos, k_pos, seen, block, viewed):
        q_b, k_b, v_b = q[:, :, rows], k[:, :, keys], v[:, :, keys]
        g_b, o_b, l_b = grad_out[:, :, rows], out[:, :, rows], lse[:, :, rows]
        if viewed:  # the queries' side reversed, as the view's rows are
            mask = bias_of_block.flipped(q_pos[rows], k_pos[keys], seen, q.dtype)
            q_b, g_b, o_b, l_b = q_b.flip(-2), g_b.flip(-2), o_b.flip(-2), l_b.flip(-1)
        else:
            mask = masked_bias(bias_of_block, q_b, k_b, q_pos[rows], k_pos[keys], seen)
        g_q, g_k, g_v = _flash_backward(
            g_b, q_b, k_b, v_b, o_b, l_b, 0.0, False, attn_mask=mask.detach(), scale=scale
        )
        dq[:, :, rows] += g_q.flip(-2) if viewed else g_q
        dk[:, :, keys] += g_k
        dv[:, :, keys] += g_v


def _grads_through_table(tensors, grads, table, scale, seen, block) -> None:
    """dq, dk, dv and a learned distance table's gradient, block by block, the rows of each
    block reversed to match its ``flipped`` view: the bias is read in place, and the table's
    gradient is the sum of ``dS`` along each diagonal, ``skewed_sums``."""
    q, k, v, out, lse, q_pos, k_pos, grad_out = tensors
    k, v = _batch_contiguous(k, v)
    dq, dk, dv, d_table = grads
    row_dot = (grad_out * out).sum(-1, keepdim=True)  # (B, H, N, 1)
    scratch = Scratch(q)
    for rows, block_keys in blocks(q_pos, k_pos, seen, block):
        q_s = q[:, :, rows].flip(-2) * scale
        g_b = grad_out[:, :, rows].flip(-2)
        lse_b, dot_b = lse[:, :, rows, None].flip(-2), row_dot[:, :, rows].flip(-2)
        dq_b = torch.zeros_like(q_s)
        for keys in key_tiles(block_keys):
            view = table.flipped(q_pos[rows], k_pos[keys], seen, q.dtype)
            d_score = _tile_backward(q_s, k, v, g_b, view, lse_b, dot_b, keys, dk, dv, scratch)
            dq_b += torch.matmul(d_score, k[:, :, keys])
            start = table.start(q_pos[rows], k_pos[keys])
            sums = skewed_sums(d_score)
            d_table[:, start : start + sums.shape[-1]] += sums
        dq[:, :, rows] = dq_b.mul_(scale).flip(-2)


def _batch_contiguous(*tensors: Tensor) -> tuple[Tensor, ...]:
    """``(B, H, N, d)`` tensors laid out batch and head first. The attention module's heads are a
    view of ``(B, N, H, d)``, whose ``(B, H)`` cannot be one batch dimension of a matmul, so every
    tile's slice of keys was copied again by each product it took part in (three per tile); one
    copy per call instead."""
    return tuple(t.contiguous() for t in tensors)


def _tile_backward(q_s, k, v, g_b, bias, lse_b, dot_b, keys, dk, dv, scratch) -> Tensor:
    """One tile of a block (its queries ``q_s``, already scaled, and ``keys``): forms
    ``P = exp(q_s k^T + bias - lse)`` and ``dS = P * (dO v^T - rowsum(dO * O))`` in the two
    buffers of ``scratch``, adds the tile's share to dv and dk, and returns dS,
    ``(B, H, rows, keys)``, for dq and the bias (valid until the next tile)."""
    k_b, v_b = k[:, :, keys], v[:, :, keys]
    shape = (*q_s.shape[:-1], k_b.shape[-2])
    prob = torch.matmul(q_s, k_b.transpose(-2, -1), out=scratch.take(0, shape))
    probabilities_(prob.add_(bias).sub_(lse_b))
    dv[:, :, keys] += torch.matmul(prob.transpose(-2, -1), g_b)
    d_score = torch.matmul(g_b, v_b.transpose(-2, -1), out=scratch.take(1, shape))
    d_score.sub_(dot_b).mul_(prob)
    dk[:, :, keys] += torch.matmul(d_score.transpose(-2, -1), q_s)
    return d_score


def skewed_sums(grad: Tensor) -> Tensor:
    """``(H, rows + keys - 1)``: entry ``c`` sums ``grad[:, :, r, c - r]`` over the batch and the
    rows, the gradient of every table entry a ``flipped`` view read. Summed over the batch
    first, each row is copied into a zeroed buffer one column further right than the row above,
    so one sum down the columns adds each diagonal."""
    grad = grad.sum(0)  # (H, R, K)
    H, R, K = grad.shape
    W = R + K - 1
    buffer = grad.new_zeros(H, R, W)
    buffer.as_strided(grad.shape, (R * W, W + 1, 1)).copy_(grad)
    return buffer.sum(1)


def _grads_through_bias(
    tensors, grads, learned, bias_of_block, scale, seen, block, reading, own=False
):
    """dq, dk, dv and the learned leaves' gradients in one pass per block: the bias gradient dS
    is also what dq, dk and dv are made of. Returns the leaves' gradients. ``reading``: the two
    tensors a content-dependent bias reads the rows and the keys of, and their gradients to fill
    (both lists empty for a content-free bias). ``own``: the block's ``add_grads`` takes dS
    wherever its keys are a range, in place of autograd."""
    q, k, v, out, lse, q_pos, k_pos, grad_out = tensors
    dq, dk, dv = grads
    (read_q, read_k), (d_read_q, d_read_k) = reading if reading[0] else ((q, k), (None, None))
    k, v = _batch_contiguous(k, v)
    reads = d_read_q is not None
    leaf_grads = [torch.zeros_like(leaf) for leaf in learned]
    row_dot = (grad_out * out).sum(-1, keepdim=True)  # (B, H, N, 1)
    scratch = Scratch(q)
    for rows, block_keys in blocks(q_pos, k_pos, seen, block):
        q_b, g_b = q[:, :, rows], grad_out[:, :, rows]
        q_s = q_b * scale  # scaled once here, not on every tile below
        lse_b, dot_b = lse[:, :, rows, None], row_dot[:, :, rows]
        # a content-dependent term built from the keys it is given (XL's distances) would be
        # built again by every tile: it takes the block whole, unless it says tiles cost nothing
        whole = reads and not getattr(bias_of_block, "tiles_freely", False)
        for keys in [block_keys] if whole else key_tiles(block_keys):
            by_hand = own and isinstance(keys, slice)  # a band's global keys are an index
            parts_read = (read_q[:, :, rows], read_k[:, :, keys])
            with torch.set_grad_enabled(not by_hand):
                # a content-dependent bias is differentiated at this block's rows and keys
                q_in, k_in = (t.detach().requires_grad_(reads and not by_hand) for t in parts_read)
                bias = masked_bias(bias_of_block, q_in, k_in, q_pos[rows], k_pos[keys], seen)
            d_score = _tile_backward(
                q_s, k, v, g_b, bias.detach(), lse_b, dot_b, keys, dk, dv, scratch
            )
            dq[:, :, rows] += torch.matmul(d_score, k[:, :, keys]).mul_(scale)
            if by_hand:  # hidden pairs have P = 0: d_score is already 0 where the mask went in
                into = (d_read_q[:, :, rows], d_read_k[:, :, keys])
                parts = bias_of_block.add_grads(
                    d_score, *parts_read, q_pos[rows], k_pos[keys], *into
                )
                for total, part in zip(leaf_grads, parts, strict=True):
                    total += part
                continue
            d_bias = reduce_to(d_score, bias.shape)  # a content-free bias is shared by the batch
            inputs = [q_in, k_in, *learned] if reads else learned
            # retained: a table computed once before the blocks (from ``leaves``) is shared
            parts = list(
                torch.autograd.grad(bias, inputs, d_bias, allow_unused=True, retain_graph=True)
            )
            if reads:
                g_q, g_k = parts.pop(0), parts.pop(0)
                if g_q is not None:
                    d_read_q[:, :, rows] += g_q
                if g_k is not None:
                    d_read_k[:, :, keys] += g_k
            for total, part in zip(leaf_grads, parts, strict=True):
                if part is not None:
                    total += part
    return leaf_grads


def blocked_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    bias_of_block: BiasOfBlock,
    leaves: list[Tensor],
    scale: float,
    causal: bool,
    block: int | None = None,
    reads: tuple[Tensor, Tensor] | None = None,
    band: Band | None = None,
) -> Tensor:
    """``softmax(q k^T * scale + bias + causal mask) v``, ``(B, H, Nq, d)``, where
    ``bias_of_block(q_rows, k_keys, q_pos[rows], k_pos[keys])`` gives the bias of any block,
    ``(1|B, H, rows, keys)``, and ``leaves`` are the tensors it learns from (their gradients are
    returned through autograd as usual). ``reads``: the bias reads content, ``(B, H, Nq, *)``
    and ``(B, H, Nk, *)`` tensors whose (i, j) entry reads only row i of the first, row j of the
    second and the positions (q and k for Transformer-XL, their products with DeBERTa's tables);
    the kernel then hands each block those rows instead of q's and k's, and their gradients are
    taken block by block too. ``band``: a sparse pattern over 1D positions
    (``kernels/visibility.py``); each block then sees only the keys within its reach."""
    seen = Visibility(causal, band, int(k_pos[0]) if band is not None else 0)
    read_q, read_k = reads or (None, None)
    return _BlockedBiasAttention.apply(
        q, k, v, q_pos, k_pos, scale, seen, block or BLOCK, bias_of_block, read_q, read_k,
        *leaves,
    )  # fmt: skip
