"""The hooks through which the one attention module consults a position encoding.

An encoding overrides only the hooks it needs; the defaults do nothing:

- ``embed(x, positions)``: absolute encodings add to the token embeddings, once, at the input.
- ``qk_input(positions)``: a ``(N, D)`` embedding added to the inputs of the query and key
  projections (not the values) in every layer, as DETR does with its 2D sinusoid.
- ``rotate(q, k, q_pos, k_pos)``: rotary encodings turn q and k by position.
- ``bias(q, k, q_pos, k_pos)``: an additive logit term ``(B|1, H, Nq, Nk)``, already in logit
  units (the encoding applies any scale it needs). Content-free biases (T5, ALiBi) ignore q and k
  and say so with ``content_free``: the attention module may then ask for one block of queries
  at a time, never holding the whole ``(H, Nq, Nk)`` tensor. The module asks it through
  ``visible_bias``, which says whether a causal mask hides the pairs of a key after its query.
- ``score_mod(q, q_pos, k_pos)``: the GPU path's form of a content-free bias (FlexAttention);
  derived from ``bias`` for ``toeplitz`` encodings, written by hand only for the others (FIRE).
- ``value(attn, q_pos, k_pos)``: a value-side term ``(B, H, Nq, d)`` added to ``attn @ v``
  (Shaw's a^V). An encoding with a value term needs the attention weights, so the attention module
  takes its manual path for it.
- ``attend(q, k, v, q_pos, k_pos, scale, causal)``: the whole attention output from the
  encoding's own kernel, or None (the default) to let the attention module combine the hooks
  above. Asked only where no key mask, dropout or window applies (Shaw's and T5's clipped terms
  on the flash kernel, ``kernels/clipped_attention.py``; iRPE's contextual terms,
  ``kernels/bucket_attention.py``).
- ``window_bias`` / ``window_value``: the same two terms for local k x k window attention on an
  image grid, where every patch query sees the same ``K = k*k`` slots, each at a fixed 2D offset.
  Only 2D encodings with a bias or value term implement them; the defaults say "no term".

Positions are integer tensors: ``(N,)`` for sequences, ``(N, 2)`` (row, col) for image grids in
row-major order, where prefix tokens (class, distillation) come first and carry ``(-1, -1)``
(see ``grid_positions``). When keys are longer than queries (a memory of the previous segment,
or a cache), the queries are the last ``Nq`` keys: ``q_pos = k_pos[-Nq:]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from posenc_cli.params import signature_params

Family = Literal["none", "absolute", "relative", "rotary", "bias"]

# Constructor arguments that come from the model, not from the user's recipe.
MODEL_ARGS = ("dim", "heads", "head_dim", "causal")


@dataclass(frozen=True)
class BackboneFacts:
    """Everything a backbone may tell its encoding, declared once. An encoding receives the
    facts its constructor names; the geometry ones (grid, prefix tokens, table length) are
    defaults a recipe may override, the rest (``MODEL_ARGS``) are the model's own."""

    dim: int
    heads: int
    causal: bool = False
    height: int | None = None  # a grid's rows (learned2d, swin, irpe tables)
    width: int | None = None
    prefix_tokens: int | None = None  # class / distillation tokens before the grid
    length: int | None = None  # a 1D table's positions (learned)
    # the longest sequence trained on, in tokens: what an 'auto' range derives from (T5, Shaw)
    train_length: int | None = None

    def for_encoding(self, cls: type, params: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments: the facts it names, then ``params`` over the geometry."""
        known = {**asdict(self), "head_dim": self.dim // self.heads}
        accepted = signature_params(cls.__init__)
        given = {k: v for k, v in known.items() if k in accepted and v is not None}
        return {**given, **params}  # the user's values win


class PositionEncoding(nn.Module):
    """Base class of every encoding in the registry."""

    family: ClassVar[Family] = "none"
    dims: ClassVar[int] = 1  # 1 for sequences, 2 for image grids
    extrapolates: ClassVar[bool] = True  # runs past the length it was trained at
    per_layer: ClassVar[bool] = False  # own parameters in every layer, else one shared instance
    causal_only: ClassVar[bool] = False  # defined for causal models alone (xPos)
    reads_positions: ClassVar[bool] = True  # False: order comes from the content alone (CoPE)
    # a content-free bias that depends on the offset alone (j - i; on grids the 2D offset, and
    # for prefix tokens only on which side they are)
    toeplitz: ClassVar[bool] = False
    # a content-dependent bias whose (i, j) entry reads only q_i, k_j and the two positions, so
    # any block of it can be asked for with that block's q and k (Transformer-XL, DeBERTa)
    pairwise_content: ClassVar[bool] = False

    @property
    def content_free(self) -> bool:
        """Whether ``bias`` reads the positions alone (q and k only for their dtype and device),
        so any block of it can be asked for on its own (``kernels/blocked_bias.py``)."""
        return False

    def __init__(self, *, heads: int = 8, head_dim: int = 64, causal: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.causal = causal
        # coordinates per position this instance reads: ``dims``, unless an N-D encoding was
        # built for a number of axes (a backbone lays its positions out by it)
        self.axes = self.dims

    @property
    def uses_value(self) -> bool:
        """Whether ``value`` returns a term; False lets attention use the fused SDPA kernel."""
        return False

    def logit_scale(self) -> float:
        """Factor on q.k; 1/sqrt(d) unless the paper says otherwise (DeBERTa: 1/sqrt(3d))."""
        return self.head_dim**-0.5

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int] | None:
        """Bucket id of every (query, key) pair ``(Nq, Nk)`` and the number of buckets, for the
        encodings that share parameters between positions; None for the rest. Read by
        ``viz-buckets``; the encodings' own hooks use the same ids."""
        return None

    def qk_input(self, positions: Tensor) -> Tensor | None:
        return None

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None

    def visible_bias(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool
    ) -> Tensor | None:
        """``bias`` as the attention module reads it. ``causal``: a mask hides every key after
        its query, so those pairs' values may be anything, which lets an encoding skip work
        (DeBERTa multiplies q and k by half its table). By default ``bias`` itself."""
        return self.bias(q, k, q_pos, k_pos)

    def bias_by_block(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal=False):
        """For a ``pairwise_content`` bias asked one block of queries at a time over these
        positions: ``block(rows, keys, q_pos_rows, k_pos_keys)`` giving that block's bias from
        the rows and keys of two tensors, the tensors with gradients it reads besides, and the
        two tensors. By default ``bias`` itself, the parameters, and q and k; an encoding that
        projects a table of positions, or multiplies q or k by one, does it here once for all
        blocks. ``causal``: the kernel masks every key after its query, so the bias of those
        pairs may be anything."""
        return self.bias, [p for p in self.parameters() if p.requires_grad], (q, k)

    def value(self, attn: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None

    def distance_table(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        """For a ``toeplitz`` bias over 1D positions: its value at every key-minus-query distance
        the pairs span, asked of ``bias`` once, ``(H, n)`` in q's dtype (one row per head even
        where heads share it), and the lowest distance. The blocked kernel, the GPU path and
        linear attention all read the bias from it."""
        low = int(k_pos.min() - q_pos.max())
        distances = torch.arange(low, int(k_pos.max() - q_pos.min()) + 1, device=k_pos.device)
        table = self.bias(q, q, q_pos.new_zeros(1), distances)[0, :, 0]  # key j - i at i = 0
        return table.expand(self.heads, -1).to(q.dtype), low

    def score_mod(self, q: Tensor, q_pos: Tensor, k_pos: Tensor):
        """The bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` for the GPU
        path, or None. Only content-free encodings whose bias is not a function of the offset
        alone write one (FIRE); ``toeplitz`` ones get theirs from ``bias`` itself
        (``models/flex_path.py``)."""
        return None

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float,
        causal: bool, key_mask: Tensor | None = None,
    ) -> Tensor | None:  # fmt: skip
        """``(B, H, Nq, d)`` attention output computed by the encoding itself, or None;
        ``key_mask`` (B, Nk) True at real keys, or None."""
        return None

    def window_bias(self, q: Tensor, k: Tensor, offsets: Tensor, keys: Tensor) -> Tensor | None:
        """Logit term for window attention: ``q`` and ``k`` ``(B, H, N, d)`` the patch queries
        and keys, ``offsets`` ``(K, 2)`` the (row, col) of the query minus that of the key for
        every slot (iRPE's and Swin's sign), ``keys`` ``(N, K)`` the index of each query's key
        in every slot (``N`` where the slot falls off the grid). Returns ``(B|1, H, N|1, K)``
        or None. Masked slots' values do not matter."""
        return None

    def window_value(self, attn: Tensor, offsets: Tensor) -> Tensor | None:
        """Value term for window attention: ``attn`` ``(B, H, Nq, K)`` -> ``(B, H, Nq, d)``."""
        return None


# Every hook of the interface: the public methods above, read from the class itself, so a
# hook added there is forwarded by ``WrappedEncoding`` without a line more.
HOOKS: tuple[str, ...] = tuple(
    name for name, member in vars(PositionEncoding).items()
    if callable(member) and not name.startswith("_")
)  # fmt: skip


def _forward(name: str):
    def hook(self, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)

    hook.__name__ = name
    hook.__doc__ = f"``inner.{name}``, unless the wrapper overrides it."
    return hook


class WrappedEncoding(PositionEncoding):
    """An encoding around another one: every hook goes to ``inner`` unless the subclass
    overrides it (DETR's sine on q/k around any encoding overrides ``qk_input`` alone).
    Forwarding hook by hook by hand forgets the next hook added (it once missed ``attend``)."""

    def __init__(self, inner: PositionEncoding) -> None:
        super().__init__(heads=inner.heads, head_dim=inner.head_dim, causal=inner.causal)
        self.inner = inner
        self.axes = inner.axes

    @property
    def uses_value(self) -> bool:
        return self.inner.uses_value

    @property
    def content_free(self) -> bool:
        return self.inner.content_free

    @property
    def toeplitz(self) -> bool:
        return self.inner.toeplitz

    @property
    def pairwise_content(self) -> bool:
        return self.inner.pairwise_content


for _name in HOOKS:
    setattr(WrappedEncoding, _name, _forward(_name))


PREFIX = -1  # the (row, col) of a prefix token: it has no place on the grid


def grid_positions(height: int, width: int, prefix: int = 0, device=None) -> Tensor:
    """(row, col) of every token, ``(P + H*W, 2)``: ``prefix`` tokens first at ``(-1, -1)``,
    then the patches in row-major order."""
    rows = torch.arange(height, device=device).repeat_interleave(width)
    cols = torch.arange(width, device=device).repeat(height)
    patches = torch.stack([rows, cols], dim=-1)  # (H*W, 2)
    head = torch.full((prefix, 2), PREFIX, dtype=patches.dtype, device=device)
    return torch.cat([head, patches])


def grid_shape(positions: Tensor) -> tuple[int, int, int]:
    """``(height, width, prefix)`` of a ``grid_positions`` tensor."""
    on_grid = positions[:, 0] >= 0
    prefix = int((~on_grid).sum())
    if not bool(on_grid.any()):
        return 0, 0, prefix
    return int(positions[on_grid, 0].max()) + 1, int(positions[on_grid, 1].max()) + 1, prefix


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Key minus query position, ``(Nq, Nk)``; the sign convention of T5 and Shaw (j - i)."""
    return k_pos[None, :] - q_pos[:, None]


def table_bias(table: Tensor, bucket: Tensor) -> Tensor:
    """A content-free bias from a per-head table: ``(H, nb)`` by ``(Nq, Nk)`` ids ->
    ``(1, H, Nq, Nk)``.

    ``index_select`` on the contiguous table, whose backward is an index_add: advanced indexing's
    backward, an accumulating index_put, measured 1.7x slower for T5's table at N = 1024.
    """
    picked = table.contiguous().index_select(1, bucket.reshape(-1))  # (H, Nq * Nk)
    return picked.view(1, table.shape[0], *bucket.shape)
