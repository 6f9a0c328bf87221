"""CoPE's blocked attention (``kernels/cope_attention.py``) against the dense path it replaces:
CoPE's own ``bias`` (itself pinned to the paper's per-pair formula in test_newer_encodings.py)
added to the scaled scores under the causal and key masks, softmax, autograd. Float64, values
and the gradients of q, k, v and the table, in one block and in many."""

from __future__ import annotations

import pytest
import torch

import posenc_cli.kernels.cope_attention as kernel
from posenc_cli.encodings import build_encoding
from posenc_cli.models.attention import Attention

H, D = 4, 8
TIGHT = {"atol": 1e-12, "rtol": 1e-10}


def cope(npos_max: int = 6):
    torch.manual_seed(0)
    return build_encoding("cope", heads=H, head_dim=D, npos_max=npos_max, causal=True).double()


def inputs(n: int, n_keys: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, n, D, generator=g, dtype=torch.float64) * 3  # some counts past the cap
    k, v = (torch.randn(2, H, n_keys, D, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)]


def dense(enc, q, k, v, key_mask=None):
    k_pos = torch.arange(k.shape[-2]) + 3
    q_pos = k_pos[len(k_pos) - q.shape[-2] :]
    scores = q @ k.transpose(-2, -1) * enc.logit_scale() + enc.bias(q, k, q_pos, k_pos)
    seen = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if key_mask is not None:
        seen = seen & key_mask[:, None, None, :]
    return scores.masked_fill(~seen, torch.finfo(scores.dtype).min).softmax(-1) @ v


def assert_same(enc, q, k, v, key_mask=None):
    table = enc.table
    got = kernel.cope_attention(q, k, v, table, enc.logit_scale(), key_mask)
    want = dense(enc, q, k, v, key_mask)
    torch.testing.assert_close(got, want, **TIGHT)
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(5), dtype=got.dtype)
    leaves = [q, k, v, table]
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), leaves),
        torch.autograd.grad((want * weights).sum(), leaves),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.fixture(params=["one block", "blocks of 3 rows", "blocks computed again"])
def blocks(request, monkeypatch):
    if request.param != "one block":
        monkeypatch.setattr(kernel, "ROWS", 3)
    if request.param == "blocks computed again":  # the backward builds each block's terms anew
        monkeypatch.setattr(kernel, "KEEP_PAIRS", 0)


@pytest.mark.parametrize("npos_max", [3, 6, 64])  # counts capped often, sometimes, never
def test_values_and_gradients_equal_the_dense_path(blocks, npos_max):
    assert_same(cope(npos_max), *inputs(11, 11, seed=npos_max))


def test_keys_before_the_queries(blocks):
    """A memory of earlier keys: the queries are the last 7 of 12 keys."""
    assert_same(cope(), *inputs(7, 12, seed=1))


def test_right_padding(blocks):
    mask = torch.arange(10)[None, :] < torch.tensor([[10], [4]])
    assert_same(cope(), *inputs(10, 10, seed=2), mask)


def test_the_attention_module_takes_it_and_falls_back_where_it_does_not_serve(monkeypatch):
    """Consecutive positions with a real first key go to the kernel; left padding (a query with
    no real key) and positions with gaps take the dense path, with the same numbers."""
    torch.manual_seed(0)
    attn = Attention(H * D, H, cope(), causal=True).double()
    x = torch.randn(2, 9, H * D, dtype=torch.float64)
    calls = []
    real = kernel._CopeAttention.apply
    monkeypatch.setattr(kernel._CopeAttention, "apply", lambda *a: calls.append(1) or real(*a))
    right = torch.arange(9)[None, :] < torch.tensor([[9], [6]])
    fast = attn(x, key_mask=right)
    assert len(calls) == 1
    torch.testing.assert_close(attn(x, key_mask=right.long()), fast, **TIGHT)  # 0/1 alike
    calls.pop()
    attn(x, key_mask=right.flip(-1))
    attn(x, positions=torch.arange(9) * 2)
    assert len(calls) == 1
    monkeypatch.setattr(type(attn.encoding), "attend", lambda *a, **kw: None)
    torch.testing.assert_close(fast, attn(x, key_mask=right), **TIGHT)


def test_without_gradients_it_keeps_nothing_and_gives_the_same_output():
    enc = cope()
    q, k, v = inputs(9, 9, seed=3)
    with torch.no_grad():
        got = kernel.cope_attention(q, k, v, enc.table, enc.logit_scale())
        torch.testing.assert_close(got, dense(enc, q, k, v), **TIGHT)
    assert got.grad_fn is None
