"""FIRE's parameter gradients from one block's bias gradient, by hand, for the blocked kernel.

For a block of queries past the threshold, ``Fire.bias`` is a graph over every pair: ``psi`` of
the distance, a division by the row's ``psi(max(L, i))``, and the narrow MLP of ``pieces`` (the
units that bend in the block's range and one line per head). Autograd's backward of it writes a
gradient for each of its per-pair intermediates. Here the same gradients are sums over the
pairs: two matrix products with the hidden rows, a mask, and dot products along each row for
``c`` and ``L``. A block whose rows are all under the threshold reads a table per distance: its
gradient is summed per distance first and the small table takes autograd.

With ``G`` the block's ``dS`` summed over the batch, ``(H, n)`` over its n pairs, and the forward
``bias = offset + weights @ hidden``, ``hidden = relu(rows_b + rows_w x)``:

    d weights = G @ hidden^T            d hidden = (weights^T @ G) * [hidden > 0]
    d offset  = G summed per head       d x      = rows_w @ d hidden

then each piece goes back to the MLP's own weights, and ``d x`` to ``c`` and ``L`` through
``x = log(1 + c d) / log(1 + c max(L, i))``. The clamps of ``c`` and ``L`` pass a gradient where
they do not bite, and ``max(L, i)`` splits it evenly where ``i`` equals ``L``, as autograd does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from posenc_cli.encodings.fire import Fire


@dataclass(frozen=True)
class Pieces:
    """``f_theta`` over one range of inputs: ``offset + weights @ hidden``. ``flat``: the inputs
    ``(1, n)``; ``bends`` and ``on``: which hidden units bend in the range and which are
    straight and on; ``rows_w``: the input weight of each row of ``hidden`` ``(U + 1,)``, the
    last row the line's, which reads ``x - lo + 1``."""

    flat: Tensor
    lo: float
    bends: Tensor
    on: Tensor
    rows_w: Tensor
    hidden: Tensor
    weights: Tensor
    offset: Tensor


def parameter_grads(
    fire: Fire, grad: Tensor, q_pos: Tensor, k_pos: Tensor, kept: tuple | None = None
) -> list[Tensor]:
    """The gradient of ``sum(grad * fire.bias(q_pos, k_pos))`` for each of ``fire``'s parameters,
    in ``parameters()`` order; ``grad`` is ``(H, Nq, Nk)`` in the MLP's dtype. ``kept``: the
    ``(ratio, reach, pieces)`` the bias of these positions was just computed from."""
    with torch.no_grad():
        ratio, reach, p = kept or (*fire.ratios(q_pos, k_pos), None)
        if ratio is None:
            return _through_distances(fire, grad, q_pos, k_pos)
        p = p or fire.pieces(ratio)
        flat_grad = grad.reshape(grad.shape[0], -1)  # (H, n)
        d_offset = flat_grad.sum(1)  # (H,)
        d_weights = flat_grad @ p.hidden.T  # (H, U + 1)
        # ReLU's backward in one pass (a bool mask times the gradient converts the mask first)
        d_hidden = torch.ops.aten.threshold_backward(p.weights.T @ flat_grad, p.hidden, 0)
        d_rows_w = d_hidden @ p.flat[0]  # (U + 1,)
        d_rows_b = d_hidden.sum(1)
        d_x = (p.rows_w @ d_hidden).view(ratio.shape)  # (Nq, Nk)
        by_name = _mlp_grads(fire, p, d_offset, d_weights, d_rows_w, d_rows_b)
        by_name |= _normaliser_grads(fire, ratio, reach, d_x, q_pos, k_pos)
        return [by_name[name] for name, _ in fire.named_parameters()]


def _mlp_grads(fire, p: Pieces, d_offset, d_weights, d_rows_w, d_rows_b) -> dict[str, Tensor]:
    """The MLP's four tensors from the pieces' gradients: the bending units' rows and columns
    directly, the units on throughout through the line (``slope = W2[:, on] @ w[on]``,
    ``intercept = W2[:, on] @ b[on] + b2``, ``offset = intercept + slope (lo - 1)``)."""
    first, second = fire.mlp[0], fire.mlp[2]
    w, b, w_out = first.weight[:, 0], first.bias, second.weight
    d_slope = d_weights[:, -1] + d_offset * (p.lo - 1.0)  # (H,)
    d_intercept = d_offset
    d_w, d_b, d_w_out = torch.zeros_like(w), torch.zeros_like(b), torch.zeros_like(w_out)
    d_w[p.bends], d_b[p.bends] = d_rows_w[:-1], d_rows_b[:-1]
    d_w_out[:, p.bends] = d_weights[:, :-1]
    straight = w_out[:, p.on]  # (H, units on)
    d_w[p.on] = straight.T @ d_slope
    d_b[p.on] = straight.T @ d_intercept
    d_w_out[:, p.on] = torch.outer(d_slope, w[p.on]) + torch.outer(d_intercept, b[p.on])
    return {
        "mlp.0.weight": d_w[:, None],
        "mlp.0.bias": d_b,
        "mlp.2.weight": d_w_out,
        "mlp.2.bias": d_intercept.clone(),
    }


def _normaliser_grads(fire, ratio, reach, d_x, q_pos, k_pos) -> dict[str, Tensor]:
    """``c`` and ``L`` from ``d x``: with ``u = psi(max(L, i))`` and ``x = psi(d) / u``,
    ``dx/dc = (d / (1 + c d) - x max(L, i) / (1 + c max(L, i))) / u`` and
    ``dx/d max(L, i) = -x c / ((1 + c max(L, i)) u)``."""
    c_raw, threshold_raw = fire.c, fire.threshold
    dtype = ratio.dtype
    c = c_raw.to(dtype).clamp(min=1e-6)
    threshold = threshold_raw.to(dtype).clamp(min=1.0)
    distance = fire.distances(q_pos, k_pos).to(dtype)
    u = fire.psi(reach)  # (Nq, 1)
    per_row = (d_x * ratio).sum(1, keepdim=True)  # (Nq, 1): sum_j dx x
    along = (d_x * distance / (1 + c * distance)).sum(1, keepdim=True)  # (Nq, 1)
    d_c = ((along - per_row * reach / (1 + c * reach)) / u).sum()
    d_reach = -(per_row * c / ((1 + c * reach) * u))  # (Nq, 1)
    rows = q_pos.to(dtype)[:, None]
    share = (rows < threshold).to(dtype) + 0.5 * (rows == threshold).to(dtype)  # max's split
    d_threshold = (d_reach * share).sum()
    return {
        "c": (d_c * (c_raw > 1e-6)).to(c_raw.dtype),
        "threshold": (d_threshold * (threshold_raw > 1.0)).to(threshold_raw.dtype),
    }


def _through_distances(fire: Fire, grad: Tensor, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
    """Rows all under the threshold: the bias is a table per distance gathered into the block,
    so the table's gradient is ``grad`` summed per distance, and the table (a few hundred
    entries) takes autograd to the parameters."""
    distance = fire.distances(q_pos, k_pos).flatten()
    count = int(distance.max()) + 1
    heads = grad.shape[0]
    per_distance = grad.new_zeros(heads, count).index_add_(1, distance, grad.reshape(heads, -1))
    params = list(fire.parameters())
    with torch.enable_grad():
        table = fire.mlp(fire.per_distance(count, grad.device))  # (D, H)
        grads = torch.autograd.grad(table, params, per_distance.T, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
