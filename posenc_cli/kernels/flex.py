"""The GPU path: biases as FlexAttention ``score_mod`` functions, masks as block masks.

``torch.nn.attention.flex_attention`` fuses an elementwise ``score_mod(score, b, h, q_idx,
kv_idx)`` into a flash-style kernel and skips the blocks a ``BlockMask`` rules out, so a bias
costs no ``(H, N, N)`` tensor and a causal or window mask skips its blocks. Captured tensors (the
tables below) receive gradients. The compiled kernel runs on CUDA; on the CPU FlexAttention runs
eagerly and only without gradients (torch 2.14 raises in the backward), which is how the tests
pin every ``score_mod`` against the explicit path; they check its gradients by applying it to
every pair at once under autograd. They also compile one call of each kind of
mod with inductor, whose CPU template runs the forward: the lowering CUDA's kernel goes through,
though not its code generation.

The score_mods here read small tables, never a per-pair tensor:
- ``distance_mod``: a bias of ``j - i`` alone (ALiBi, T5, KERPLE, Sandwich), ``(H, distances)``;
- ``offset_mod``: a bias of the 2D offset alone (Swin, iRPE's bias mode), ``(H, 2R+1, 2C+1)``,
  with one value per head for each way a prefix (class) token takes part.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from posenc_cli.kernels.visibility import Visibility

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def distance_mod(table: Tensor, q_pos: Tensor, k_pos: Tensor, low: int) -> ScoreMod:
    """``score + table[h, k_pos[j] - q_pos[i] - low]``."""

    def mod(score, b, h, q_idx, kv_idx):
        return score + table[h, k_pos[kv_idx] - q_pos[q_idx] - low]

    return mod


def offset_mod(table: Tensor, prefix: Tensor, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
    """``score + table[h, dr + R, dc + C]`` for grid pairs (``d`` = query minus key), and
    ``prefix[h, 0 | 1 | 2]`` where the query, the key, or both are prefix tokens."""
    reach_r, reach_c = (table.shape[1] - 1) // 2, (table.shape[2] - 1) // 2

    def mod(score, b, h, q_idx, kv_idx):
        qr, qc = q_pos[q_idx, 0], q_pos[q_idx, 1]
        kr, kc = k_pos[kv_idx, 0], k_pos[kv_idx, 1]
        q_prefix, k_prefix = qr < 0, kr < 0
        rows = (qr - kr + reach_r).clamp(0, 2 * reach_r)  # clamped: prefix pairs read row 0
        cols = (qc - kc + reach_c).clamp(0, 2 * reach_c)
        on_grid = table[h, rows, cols]
        case = torch.where(q_prefix & k_prefix, 2, torch.where(q_prefix, 0, 1))
        return score + torch.where(q_prefix | k_prefix, prefix[h, case], on_grid)

    return mod


def causal_mask(q_pos: Tensor, k_pos: Tensor):
    def mask(b, h, q_idx, kv_idx):
        return k_pos[kv_idx] <= q_pos[q_idx]

    return mask


def window_mask(
    k_pos: Tensor, window: int, dilation: int = 1, stride: int | None = None, global_tokens: int = 0
):
    """The sparse grid pattern of ``models/window.py`` as a mask_mod: a ``window x window``
    neighbourhood, its slots ``dilation`` patches apart; with ``stride`` also the ``window x
    window`` lattice of slots ``stride`` apart; the prefix tokens and the first
    ``global_tokens`` patches see and are seen by all."""
    # the first tokens in grid_positions' order: the prefix (at row -1), then the first patches;
    # the options were checked by the attention module
    n_global = int((k_pos[:, 0] < 0).sum()) + global_tokens
    reach = (window // 2) * dilation
    far = (window // 2) * (stride or 1)

    def mask(b, h, q_idx, kv_idx):
        qr, qc = k_pos[q_idx, 0], k_pos[q_idx, 1]  # queries are the keys: self-attention
        kr, kc = k_pos[kv_idx, 0], k_pos[kv_idx, 1]
        dr, dc = qr - kr, qc - kc
        local = (dr.abs() <= reach) & (dc.abs() <= reach)
        local = local & (dr % dilation == 0) & (dc % dilation == 0)
        if stride is not None:
            lattice = (dr.abs() <= far) & (dc.abs() <= far)
            local = local | (lattice & (dr % stride == 0) & (dc % stride == 0))
        return local | (q_idx < n_global) | (kv_idx < n_global)

    return mask


def band_mask(seen: Visibility, q_pos: Tensor, k_pos: Tensor):
    """A sequence's sparse pattern (``kernels/visibility.py``), with the causal mask if any, as
    a mask_mod."""

    def mask(b, h, q_idx, kv_idx):
        return seen.sees(q_pos[q_idx], k_pos[kv_idx])

    return mask


# One compiled kernel per length (dynamic=False: the static kernels are flex's fastest; the
# real lengths a padded call's mods read are constants too), and a profile or benchmark visits
# more lengths than dynamo's default of 8 per function; with fullgraph, going past it would be
# an error rather than a slow fallback.
RECOMPILES = 64


def allow_recompiles() -> None:
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILES)


@lru_cache(maxsize=2)
def compiled(backend: str = "inductor"):
    """flex_attention compiled into one graph, so a score_mod or mask_mod that breaks the graph
    fails loudly instead of falling back. CUDA takes inductor's fused kernel; the CPU tests
    trace the same graphs with the ``eager`` backend, and a few with inductor's CPU template
    (forward only: neither has a backward on the CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    allow_recompiles()
    return torch.compile(flex_attention, backend=backend, dynamic=False, fullgraph=True)


@lru_cache(maxsize=1)
def compiled_block_mask():
    """create_block_mask compiled (CUDA): it visits every pair without materialising them."""
    from torch.nn.attention.flex_attention import create_block_mask

    allow_recompiles()
    return torch.compile(create_block_mask)


def eager(q, k, v, **options) -> Tensor:
    """FlexAttention unfused (the CPU: forward only)."""
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():  # eager on purpose: the CPU has no compiled form to use
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, **options)


