"""RoPE against independent references: scalar formulas, rotation matrices, dense attention."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.rope import (
    RotaryEmbedding,
    apply_rotary,
    rope_frequencies,
    yarn_mscale,
)
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

TIGHT = {"atol": 1e-9, "rtol": 1e-9}
LAYOUTS = ["interleaved", "half"]
REPO = Path(__file__).resolve().parents[1]


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def pair_index(layout: str, r: int) -> list[tuple[int, int]]:
    """The channels rotated together: (2i, 2i+1) or (i, i + r/2)."""
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(r // 2)]
    return [(i, i + r // 2) for i in range(r // 2)]


def rotation_matrix(pos: int, inv_freq: list[float], layout: str, d: int, scale: float = 1.0):
    """``(d, d)`` block rotation at one position, built entry by entry."""
    R = torch.eye(d, dtype=torch.float64)
    for i, (a, b) in enumerate(pair_index(layout, 2 * len(inv_freq))):
        c, s = math.cos(pos * inv_freq[i]) * scale, math.sin(pos * inv_freq[i]) * scale
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def rotate_dense(x: torch.Tensor, positions: list[int], enc: RotaryEmbedding) -> torch.Tensor:
    """Apply ``R(pos)`` to each row of ``x`` ``(..., N, d)``, one matrix per position."""
    freqs = enc.inv_freq.tolist()
    rows = [
        x[..., n, :] @ rotation_matrix(p, freqs, enc.layout, x.shape[-1], enc.mscale).T
        for n, p in enumerate(positions)
    ]
    return torch.stack(rows, dim=-2)


# --- relative property, layouts, norms, pass-through ------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("scaling", ["none", "yarn"])
def test_dot_product_depends_only_on_offset(layout: str, fraction: float, scaling: str) -> None:
    factor = 1.0 if scaling == "none" else 4.0
    enc = RotaryEmbedding(
        layout=layout, fraction=fraction, scaling=scaling, factor=factor, head_dim=12,
        original_length=64,
    )  # fmt: skip
    q, k = rand(2, 3, 5, 12, seed=1), rand(2, 3, 7, 12, seed=2)
    m, n = torch.tensor([0, 3, 9, 20, 41]), torch.tensor([1, 2, 5, 8, 13, 30, 77])

    def logits(shift: int) -> torch.Tensor:
        qr, kr = enc.rotate(q, k, m + shift, n + shift)
        return qr @ kr.transpose(-1, -2)  # (2, 3, 5, 7)

    assert_close(logits(0), logits(1000), **TIGHT)
    assert_close(logits(0), logits(17), **TIGHT)
    # and it does depend on the offset: moving only the keys changes the scores
    qr, kr = enc.rotate(q, k, m, n + 1)
    assert (qr @ kr.transpose(-1, -2) - logits(0)).abs().max() > 1e-3


def test_interleaved_equals_half_after_channel_permutation() -> None:
    d, r = 10, 8  # fraction 0.8: channels 8, 9 pass through
    inter = RotaryEmbedding(layout="interleaved", fraction=0.8, head_dim=d)
    half = RotaryEmbedding(layout="half", fraction=0.8, head_dim=d)
    # half-split channel i holds interleaved channel 2i, channel i + r/2 holds 2i + 1
    perm = list(range(0, r, 2)) + list(range(1, r, 2)) + list(range(r, d))
    x, pos = rand(2, 2, 6, d), torch.arange(3, 9)
    qi, ki = inter.rotate(x, x, pos, pos)
    qh, kh = half.rotate(x[..., perm], x[..., perm], pos, pos)
    assert_close(qh, qi[..., perm], **TIGHT)
    assert_close(kh, ki[..., perm], **TIGHT)
    assert (qh - qi).abs().max() > 1e-3  # without the permutation they differ


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_preserves_every_pair_norm(layout: str) -> None:
    enc = RotaryEmbedding(layout=layout, head_dim=8)
    x, pos = rand(1, 2, 9, 8), torch.arange(100, 109)
    y, _ = enc.rotate(x, x, pos, pos)
    for a, b in pair_index(layout, 8):
        assert_close(y[..., a] ** 2 + y[..., b] ** 2, x[..., a] ** 2 + x[..., b] ** 2, **TIGHT)
    assert (y - x).abs().max() > 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unrotated_channels_pass_unchanged(layout: str) -> None:
    enc = RotaryEmbedding(layout=layout, fraction=0.5, head_dim=10)
    assert enc.rotary_dim == 4  # 5 rounds down to an even count
    x, pos = rand(2, 2, 6, 10), torch.arange(6) + 5
    q, k = enc.rotate(x, x + 1, pos, pos)
    assert torch.equal(q[..., 4:], x[..., 4:])
    assert torch.equal(k[..., 4:], x[..., 4:] + 1)
    assert (q[..., :4] - x[..., :4]).abs().max() > 1e-3


def test_rotary_dim_rounding() -> None:
    assert RotaryEmbedding(fraction=0.58, head_dim=100).rotary_dim == 58  # 57.999... in floats
    assert RotaryEmbedding(fraction=0.25, head_dim=64).rotary_dim == 16
    assert RotaryEmbedding(fraction=0.1, head_dim=30).rotary_dim == 2


# --- the source article's function ------------------------------------------------------------


def roformer_reference(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoFormer eq. 34 by scalar loops: pairs (2i, 2i+1), theta_i = base^(-2i/d), positions 0.."""
    out = x.clone()
    *lead, N, d = x.shape
    flat, res = x.reshape(-1, N, d), out.view(-1, N, d)
    for row in range(flat.shape[0]):
        for m in range(N):
            for i in range(d // 2):
                angle = m * base ** (-2 * i / d)
                x0, x1 = flat[row, m, 2 * i].item(), flat[row, m, 2 * i + 1].item()
                res[row, m, 2 * i] = x0 * math.cos(angle) - x1 * math.sin(angle)
                res[row, m, 2 * i + 1] = x1 * math.cos(angle) + x0 * math.sin(angle)
    return out


def test_equals_roformer_formula_of_the_article() -> None:
    enc = RotaryEmbedding(head_dim=8)  # defaults: interleaved, base 10000, as the article
    q, k, pos = rand(2, 2, 7, 8, seed=3), rand(2, 2, 7, 8, seed=4), torch.arange(7)
    qr, kr = enc.rotate(q, k, pos, pos)
    assert_close(qr, roformer_reference(q), **TIGHT)
    assert_close(kr, roformer_reference(k), **TIGHT)


def load_benchmark():
    path = REPO / "benchmarks" / "rope_vs_article.py"
    spec = importlib.util.spec_from_file_location("rope_vs_article", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_article_code_from_the_seed_matches() -> None:
    bench = load_benchmark()
    if not bench.SEED.is_file():
        pytest.skip(f"seed file {bench.SEED} not present")
    article_rope = bench.load_article_rope(bench.SEED)
    q, k = rand(2, 3, 33, 16, seed=5).float(), rand(2, 3, 33, 16, seed=6).float()
    theirs = article_rope(q, k)
    ours = RotaryEmbedding(head_dim=16).rotate(q, k, torch.arange(33), torch.arange(33))
    for a, b in zip(ours, theirs, strict=True):
        assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_benchmark_restores_flattened_code() -> None:
    bench = load_benchmark()
    flat = "import math def f(a, b): c = (a + b) * 2 d = [c] return d[0] def g(): return f(1, 2)"
    namespace: dict = {}
    exec(bench.restore_lines(flat), namespace)
    assert namespace["g"]() == 6


# --- scalings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_linear_scaling_is_position_interpolation(layout: str) -> None:
    plain = RotaryEmbedding(layout=layout, head_dim=8)
    linear = RotaryEmbedding(layout=layout, head_dim=8, scaling="linear", factor=4.0)
    x, p = rand(1, 2, 6, 8), torch.arange(6) * 3
    assert_close(linear.rotate(x, x, 4 * p, 4 * p)[0], plain.rotate(x, x, p, p)[0], **TIGHT)
    assert (linear.rotate(x, x, p, p)[0] - plain.rotate(x, x, p, p)[0]).abs().max() > 1e-3


def test_ntk_base_formula() -> None:
    r, base, factor = 16, 10000.0, 8.0
    got = rope_frequencies(r, base, "ntk", factor)
    new_base = base * factor ** (r / (r - 2))
    want = torch.tensor([new_base ** (-2 * i / r) for i in range(r // 2)], dtype=torch.float64)
    assert_close(got, want, **TIGHT)
    plain = rope_frequencies(r, base)
    assert got[0] == plain[0] == 1.0  # the fastest pair is untouched
    assert_close(got[-1], plain[-1] / factor, **TIGHT)  # the slowest one is interpolated


def yarn_reference(r: int, base: float, factor: float, length: int, fast=32.0, slow=1.0):
    """YaRN's frequencies by the paper's recipe, pair by pair (reference code's ramp ends)."""

    def dim_at(turns: float) -> float:  # pair index with ``turns`` rotations over ``length``
        return r * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_at(fast)), 0)
    high = min(math.ceil(dim_at(slow)), r - 1)
    out = []
    for i in range(r // 2):
        theta = base ** (-2 * i / r)
        gamma = min(max((i - low) / (high - low), 0.0), 1.0)  # 0 extrapolate .. 1 interpolate
        out.append((1 - gamma) * theta + gamma * theta / factor)
    return torch.tensor(out, dtype=torch.float64)


def test_yarn_frequencies() -> None:
    r, base, factor, length = 64, 10000.0, 8.0, 2048
    got = rope_frequencies(r, base, "yarn", factor, length)
    assert_close(got, yarn_reference(r, base, factor, length), **TIGHT)
    plain = rope_frequencies(r, base)
    turns = length * plain / (2 * math.pi)  # rotations over the trained context
    fast, slow = turns > 64, turns < 0.5  # wavelength much shorter / much longer than 2048
    assert fast.sum() >= 5 and slow.sum() >= 5
    assert_close(got[fast], plain[fast], **TIGHT)
    assert_close(got[slow], plain[slow] / factor, **TIGHT)
    middle = ~fast & ~slow
    assert ((got[middle] <= plain[middle]) & (got[middle] >= plain[middle] / factor)).all()
    assert ((got[middle] < plain[middle]) & (got[middle] > plain[middle] / factor)).any()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_yarn_temperature(layout: str) -> None:
    factor = 16.0
    assert yarn_mscale(factor) == pytest.approx(0.1 * math.log(16) + 1)
    assert yarn_mscale(1.0) == 1.0
    enc = RotaryEmbedding(
        layout=layout, scaling="yarn", factor=factor, head_dim=8, fraction=0.5, original_length=32
    )
    x, pos = rand(1, 1, 5, 8), torch.arange(5) + 7
    q, k = enc.rotate(x, x, pos, pos)
    # logits at equal positions: the rotated part grows by (0.1 ln s + 1)^2, the rest by 1
    t = (0.1 * math.log(factor) + 1) ** 2
    want = t * (x[..., :4] ** 2).sum(-1) + (x[..., 4:] ** 2).sum(-1)
    assert_close((q * k).sum(-1), want, **TIGHT)


# --- through the attention module -------------------------------------------------------------


def dense_attention(attn: Attention, x, memory, causal: bool, offset: int) -> torch.Tensor:
    """Reference: per-position rotation matrices, explicit softmax, float64."""
    enc = attn.encoding
    B, N, D = x.shape
    H, d = attn.heads, attn.head_dim
    ctx = x if memory is None else torch.cat([memory, x], dim=1)
    Nk = ctx.shape[1]
    k_pos = list(range(offset, offset + Nk))
    q_pos = k_pos[Nk - N :]
    Wk, Wv = attn.kv.weight.chunk(2)
    bk, bv = attn.kv.bias.chunk(2)
    q = (x @ attn.q.weight.T + attn.q.bias).view(B, N, H, d).transpose(1, 2)
    k = (ctx @ Wk.T + bk).view(B, Nk, H, d).transpose(1, 2)
    v = (ctx @ Wv.T + bv).view(B, Nk, H, d).transpose(1, 2)
    q, k = rotate_dense(q, q_pos, enc), rotate_dense(k, k_pos, enc)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)  # (B, H, N, Nk)
    if causal:
        allowed = torch.tensor(k_pos)[None, :] <= torch.tensor(q_pos)[:, None]
        logits = logits.masked_fill(~allowed, float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, N, D)
    return attn.proj(out)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("fraction", "scaling", "factor"), [(1.0, "none", 1.0), (0.5, "yarn", 4.0), (1.0, "ntk", 2.0)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_dense_reference(layout, fraction, scaling, factor, causal) -> None:
    torch.manual_seed(0)
    enc = build_encoding(
        "rope", layout=layout, fraction=fraction, scaling=scaling, factor=factor,
        original_length=16, heads=2, head_dim=8, causal=causal,
    )  # fmt: skip
    attn = Attention(16, 2, enc, causal=causal).double()
    x, memory = rand(2, 5, 16, seed=7), rand(2, 3, 16, seed=8)
    for mem, offset in [(None, 0), (None, 11), (memory, 0), (memory, 4)]:
        got = attn(x, memory=mem, offset=offset)
        assert_close(got, dense_attention(attn, x, mem, causal, offset), **TIGHT)


def test_offset_equals_rotating_longer_sequence_and_slicing() -> None:
    enc = RotaryEmbedding(layout="half", head_dim=8, fraction=0.5)
    q, k, offset = rand(2, 2, 4, 8, seed=9), rand(2, 2, 4, 8, seed=10), 6
    pad = torch.zeros(2, 2, offset, 8, dtype=torch.float64)
    long_q, long_k = enc.rotate(
        torch.cat([pad, q], -2), torch.cat([pad, k], -2), torch.arange(10), torch.arange(10)
    )
    pos = torch.arange(offset, offset + 4)
    qr, kr = enc.rotate(q, k, pos, pos)
    assert_close(qr, long_q[..., offset:, :], **TIGHT)
    assert_close(kr, long_k[..., offset:, :], **TIGHT)
    assert (qr - enc.rotate(q, k, torch.arange(4), torch.arange(4))[0]).abs().max() > 1e-3


def test_attention_offset_and_cached_decoding() -> None:
    torch.manual_seed(1)
    attn = Attention(16, 2, RotaryEmbedding(heads=2, head_dim=8), causal=True).double()
    x = rand(1, 7, 16, seed=11)
    full = attn(x)
    # only relative positions matter: shifting every position changes nothing
    assert_close(attn(x, offset=25), full, **TIGHT)
    # decoding the last 2 tokens against the first 5 as a cache gives the full run's rows
    assert_close(attn(x[:, 5:], memory=x[:, :5]), full[:, 5:], **TIGHT)
    # a causal output never looks ahead
    changed = x.clone()
    changed[:, 4:] += 1
    assert_close(attn(changed)[:, :4], full[:, :4], **TIGHT)


def test_cached_tables_follow_positions() -> None:
    enc = RotaryEmbedding(head_dim=8)
    x = rand(1, 1, 4, 8)
    for start in [0, 5, 0, 5, 2]:
        pos = torch.arange(start, start + 4)
        assert_close(enc.rotate(x, x, pos, pos)[0], apply_rotary(x, pos, enc.inv_freq), **TIGHT)
    # not a range although first/last/length fit 0..3: computed directly, not from the cache
    scattered = torch.tensor([0, 2, 1, 3])
    want = rotate_dense(x, scattered.tolist(), enc)
    assert_close(enc.rotate(x, x, scattered, scattered)[0], want, **TIGHT)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_real_and_complex_paths_agree(layout: str) -> None:
    enc = RotaryEmbedding(layout=layout, head_dim=8)
    big = rand(2, 2, 5, 9)
    odd = big[..., 1:]  # odd storage offset: cannot be viewed as complex, takes the real formula
    pos = torch.arange(5) + 3
    want = rotate_dense(odd, pos.tolist(), enc)
    assert_close(enc.rotate(odd, odd, pos, pos)[0], want, **TIGHT)
    assert_close(enc.rotate(odd.contiguous(), odd, pos, pos)[0], want, **TIGHT)
    low, _ = enc.rotate(odd.to(torch.bfloat16), odd.to(torch.bfloat16), pos, pos)
    assert low.dtype == torch.bfloat16
    assert_close(low.double(), want, atol=3e-2, rtol=3e-2)


# --- gradients and errors ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_reach_q_and_k(layout: str) -> None:
    enc = RotaryEmbedding(layout=layout, head_dim=6, fraction=0.7)
    q = rand(1, 2, 3, 6, seed=12).requires_grad_()
    k = rand(1, 2, 4, 6, seed=13).requires_grad_()
    k_pos = torch.arange(2, 6)
    assert torch.autograd.gradcheck(lambda a, b: enc.rotate(a, b, k_pos[1:], k_pos), (q, k))
    attn = Attention(12, 2, RotaryEmbedding(layout=layout, heads=2, head_dim=6)).double()
    attn(rand(1, 4, 12)).square().sum().backward()
    assert attn.q.weight.grad.abs().sum() > 0 and attn.kv.weight.grad.abs().sum() > 0


def test_registry_and_class_attributes() -> None:
    enc = build_encoding("rope", dim=32, heads=4, head_dim=8, causal=True, base="500", factor=1)
    assert isinstance(enc, RotaryEmbedding) and enc.base == 500.0 and enc.causal
    assert (enc.family, enc.per_layer, enc.extrapolates) == ("rotary", False, True)
    assert list(enc.parameters()) == []
    with pytest.raises(UsageError, match="layout"):
        build_encoding("rope", layout="halves")


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 0.1, "head_dim": 8}, "fraction"),
        ({"factor": 2.0}, "scaling"),
        ({"scaling": "yarn", "factor": 0.5}, "factor"),
        ({"base": 1.0}, "base"),
        ({"scaling": "yarn", "factor": 2.0, "beta_fast": 0.5}, "beta"),
        ({"original_length": 0}, "original_length"),
    ],
)
def test_invalid_params(params: dict, word: str) -> None:
    with pytest.raises(UsageError, match=word):
        RotaryEmbedding(**params)
