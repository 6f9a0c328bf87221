"""Adaptive relative encodings (issue 18 part 2, the source article's section 5): the ``auto``
rules against hand-computed literals, the rescaled ranges at evaluation, and the learned
breakpoints of T5 (soft reads, gradients, and the fixed function when frozen)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import adaptive, build_encoding
from posenc_cli.encodings.base import BackboneFacts, grid_positions
from posenc_cli.encodings.irpe import ImageRPE
from posenc_cli.encodings.irpe_index import piecewise_index as fixed_piecewise
from posenc_cli.encodings.shaw import ShawRelative
from posenc_cli.encodings.t5 import T5Bias, log_buckets, relative_position_bucket
from posenc_cli.errors import UsageError
from posenc_cli.kernels import flex, soft_index
from posenc_cli.models import flex_path
from posenc_cli.models.attention import Attention

# --- rule 1: settings from the trained extent ------------------------------------------------


def test_auto_settings_are_the_stated_rules():
    # T5: max(ceil(L / 4), 2 max_exact); T5's own 128 at its trained 512 with 32 buckets
    assert adaptive.t5_max_distance(512, 8) == 128 and adaptive.t5_max_distance(512, 16) == 128
    assert adaptive.t5_max_distance(64, 16) == 32 and adaptive.t5_max_distance(64, 5) == 16
    assert adaptive.t5_max_distance(8, 3) == 6  # ceil(8 / 4) = 2 is inside the exact band
    assert [adaptive.shaw_max_distance(n) for n in (64, 10, 1)] == [16, 3, 1]
    assert adaptive.irpe_ratio(14, 14) == 1.75 and adaptive.irpe_ratio(16, 8) == 2.0


def test_t5_auto_from_the_trained_length():
    causal = build_encoding("t5", heads=2, head_dim=4, causal=True, max_distance="auto",
                            train_length=64)  # fmt: skip
    assert (causal.num_buckets, causal.max_exact, causal.max_distance) == (32, 16, 32)
    assert causal.rescale and not causal.toeplitz  # the range follows the query past 64
    both = T5Bias(max_distance="auto", train_length=64, heads=2)
    assert (both.per_side, both.max_exact, both.max_distance) == (16, 8, 16)
    fewer = T5Bias(num_buckets=20, max_distance="auto", train_length=64, heads=2)
    assert (fewer.max_exact, fewer.max_distance) == (5, 16)
    t5 = T5Bias(max_distance="auto", train_length=512, heads=2)
    assert (t5.num_buckets, t5.max_distance) == (32, 128)  # T5's published settings
    plain = T5Bias(heads=2)
    assert not plain.rescale and plain.toeplitz


def test_t5_auto_bucket_count_by_hand():
    """max_exact = ceil(log2 L) - 1 per side, as many log buckets: 512 tokens -> 8 -> 32
    bidirectional (T5's), 16 causal; 64 -> 5 -> 20 and 10; 100 -> ceil(6.64) - 1 = 6 -> 24."""
    assert [adaptive.t5_num_buckets(n, True) for n in (512, 64, 100, 2)] == [32, 20, 24, 4]
    assert [adaptive.t5_num_buckets(n, False) for n in (512, 64)] == [16, 10]
    both = T5Bias(num_buckets="auto", max_distance="auto", train_length=512, heads=2)
    assert (both.num_buckets, both.max_exact, both.max_distance) == (32, 8, 128) and both.rescale
    causal = T5Bias(num_buckets="auto", train_length=64, causal=True, heads=2)
    assert (causal.num_buckets, causal.max_exact, causal.max_distance) == (10, 5, 128)
    with pytest.raises(UsageError, match="num_buckets 'auto' needs train_length"):
        T5Bias(num_buckets="auto", heads=2)


def test_shaw_and_irpe_auto():
    shaw = build_encoding("shaw", heads=2, head_dim=4, max_distance="auto", train_length=64)
    assert shaw.max_distance == 16 and shaw.num_buckets == 33 and shaw.rescale
    irpe = ImageRPE(ratio="auto", height=14, width=14, heads=2, head_dim=4)
    assert irpe.scales == [(1.75, 3.5, 14.0)] and irpe.counts == [7 * 7 + 1]  # official's 49
    dense = ImageRPE(ratio="auto", height=16, width=8, heads=2, head_dim=4)
    assert dense.scales == [(2.0, 4.0, 16.0)] and dense.counts == [9 * 9 + 1]
    only_alpha = ImageRPE(alpha="auto", height=16, width=16, heads=2, head_dim=4)
    assert only_alpha.scales == [(2.0, 3.8, 15.2)]  # beta and gamma keep ratio 1.9's


def test_the_backbone_facts_give_irpe_auto_its_grid():
    # the ViT and DETR build their encodings from these facts, the grid among them
    facts = BackboneFacts(dim=8, heads=2, height=16, width=16, prefix_tokens=1)
    enc = build_encoding("irpe", **facts.for_encoding(ImageRPE, {"ratio": "auto"}))
    assert enc.trained_side == 16 and enc.scales == [(2.0, 4.0, 16.0)]


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: T5Bias(max_distance="auto"), "train_length"),
        (lambda: T5Bias(rescale=True), "rescale false"),
        (lambda: T5Bias(max_distance="auto", train_length=0), ">= 1"),
        (lambda: T5Bias(breakpoints="moving"), "'learned'"),
        (lambda: ShawRelative(max_distance="auto"), "train_length"),
        (lambda: ImageRPE(ratio="auto"), "height"),
        (lambda: ImageRPE(ratio="auto", height=8, width=8, ratios=[1.9, 3.8]), "ratios"),
        (lambda: ImageRPE(rescale=True, height=8), "width"),
    ],
)
def test_bad_adaptive_settings_say_what_to_set(build, words):
    with pytest.raises(UsageError) as err:
        build()
    assert words in str(err.value) and "\n" not in str(err.value)


