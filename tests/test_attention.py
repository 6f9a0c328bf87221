"""The attention module's own logic: masks, memory, and the CPU bias-gradient fast path."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.kernels.biased_sdpa import biased_attention
from posenc_cli.models.attention import Attention, attention_mask


def reference(q, k, v, bias, scale):
    return ((q @ k.transpose(-2, -1)) * scale + bias).softmax(-1) @ v


@pytest.mark.parametrize(
    "bias_shape", [(1, 3, 7, 11), (2, 3, 7, 11), (2, 1, 7, 11), (1, 1, 7, 11), (2, 3, 1, 11)]
)
def test_biased_attention_matches_autograd_reference(bias_shape):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, 3, 11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    bias = torch.randn(*bias_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    got = biased_attention(q, k, v, bias, 0.3)
    want = reference(q, k, v, bias, 0.3)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    g_got = torch.autograd.grad((got * weights).sum(), (q, k, v, bias))
    g_want = torch.autograd.grad((want * weights).sum(), (q, k, v, bias))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_a_bias_broadcast_over_queries_survives_chunking(monkeypatch):
    """Chunks past the first query row must still see a (B, H, 1, Nk) bias."""
    import posenc_cli.kernels.biased_sdpa as module

    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 1)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    bias = torch.randn(1, 2, 1, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    got = torch.autograd.grad(biased_attention(q, k, v, bias, 0.5).sum(), (q, bias))
    want = torch.autograd.grad(reference(q, k, v, bias, 0.5).sum(), (q, bias))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_biased_attention_chunks_agree(monkeypatch):
    """The bias gradient is computed in query chunks; a tiny chunk size must not change it."""
    import posenc_cli.kernels.biased_sdpa as module

    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    bias = torch.randn(1, 2, 9, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    (whole,) = torch.autograd.grad(biased_attention(q, k, v, bias, 0.5).sum(), bias)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 1)
    (chunked,) = torch.autograd.grad(biased_attention(q, k, v, bias, 0.5).sum(), bias)
    torch.testing.assert_close(whole, chunked, atol=1e-12, rtol=0)


def test_attention_mask_combines_causal_and_padding():
    pos = torch.arange(4)
    keys = torch.tensor([[True, True, False, True]])
    mask = attention_mask(pos, pos, causal=True, key_mask=keys)
    expected = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 1]], dtype=torch.bool
    )
    assert mask.shape == (1, 1, 4, 4)
    assert torch.equal(mask[0, 0], expected)


def test_causal_with_memory_sees_all_memory():
    q_pos = torch.arange(3, 5)
    k_pos = torch.arange(5)
    mask = attention_mask(q_pos, k_pos, causal=True, key_mask=None)[0, 0]
    assert torch.equal(mask, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))


def test_memory_equals_attending_over_the_concatenation():
    """Queries over [memory; x] give the last rows of full causal attention over both."""
    torch.manual_seed(0)
    att = Attention(16, 2, causal=True).double()
    mem, x = torch.randn(1, 5, 16).double(), torch.randn(1, 3, 16).double()
    full = att(torch.cat([mem, x], 1))
    torch.testing.assert_close(att(x, memory=mem), full[:, 5:], atol=1e-12, rtol=0)


def test_left_padding_under_causal_mask_gives_no_nan():
    att = Attention(8, 2, causal=True)
    key_mask = torch.tensor([[False, False, True, True]])
    out = att(torch.randn(1, 4, 8), key_mask=key_mask)
    assert torch.isfinite(out).all()


def test_dim_must_divide_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        Attention(10, 3)


def test_encoding_built_for_another_head_shape_is_refused():
    from posenc_cli.encodings import build_encoding

    with pytest.raises(ValueError, match="head_dim=64 but the attention has heads=2, head_dim=8"):
        Attention(16, 2, build_encoding("alibi", heads=2))


@pytest.mark.parametrize("name", ["t5", "deberta", "xl"])
def test_flash_and_explicit_paths_agree_on_output_and_gradients(name, monkeypatch):
    """Attention picks the explicit path for small learned biases and the flash path with a
    separate bias gradient for large ones; both must give the same numbers."""
    import posenc_cli.models.attention as module
    from posenc_cli.encodings import build_encoding

    results = []
    for limit in (0, 10**9):
        monkeypatch.setattr(module, "EXPLICIT_MAX_PAIRS", limit)
        torch.manual_seed(0)
        enc = build_encoding(name, dim=16, heads=2, head_dim=8, causal=True).double()
        att = Attention(16, 2, enc, causal=True).double()
        x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
        out = att(x)
        grads = torch.autograd.grad(out.square().sum(), [x, *att.parameters()])
        results.append((out, grads))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=1e-9, rtol=1e-9)
