"""The hooks through which the one attention module consults a position encoding.

An encoding overrides only the hooks it needs; the defaults do nothing:

- ``embed(x, positions)``: absolute encodings add to the token embeddings, once, at the input.
- ``rotate(q, k, q_pos, k_pos)``: rotary encodings turn q and k by position.
- ``bias(q, k, q_pos, k_pos)``: an additive logit term ``(B|1, H, Nq, Nk)``, already in logit
  units (the encoding applies any scale it needs). Content-free biases (T5, ALiBi) ignore q and k.
- ``value(attn, q_pos, k_pos)``: a value-side term ``(B, H, Nq, d)`` added to ``attn @ v``
  (Shaw's a^V). An encoding with a value term needs the attention weights, so the attention module
  takes its manual path for it.

Positions are integer tensors. When keys are longer than queries (a memory of the previous
segment, or a cache), the queries are the last ``Nq`` keys: ``q_pos = k_pos[-Nq:]``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from torch import Tensor, nn

Family = Literal["none", "absolute", "relative", "rotary", "bias"]

# Constructor arguments that come from the model, not from the user's recipe.
MODEL_ARGS = ("dim", "heads", "head_dim", "causal")


class PositionEncoding(nn.Module):
    """Base class of every encoding in the registry."""

    family: ClassVar[Family] = "none"
    dims: ClassVar[int] = 1  # 1 for sequences, 2 for image grids
    extrapolates: ClassVar[bool] = True  # runs past the length it was trained at
    per_layer: ClassVar[bool] = False  # own parameters in every layer, else one shared instance
    has_value_term: ClassVar[bool] = False  # class default; instances may switch it off

    def __init__(self, *, heads: int = 8, head_dim: int = 64, causal: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.causal = causal

    @property
    def uses_value(self) -> bool:
        """Whether ``value`` returns a term; False lets attention use the fused SDPA kernel."""
        return self.has_value_term

    def logit_scale(self) -> float:
        """Factor on q.k; 1/sqrt(d) unless the paper says otherwise (DeBERTa: 1/sqrt(3d))."""
        return self.head_dim**-0.5

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None

    def value(self, attn: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Key minus query position, ``(Nq, Nk)``; the sign convention of T5 and Shaw (j - i)."""
    return k_pos[None, :] - q_pos[:, None]


def sum_per_bucket(attn: Tensor, bucket: Tensor, num_buckets: int) -> Tensor:
    """Attention weight summed over the keys of each bucket: ``(B, H, Nq, Nk) -> (B, H, Nq, nb)``.

    With it a value-side term ``sum_j a_ij r[b(i,j)]`` becomes ``sum_per_bucket(a) @ r``: no
    ``(Nq, Nk, d)`` tensor is ever built.
    """
    index = bucket.expand_as(attn)
    out = attn.new_zeros(*attn.shape[:-1], num_buckets)
    return out.scatter_add_(-1, index, attn)


def gather_buckets(scores: Tensor, bucket: Tensor) -> Tensor:
    """Pick each pair's bucket score: ``(B, H, Nq, nb)`` by ``(Nq, Nk)`` ids -> ``(B, H, Nq, Nk)``.

    Used for content-dependent terms ``q_i . r[b(i,j)]``: ``q @ r.T`` is computed once per bucket,
    then gathered, instead of building ``(Nq, Nk, d)`` embeddings.
    """
    index = bucket.expand(*scores.shape[:-1], bucket.shape[-1])
    return scores.gather(-1, index)