def kernel(q: Tensor):
    """The FlexAttention call for q's device: compiled on CUDA (once per shape, by
    torch.compile's cache), eager elsewhere."""
    return compiled() if q.is_cuda else eager


BLOCK_MASKS_KEPT = 16  # the lengths one model sees in training and evaluation, masked or padded
_block_masks: OrderedDict = OrderedDict()


def positions_key(positions: Tensor) -> tuple:
    """What a mask_mod reads of a position tensor, as a cache key."""
    return tuple(positions.shape), positions.cpu().numpy().tobytes()


def block_mask(mask_mod, key: tuple, Nq: int, Nk: int, device: torch.device):
    """The BlockMask of ``mask_mod``, built once per ``key`` (the pattern and the positions it
    reads): every layer of every step asks for the same one, and building it visits every pair.
    On CUDA the build is compiled too, so no ``(Nq, Nk)`` mask is materialised."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (key, Nq, Nk, str(device))
    if key in _block_masks:
        _block_masks.move_to_end(key)
        return _block_masks[key]
    build = compiled_block_mask() if device.type == "cuda" else create_block_mask
    made = build(mask_mod, None, None, Nq, Nk, device=device)
    _block_masks[key] = made
    if len(_block_masks) > BLOCK_MASKS_KEPT:
        _block_masks.popitem(last=False)
    return made


# FlexAttention's default block. Inputs are padded to a multiple of it: compiled, a length off
# the block gave wrong values on the CPU here (torch 2.14: plain attention at 40 tokens, off by
# up to 0.4), and on CUDA such lengths with both a score_mod and a block mask gave NaN gradients
# (pytorch/pytorch issue 153799). Padding costs up to 127 more rows of queries and keys, a copy
# of q, k and v, and a block mask (for the padded keys) where a call had none.
BLOCK = 128


def padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def within(score_mod: ScoreMod | None, mask_mod, n_q: int, n_k: int):
    """The mods of a call padded past ``n_q`` queries and ``n_k`` keys: every index clamped into
    the real ones, so a captured position tensor is never read out of range, and the padded
    keys hidden."""

    def real(q_idx, kv_idx):
        return q_idx.clamp(max=n_q - 1), kv_idx.clamp(max=n_k - 1)

    def mask(b, h, q_idx, kv_idx):
        keys = kv_idx < n_k
        return keys if mask_mod is None else keys & mask_mod(b, h, *real(q_idx, kv_idx))

    if score_mod is None:
        return None, mask

    def score(value, b, h, q_idx, kv_idx):
        return score_mod(value, b, h, *real(q_idx, kv_idx))

    return score, mask


def pad_rows(x: Tensor, rows: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[-2]))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod | None,
    mask_mod=None,
    scale: float | None = None,
    mask_key: tuple | None = None,
) -> Tensor:
    """FlexAttention with ``score_mod`` and a block mask built from ``mask_mod``, cached under
    ``mask_key`` when one is given (it must name everything the mask_mod reads). Queries and
    keys are padded to whole blocks (``BLOCK``) and the output cut back."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if (padded(n_q), padded(n_k)) != (n_q, n_k):
        q, k, v = pad_rows(q, padded(n_q)), pad_rows(k, padded(n_k)), pad_rows(v, padded(n_k))
        if mask_key is not None or mask_mod is None:  # the mask now reads the real lengths too
            mask_key = ("padded", n_q, n_k, mask_key)
        score_mod, mask_mod = within(score_mod, mask_mod, n_q, n_k)
    masked = None
    if mask_mod is not None:
        Nq, Nk = q.shape[-2], k.shape[-2]
        if mask_key is None:
            from torch.nn.attention.flex_attention import create_block_mask

            masked = create_block_mask(mask_mod, None, None, Nq, Nk, device=q.device)
        else:
            masked = block_mask(mask_mod, mask_key, Nq, Nk, q.device)
    out = kernel(q)(q, k, v, score_mod=score_mod, block_mask=masked, scale=scale)
    return out[..., :n_q, :]