# --- rule 2: the range follows the input at evaluation ---------------------------------------


def test_contexts_and_stretch_by_hand():
    q, k = torch.tensor([0, 3, 7]), torch.arange(8)
    assert adaptive.contexts(q, k, both_sides=False).tolist() == [1, 4, 8]
    assert adaptive.contexts(q, k, both_sides=True).tolist() == [8, 5, 8]
    assert adaptive.stretch(q, k, False, 4).tolist() == [1.0, 1.0, 2.0]
    assert adaptive.contexts(q + 5, k + 5, both_sides=False).tolist() == [1, 4, 8]  # shifted
    assert adaptive.grid_stretch((15, 3), 8) == 2.0 and adaptive.grid_stretch((7, 7), 8) == 1.0


def test_t5_rescaled_buckets_by_hand():
    # causal 20 buckets, max_exact 10, max_distance 16, trained at 64. The query at 127 sees 128
    # positions, s = 2, so its log band ends at 32: d -> 10 + floor(10 log(d/10) / log 3.2).
    enc = T5Bias(num_buckets=20, max_distance=16, train_length=64, rescale=True, causal=True,
                 heads=1)  # fmt: skip
    pos = torch.arange(128)
    ids = enc.bucket_ids(pos, pos)
    distances = [0, 9, 10, 12, 20, 31, 100]
    # 12: 10 + floor(1.567) = 11; 20: 10 + floor(5.959) = 15; 31: 10 + floor(9.73) = 19
    assert [int(ids[127, 127 - d]) for d in distances] == [0, 9, 10, 11, 15, 19, 19]
    # the query at 63 is inside the trained context: the plain buckets (12 -> 10 + 3.88)
    assert [int(ids[63, 63 - d]) for d in distances[:-1]] == [0, 9, 10, 13, 19, 19]
    fixed = T5Bias(num_buckets=20, max_distance=16, causal=True, heads=1)
    assert torch.equal(ids[:64, :64], fixed.bucket_ids(pos[:64], pos[:64]))
    # 'auto' (here 20 = 2 max_exact) without the stretch is the plain function at that range
    off = T5Bias(num_buckets=20, max_distance="auto", train_length=64, causal=True,
                 rescale=False, heads=1)  # fmt: skip
    plain = T5Bias(num_buckets=20, max_distance=20, causal=True, heads=1)
    assert torch.equal(off.bucket_ids(pos, pos), plain.bucket_ids(pos, pos))


