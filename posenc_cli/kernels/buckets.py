"""Per-bucket reductions shared by the kernels and the encodings that share parameters between
relative positions: gather one score per (query, key) pair from per-bucket scores, and sum
attention weights per bucket. Neither builds a batch's ``(Nq, Nk, d)`` tensor."""

from __future__ import annotations

import torch
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


def gather_by_key(scores: Tensor, ids: Tensor) -> Tensor:
    """Pick each pair's bucket score from the key's row: ``(B, H, Nk, nb)`` by ``(Nq, Nk)`` ids
    -> ``(B, H, Nq, Nk)``, laid out by query. The ids must lie in ``0..nb-1``: unchecked, one
    past a row would read the next key's.

    DeBERTa's p2c term reads ``k_j``'s score at pair (i, j)'s bucket. Gathered by key and then
    transposed, its sum with the c2p term was a strided add; one gather from the key rows laid
    end to end gives the query layout directly (8.0 against 11.0 ms for both terms of a
    256 x 256 tile, B = 4, H = 8, one thread).
    """
    B, H, Nk, nb = scores.shape
    picked = scores.reshape(B, H, Nk * nb).gather(-1, _key_rows_end_to_end(ids, nb, B, H))
    return picked.view(B, H, *ids.shape)


def scatter_add_by_key(into: Tensor, ids: Tensor, grad: Tensor) -> None:
    """The gradient of ``gather_by_key``, added in place: ``grad`` ``(B, H, Nq, Nk)`` summed into
    ``into`` ``(B, H, Nk, nb)`` at each pair's key row and bucket (``into``'s last two dimensions
    must be contiguous together, as a slice of keys is). 3.7 against 6.0 ms per 256 x 256 tile
    for the scatter of the transposed gradient it replaces."""
    B, H, Nk, nb = into.shape
    index = _key_rows_end_to_end(ids, nb, B, H)
    into.view(B, H, Nk * nb).scatter_add_(-1, index, grad.reshape(B, H, -1))


def _key_rows_end_to_end(ids: Tensor, nb: int, B: int, H: int) -> Tensor:
    """``(Nq, Nk)`` bucket ids as indices into the key rows laid end to end, ``(B, H, Nq Nk)``."""
    flat = ids + torch.arange(ids.shape[1], device=ids.device) * nb
    return flat.reshape(1, 1, -1).expand(B, H, -1)


def table_products(x: Tensor, table: Tensor, ids: Tensor, transposed: bool = False) -> Tensor:
    """``x_i . table[ids[i, j]]`` for every pair: ``(B, H, Nq, d)`` by ``(H, n, d)`` rows and
    ``(Nq, Nk)`` ids -> ``(B, H, Nq, Nk)``; with ``transposed``, its transpose ``(B, H, Nk, Nq)``,
    gathered straight into that layout where the first way is taken (DeBERTa's p2c, whose ``x``
    is the keys, is added to a term laid out by the queries).

    Two ways to the same numbers: every query meets every row and each pair picks its product
    (``B H Nq n`` products), or each pair picks its row and meets its query (``B H Nq Nk``,
    through an ``(H, Nq, Nk, d)`` copy of the rows, shared by the batch). The second is taken
    where rows outnumber keys and its copy is no larger than the first's scores. Positions
    spread over 256 (randomized) read 257 rows from 43 keys: 5.3 against 0.7 ms forward and
    backward at B = 32, H = 4, d = 16. At as many rows as keys the copy made a training step
    about 5% slower, and a long sequence (1024 keys, d = 64, B = 4) keeps the first way. There a
    broadcast matmul beat XL's ``per_head_product`` (whose head-first scores the gather reads
    more slowly): 218 against 256 ms forward and backward at 1024 x 1024 rows, H = 8.
    """
    B, H, Nq, d = x.shape
    n, Nk = table.shape[1], ids.shape[1]
    if Nk >= n or Nk * d > B * n:
        scores = x @ table.transpose(-2, -1)
        return gather_by_key(scores, ids.T) if transposed else gather_buckets(scores, ids)
    rows = table.index_select(1, ids.reshape(-1)).view(H * Nq, Nk, d)
    by_query = x.permute(1, 2, 0, 3).reshape(H * Nq, B, d)
    out = torch.bmm(by_query, rows.transpose(1, 2)).view(H, Nq, B, Nk).permute(2, 0, 1, 3)
    return out.transpose(-2, -1) if transposed else out
