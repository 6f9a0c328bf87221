"""Operation counts of one forward or training step.

Matmul-class FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per
multiply-add, so MACs = FLOPs / 2). On the CPU, ``F.scaled_dot_product_attention`` runs as
``aten._scaled_dot_product_flash_attention_for_cpu``, which has no registered formula and would
count zero; its forward and backward are given PyTorch's own SDPA formulas here (4 N_q N_k d per
head forward, as the two matmuls of the math path; twice that backward plus the recomputed
scores, as for the CUDA kernels). A causal mask is not discounted, as PyTorch's formulas do not.

What a FLOP counter leaves out is counted separately, one per output element:
- ``elementwise``: pointwise arithmetic (adds, multiplies, exp, sin/cos, softmax) and the additive
  mask a fused attention kernel applies to every logit;
- ``gathers``: indexing ops that read a table by id (gather, index_select, embedding, index,
  scatter_add), the cost of bucketed encodings such as T5 and iRPE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

aten = torch.ops.aten


# FlopCounterMode hands custom formulas the shapes of the tensor arguments.
def _cpu_sdpa_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _inplace_baddbmm(self, batch1, batch2, *args, out_shape=None, **kwargs) -> int:
    b, m, k = batch1
    return 2 * b * m * k * batch2[-1]  # as aten.baddbmm's formula: the add is not counted


CUSTOM_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    # the in-place form (kernels/bucket_attention.py) has no formula of its own
    aten.baddbmm_: _inplace_baddbmm,
}

GATHER_OPS = {
    aten.gather,
    aten.index_select,
    aten.embedding,
    aten.embedding_dense_backward,
    aten.index,
    aten.scatter_add,
    aten.scatter_add_,
    aten.index_add,
    aten.index_add_,
    aten.index_put,
    aten.index_put_,
    aten._index_put_impl_,
}

# Not arithmetic: moving or filling memory has the pointwise tag too.
NOT_ARITHMETIC = {aten.copy_, aten.clone, aten.fill_, aten.zero_, aten._to_copy, aten.where}

# Pointwise-in-effect ops that PyTorch does not tag pointwise.
REDUCING_ARITHMETIC = {
    aten._softmax,
    aten._safe_softmax,
    aten._log_softmax,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.sum,
    aten.mean,
    aten.native_layer_norm,
    aten.native_layer_norm_backward,
}


@dataclass
class OpCounts:
    flops: int = 0  # matmul-class, 2 per multiply-add
    elementwise: int = 0
    gathers: int = 0

    @property
    def macs(self) -> int:
        return self.flops // 2

    def minus(self, other: OpCounts) -> OpCounts:
        return OpCounts(
            self.flops - other.flops,
            self.elementwise - other.elementwise,
            self.gathers - other.gathers,
        )


def _numel(outputs) -> int:
    return sum(t.numel() for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor))


class ElementCounter(TorchDispatchMode):
    """Counts pointwise arithmetic and gathers, one per output element."""

    def __init__(self) -> None:
        super().__init__()
        self.elementwise = 0
        self.gathers = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if packet in GATHER_OPS:
            self.gathers += _numel(out)
        elif packet in CUSTOM_FORMULAS:
            mask = (kwargs or {}).get("attn_mask")
            if mask is not None:  # the kernel adds the mask to every logit
                q, k = args[0], args[1]
                self.elementwise += q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        elif packet in REDUCING_ARITHMETIC or (
            torch.Tag.pointwise in func.tags and packet not in NOT_ARITHMETIC
        ):
            self.elementwise += _numel(out)
        return out


def count_ops(step: Callable[[], object]) -> OpCounts:
    """Run ``step`` once and count its operations (forward, and backward if it calls one)."""
    flop_mode = FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS)
    elements = ElementCounter()
    with flop_mode, elements:
        step()
    return OpCounts(flop_mode.get_total_flops(), elements.elementwise, elements.gathers)