def dense_attention(q, k, v, bias, causal, scale):
    logits = q @ k.transpose(-2, -1) * scale + bias
    if causal:
        n = q.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("breakpoints", ["fixed", "learned"])
def test_t5_rescaled_score_mod_equals_the_bias(causal, breakpoints):
    torch.manual_seed(0)
    enc = T5Bias(num_buckets=8, max_distance="auto", train_length=16, causal=causal,
                 breakpoints=breakpoints, heads=2, head_dim=4).double()  # fmt: skip
    q, k, v = (torch.randn(1, 2, 40, 4, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(40) + 3
    with torch.no_grad():
        mod = flex_path.score_mod_for(enc, q, pos, pos)
        mask = flex.causal_mask(pos, pos) if causal else None
        got = flex.attention(q, k, v, mod, mask, 0.5)
        want = dense_attention(q, k, v, enc.bias(q, q, pos, pos), causal, 0.5)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_t5_rescaled_blocks_equal_the_whole_bias():
    """Past 512 keys the attention module asks the bias one block of queries at a time; the
    context of each query counts from the first key, so blocks agree with the whole."""
    torch.manual_seed(1)
    enc = T5Bias(num_buckets=20, max_distance="auto", train_length=64, causal=True,
                 heads=2, head_dim=4)  # fmt: skip
    attn = Attention(8, 2, enc, causal=True).double()
    x = torch.randn(1, 600, 8, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x)
        q, k, v = (
            attn.split_heads(attn.q(x)),
            *(attn.split_heads(t) for t in attn.kv(x).chunk(2, dim=-1)),
        )
        pos = torch.arange(600)
        out = dense_attention(q, k, v, enc.bias(q, q, pos, pos), True, enc.logit_scale())
        want = attn.merge_heads(out)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_shaw_rescaled_rows_by_hand():
    # k = 16 (L = 64), h = 8; the query at 127 has s = 2: |d| > 8 reads 8 + (|d| - 8) / 2
    enc = ShawRelative(max_distance="auto", train_length=64, heads=1, head_dim=4, causal=True)
    pos = torch.arange(128)
    lo, hi, w = enc.soft_rows(pos, pos)
    row = {d: (int(lo[127, 127 - d]), int(hi[127, 127 - d]), float(w[127, 127 - d]))
           for d in (4, 8, 20, 21, 24, 40)}  # fmt: skip
    # rows are clip(j - i) + 16: d = 4 -> 12; 20 -> 14 -> 2; 21 -> 14.5 -> 1.5; 24, 40 -> 0
    assert row == {4: (12, 13, 0.0), 8: (8, 9, 0.0), 20: (2, 3, 0.0), 21: (1, 2, 0.5),
                   24: (0, 1, 0.0), 40: (0, 1, 0.0)}  # fmt: skip
    assert enc.soft_rows(pos[:64], pos[:64]) is None  # inside the trained context: plain clip


def test_shaw_rescaled_attention_matches_interpolated_embeddings():
    """Eq. 3-4 with a^K_ij, a^V_ij interpolated between the two rows, built pair by pair."""
    torch.manual_seed(2)
    enc = ShawRelative(max_distance="auto", train_length=8, heads=2, head_dim=4, causal=True)
    attn = Attention(8, 2, enc, causal=True).double()
    with torch.no_grad():
        enc.key_table.normal_()
        enc.value_table.normal_()
    x = torch.randn(2, 20, 8, dtype=torch.float64)
    got = attn(x)
    q = attn.split_heads(attn.q(x))
    key, val = (attn.split_heads(t) for t in attn.kv(x).chunk(2, dim=-1))
    k, near, n = 2, 1, 20
    a_key = torch.zeros(n, n, 4, dtype=torch.float64)
    a_val = torch.zeros(n, n, 4, dtype=torch.float64)
    for i in range(n):
        s = max(1.0, (i + 1) / 8)
        for j in range(n):
            d = j - i
            u = abs(d) if abs(d) <= near else min(near + (abs(d) - near) / s, k)
            u = math.copysign(u, d) + k
            lo = math.floor(u)
            hi, w = min(lo + 1, 2 * k), u - lo
            a_key[i, j] = (1 - w) * enc.key_table[lo] + w * enc.key_table[hi]
            a_val[i, j] = (1 - w) * enc.value_table[lo] + w * enc.value_table[hi]
    e = (q[:, :, :, None] * (key[:, :, None] + a_key)).sum(-1) / 2.0
    e = e.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    z = (e.softmax(-1)[..., None] * (val[:, :, None] + a_val)).sum(-2)
    torch.testing.assert_close(got, attn.merge_heads(z), atol=1e-10, rtol=1e-10)


def test_irpe_rescaled_gamma_by_hand():
    # trained 8 x 8: ratio 1, alpha 1, beta 2, gamma 8; cross row ids are g(dr) + 2.
    # On 16 x 16, gamma is 16: g(3) = round(1 + ln 3 / ln 16) = round(1.40) = 1 (fixed: 1.53 -> 2)
    enc = ImageRPE(method="cross", mode="bias", ratio="auto", height=8, width=8, heads=2)
    fixed = ImageRPE(method="cross", mode="bias", ratio=1.0, heads=2)
    g16, g8 = grid_positions(16, 16), grid_positions(8, 8)
    rows = [int(enc.map_ids(g16, g16)[0][0, 16 * r]) for r in range(6)]
    assert rows == [2, 1, 1, 1, 0, 0]  # query (0, 0), keys (r, 0): offsets -r
    assert [int(fixed.map_ids(g16, g16)[0][0, 16 * r]) for r in range(6)] == [2, 1, 1, 0, 0, 0]
    for got, want in zip(enc.map_ids(g8, g8), fixed.map_ids(g8, g8), strict=True):
        assert torch.equal(got, want)  # the trained grid: the plain ids
    off = ImageRPE(method="cross", mode="bias", ratio="auto", height=8, width=8, rescale=False)
    assert torch.equal(off.map_ids(g16, g16)[0], fixed.map_ids(g16, g16)[0])


# --- the soft index and the learned breakpoints ----------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("nb", "md"), [(32, 128), (16, 64), (20, 16), (8, 6), (64, 256)])
def test_real_breakpoint_buckets_are_the_fixed_ones_at_integers(bidirectional, nb, md):
    per_side = nb // 2 if bidirectional else nb
    distance = torch.arange(0, 1000)
    got = log_buckets(distance, float(per_side // 2), float(md), per_side)
    want = relative_position_bucket(-distance, bidirectional, nb, md)  # keys before the query
    assert torch.equal(got, want)
    soft = soft_index.t5_index(distance.double(), per_side // 2, md, per_side)
    assert torch.equal(soft[: per_side // 2], distance[: per_side // 2].double())  # exact band


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("nb", "md"), [(32, 128), (20, 16), (8, 6)])
def test_frozen_learned_breakpoints_are_the_fixed_function(causal, nb, md):
    torch.manual_seed(3)
    fixed = T5Bias(num_buckets=nb, max_distance=md, causal=causal, heads=2, head_dim=4)
    learned = T5Bias(num_buckets=nb, max_distance=md, causal=causal, heads=2, head_dim=4,
                     breakpoints="learned")  # fmt: skip
    learned.load_state_dict(fixed.state_dict(), strict=False)
    learned.requires_grad_(False)
    assert not learned.soft
    pos = torch.arange(-150, 151)
    assert torch.equal(learned.bucket_ids(pos, pos), fixed.bucket_ids(pos, pos))
    q = torch.randn(1, 2, len(pos), 4)
    assert torch.equal(learned.bias(q, q, pos, pos), fixed.bias(q, q, pos, pos))
    # learning: on the exact band the soft read is one entry, so it equals the fixed bias
    learned.requires_grad_(True)
    near = torch.arange(learned.max_exact)
    torch.testing.assert_close(learned.bias(q, q, near, near), fixed.bias(q, q, near, near))


def test_gradient_reaches_the_breakpoints():
    torch.manual_seed(4)
    enc = T5Bias(num_buckets=16, max_distance="auto", train_length=32, causal=True,
                 breakpoints="learned", heads=2, head_dim=4)  # fmt: skip
    attn = Attention(8, 2, enc, causal=True)
    x = torch.randn(2, 48, 8)  # past the trained 32: the stretched range too
    (attn(x) ** 2).sum().backward()
    for p in (enc.log_exact, enc.log_span, enc.table.weight):
        assert p.grad is not None and bool(p.grad.abs().sum() > 0)
    ids = enc.bucket_ids(torch.arange(48), torch.arange(48))
    assert int(ids.min()) >= 0 and int(ids.max()) < enc.num_buckets


def test_soft_index_finite_differences():
    torch.manual_seed(5)
    distance = torch.tensor([0.0, 3.0, 5.0, 9.0, 17.0, 40.0, 90.0], dtype=torch.float64)
    me = torch.tensor(4.3, dtype=torch.float64, requires_grad=True)
    md = torch.tensor(37.7, dtype=torch.float64, requires_grad=True)
    table = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)

    def t5(me, md, table):
        return soft_index.read(table, soft_index.t5_index(distance, me, md, 16), 15)

    assert torch.autograd.gradcheck(t5, (me, md, table))
    x = torch.tensor([-40.0, -6.0, -1.0, 0.0, 1.5, 2.0, 7.0, 11.0, 90.0], dtype=torch.float64)
    alpha = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    gamma = torch.tensor(13.1, dtype=torch.float64, requires_grad=True)
    values = torch.randn(2, 9, dtype=torch.float64, requires_grad=True)  # B = 4: 9 buckets

    def irpe(alpha, gamma, values):
        return soft_index.read(values, soft_index.piecewise_index(x, alpha, 4.2, gamma) + 4, 8)

    assert torch.autograd.gradcheck(irpe, (alpha, gamma, values))


IRPE_PARAMS = [(1.9, 3.8, 15.2), (2.0, 4.0, 16.0), (1.0, 2.0, 8.0), (3.5, 7.0, 14.0)]


@pytest.mark.parametrize(("alpha", "beta", "gamma"), IRPE_PARAMS)
def test_soft_piecewise_index_rounds_to_eq_18(alpha, beta, gamma):
    x = torch.arange(-300, 301, dtype=torch.float64)
    u = soft_index.piecewise_index(x, alpha, beta, gamma)
    assert torch.equal(u.round().long(), fixed_piecewise(x, alpha, beta, gamma))
    assert float(u.abs().max()) == int(beta)


# --- the recipes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["text/lm-adaptive", "text/lm-adaptive-shaw"])
def test_the_adaptive_lm_studies_have_the_lm_studys_budget(name):
    from posenc_cli.config import load_recipe

    study, lm = load_recipe(name), load_recipe("text/lm-extrapolation")
    for section in ("model", "data", "train", "eval"):
        assert getattr(study, section) == getattr(lm, section), section
    assert study.encoding.params["train_length"] == lm.data.train_lengths[1]


def test_t5_learned_breakpoints_through_the_blocked_kernel():
    """Past 512 causal keys the distance table goes block by block through the flash kernel;
    the soft table's gradient still reaches the breakpoints, and values match the dense path."""
    torch.manual_seed(6)
    enc = T5Bias(num_buckets=16, max_distance=64, causal=True, breakpoints="learned", heads=2,
                 head_dim=4).double()  # fmt: skip
    attn = Attention(8, 2, enc, causal=True).double()
    x = torch.randn(1, 520, 8, dtype=torch.float64)
    (attn(x) ** 2).sum().backward()
    grads = [p.grad.clone() for p in (enc.log_exact, enc.log_span)]
    q, k, v = (
        attn.split_heads(attn.q(x)),
        *(attn.split_heads(t) for t in attn.kv(x).chunk(2, dim=-1)),
    )
    pos = torch.arange(520)
    enc.zero_grad()
    out = dense_attention(q, k, v, enc.bias(q, q, pos, pos), True, enc.logit_scale())
    (attn.merge_heads(out) ** 2).sum().backward()
    for got, p in zip(grads, (enc.log_exact, enc.log_span), strict=True):
        assert bool(got.abs() > 0)
        torch.testing.assert_close(got, p.grad, atol=1e-8, rtol=1e-6)


# --- iRPE's learned breakpoints --------------------------------------------------------------

IRPE_CASES = [(m, mode) for m in ("euclidean", "quant", "cross", "product")
              for mode in ("bias", "contextual")]  # fmt: skip


def irpe_pair(method, mode, window=None):
    """A fixed and a learned iRPE with the same random tables, in float64 attention."""
    on = "qkv" if mode == "contextual" else "qk"
    torch.manual_seed(7)
    made = []
    for breakpoints in ("fixed", "learned"):
        enc = ImageRPE(method=method, mode=mode, on=on, heads=2, head_dim=4,
                       breakpoints=breakpoints).double()  # fmt: skip
        made.append(Attention(8, 2, enc, window=window).double())
    for table in made[0].encoding.tables.values():
        torch.nn.init.normal_(table)
    made[1].load_state_dict(made[0].state_dict(), strict=False)
    return made


@pytest.mark.parametrize(("method", "mode"), IRPE_CASES)
@pytest.mark.parametrize("window", [None, 3])
def test_frozen_irpe_breakpoints_are_the_fixed_function(method, mode, window):
    fixed, learned = irpe_pair(method, mode, window)
    learned.encoding.log_alpha.requires_grad_(False)  # the breakpoints alone: the tables
    learned.encoding.log_gamma.requires_grad_(False)  # still learn, so both take one path
    pos = grid_positions(5, 6, prefix=1)
    x = torch.randn(2, len(pos), 8, dtype=torch.float64)
    assert not learned.encoding.soft
    assert torch.equal(learned(x, positions=pos), fixed(x, positions=pos))
    for got, want in zip(learned.encoding.map_ids(pos, pos), fixed.encoding.map_ids(pos, pos),
                         strict=True):  # fmt: skip
        assert torch.equal(got, want)


def soft_reference(enc: ImageRPE, q_pos, k_pos):
    """Bias-mode keys term pair by pair: the soft index per axis in plain Python floats, its
    two neighbours, their product (or the one axis of euclidean / quant) read from the table."""
    (alpha, beta, gamma), count = enc.learned_scales()[0], enc.counts[0]
    a, g, B = float(alpha.detach()), float(gamma.detach()), int(beta)
    table = next(iter(enc._letter_tables("k")))  # (1, nb), merged for cross

    def u(x: float) -> float:
        if abs(x) <= a:
            return float(x)
        return math.copysign(min(a + math.log(abs(x) / a) / math.log(g / a) * (beta - a), B), x)

    def reads(x: float) -> list[tuple[int, float]]:
        at = u(x) + B
        lo = math.floor(at)
        return [(lo, 1 - (at - lo)), (min(lo + 1, 2 * B), at - lo)]

    out = torch.zeros(len(q_pos), len(k_pos), dtype=torch.float64)
    for i, (qr, qc) in enumerate(q_pos.tolist()):
        for j, (kr, kc) in enumerate(k_pos.tolist()):
            if qr < 0 or kr < 0:
                prefix = (count - 1) ** 2 if enc.method == "cross" else count - 1
                out[i, j] = table[0, prefix]
                continue
            dr, dc = qr - kr, qc - kc
            if enc.method in ("euclidean", "quant"):
                x = dr * dr + dc * dc
                x = round(math.sqrt(x)) if enc.method == "euclidean" else x
                out[i, j] = sum(w * table[0, b] for b, w in reads(x))
            else:
                side = count - 1 if enc.method == "cross" else 2 * B + 1
                out[i, j] = sum(wr * wc * table[0, r * side + c]
                                for r, wr in reads(dr) for c, wc in reads(dc))  # fmt: skip
    return out


@pytest.mark.parametrize("method", ["euclidean", "quant", "cross", "product"])
def test_soft_irpe_reads_by_hand(method):
    torch.manual_seed(8)
    enc = ImageRPE(method=method, mode="bias", on="k", heads=2, head_dim=4,
                   breakpoints="learned").double()  # fmt: skip
    with torch.no_grad():
        for table in enc.tables.values():
            table.normal_()
        enc.log_alpha.fill_(0.1)  # off the integers, so the reads really are blends
        enc.log_gamma.fill_(-0.2)
    pos = grid_positions(4, 5, prefix=1)
    got = enc.bias(None, None, pos, pos)[0, 0]
    torch.testing.assert_close(got, soft_reference(enc, pos, pos), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(("method", "mode"), [("product", "contextual"), ("cross", "bias")])
def test_gradient_reaches_irpe_breakpoints_and_windows_agree(method, mode):
    _, learned = irpe_pair(method, mode)
    enc = learned.encoding
    pos = grid_positions(6, 6, prefix=1)
    x = torch.randn(2, len(pos), 8, dtype=torch.float64)
    out = learned(x, positions=pos)
    (out**2).sum().backward()
    assert bool(enc.log_alpha.grad.abs().sum() > 0) and bool(enc.log_gamma.grad.abs().sum() > 0)
    # a window covering the grid reads the same soft buckets as global attention
    windowed = Attention(8, 2, enc, window=11).double()
    windowed.load_state_dict(learned.state_dict())
    torch.testing.assert_close(windowed(x, positions=pos), out, atol=1e-10, rtol=1e-10)


def test_the_text_model_tells_auto_its_trained_length():
    """No train_length in the recipe: the text model passes the longest trained sequence in
    tokens (an LM segment of 64 characters: 64; a copy problem of 10 symbols: BOS, 10, SEP, 10,
    EOS = 23), and the user's own value still wins."""
    from posenc_cli.config import load_recipe
    from posenc_cli.data import build_task
    from posenc_cli.models.text import build_text_model

    def built(*overrides):
        recipe = load_recipe("quickstart", ["sweep=null", "encoding.name=t5", *overrides])
        task = build_task(recipe.data)
        return build_text_model(recipe.model, recipe.encoding, task, recipe.data).encoding

    lm = built("data.task=text", "data.train_lengths=[64,64]", "encoding.max_distance=auto")
    assert lm.train_length == 64 and lm.max_distance == 32  # max(ceil(64 / 4), 2 * 16)
    copy = built("data.train_lengths=[3,10]", "encoding.max_distance=auto")
    assert copy.train_length == 23
    own = built(
        "data.train_lengths=[3,10]", "encoding.max_distance=auto", "encoding.train_length=200"
    )
    assert own.train_length == 200 and own.max_distance == 50
