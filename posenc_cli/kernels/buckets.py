"""Per-bucket reductions shared by the kernels and the encodings that share parameters between
relative positions: gather one score per (query, key) pair from per-bucket scores, and sum
attention weights per bucket. Neither builds an ``(Nq, Nk, d)`` tensor."""

from __future__ import annotations

from torch import Tensor


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
