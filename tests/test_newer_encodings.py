"""FIRE, KERPLE, Sandwich and xPos against literal per-pair implementations of their papers'
formulas (float64, values and gradients), and the invariances the papers state."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.models.attention import Attention

H, D = 4, 8  # heads, head dim


def pairs(n: int):
    return [(i, j) for i in range(n) for j in range(n)]


def build(name: str, **params):
    torch.manual_seed(0)
    enc = build_encoding(name, dim=H * D, heads=H, head_dim=D, **params).double()
    return enc


def qk(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, n, D, generator=g, dtype=torch.float64) for _ in range(2))


def assert_same_values_and_gradients(enc, fast, literal):
    """``fast`` and ``literal`` are functions of nothing that return tensors of one shape;
    their values and the gradients of a weighted sum w.r.t. every parameter must agree."""
    a, b = fast(), literal()
    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    weights = torch.randn(a.shape, generator=torch.Generator().manual_seed(9), dtype=a.dtype)
    params = [p for p in enc.parameters() if p.requires_grad]
    if params:
        ga = torch.autograd.grad((a * weights).sum(), params, allow_unused=True)
        gb = torch.autograd.grad((literal() * weights).sum(), params, allow_unused=True)
        for x, y in zip(ga, gb, strict=True):
            torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


# --- KERPLE ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_is_its_kernel_per_pair(kernel):
    enc = build("kerple", kernel=kernel)
    n = 7
    pos = torch.arange(n)
    q, k = qk(n)

    def literal():
        out = torch.zeros(1, H, n, n, dtype=torch.float64)
        for h in range(H):
            r1 = enc.r1[h].clamp(min=0.01)
            r2 = enc.r2[h].clamp(min=0.01) if kernel == "log" else enc.r2[h].clamp(0.01, 2.0)
            for i, j in pairs(n):
                d = abs(i - j)
                if kernel == "log":
                    out[0, h, i, j] = -r1 * torch.log1p(r2 * d)
                else:
                    out[0, h, i, j] = 0.0 if d == 0 else -r1 * d**r2
        return out

    assert_same_values_and_gradients(enc, lambda: enc.bias(q, k, pos, pos), literal)


def test_kerple_parameters_stay_positive_as_published():
    enc = build("kerple", kernel="power")
    with torch.no_grad():
        enc.r1.fill_(-3.0)
        enc.r2.fill_(5.0)
    b = enc.bias(*qk(4), torch.arange(4), torch.arange(4))
    # r1 read as 0.01, r2 as 2: -0.01 * d^2
    torch.testing.assert_close(b[0, 0, 0, 3], torch.tensor(-0.09, dtype=torch.float64))


# --- Sandwich -------------------------------------------------------------------------------


def test_sandwich_is_the_inner_product_of_sinusoids_per_pair():
    enc = build("sandwich", width=16)
    n = 9
    pos = torch.arange(n) + 5
    q, k = qk(n)

    def literal():
        out = torch.zeros(1, H, n, n, dtype=torch.float64)
        for h in range(H):
            for i, j in pairs(n):
                total = sum(math.cos((i - j) / 10000 ** (2 * m / 16)) for m in range(1, 9))
                out[0, h, i, j] = (total - 8) / (8 * (h + 1) / H)
        return out

    assert_same_values_and_gradients(enc, lambda: enc.bias(q, k, pos, pos), literal)
    b = enc.bias(q, k, pos, pos)
    assert float(b.max()) == pytest.approx(0.0) and (b.diagonal(dim1=-2, dim2=-1) == 0).all()


# --- FIRE -----------------------------------------------------------------------------------


def fire_literal(enc, q_pos, k_pos, causal: bool):
    c = enc.c.clamp(min=1e-6)
    L = enc.threshold.clamp(min=1.0)
    out = torch.zeros(1, H, len(q_pos), len(k_pos), dtype=torch.float64)
    for a, i in enumerate(q_pos.tolist()):
        for b, j in enumerate(k_pos.tolist()):
            d = max(i - j, 0) if causal else abs(i - j)
            x = torch.log(c * d + 1) / torch.log(c * torch.maximum(L, torch.tensor(float(i))) + 1)
            out[0, :, a, b] = enc.mlp(x.view(1, 1))[0]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("threshold", [512.0, 4.0])  # below L: one normaliser; past it: per row
def test_fire_is_its_formula_per_pair(causal, threshold):
    enc = build("fire", causal=causal, threshold=threshold)
    pos = torch.arange(10)
    q, k = qk(10)
    assert_same_values_and_gradients(
        enc, lambda: enc.bias(q, k, pos, pos), lambda: fire_literal(enc, pos, pos, causal)
    )


def test_fire_evaluates_its_mlp_as_the_lines_between_its_knees():
    """The piecewise form against the MLP itself on inputs that cross every knee, with a unit
    of weight 0 (no knee) and two units sharing a knee; on a knee itself the values agree (the
    gradient there is a choice of side, the MLP's relu'(0) = 0 against the piece below)."""
    enc = build("fire", causal=True)
    first = enc.mlp[0]
    with torch.no_grad():
        first.weight[0, 0], first.bias[0] = 0.0, 0.3  # always on
        first.weight[1, 0], first.bias[1] = 0.0, -0.3  # always off
        first.weight[2, 0], first.bias[2] = 2.0, -1.0  # knee at 0.5 ...
        first.weight[3, 0], first.bias[3] = -4.0, 2.0  # ... shared, facing the other way
    knees = (-first.bias / first.weight[:, 0])[2:].detach()
    on_knees = knees.view(2, -1)
    torch.testing.assert_close(enc.piecewise(on_knees), enc.mlp(on_knees[..., None]).movedim(-1, 0))
    x = torch.linspace(-3.0037, 2.9963, 301, dtype=torch.float64).view(7, 43).requires_grad_()
    assert (x.detach()[..., None] - knees).abs().min() > 1e-6  # every input off the knees
    assert_same_values_and_gradients(
        enc, lambda: enc.piecewise(x), lambda: enc.mlp(x[..., None]).movedim(-1, 0)
    )
    weights = torch.randn(H, *x.shape, dtype=torch.float64)
    (slope,) = torch.autograd.grad((enc.piecewise(x) * weights).sum(), x)
    (expected,) = torch.autograd.grad((enc.mlp(x[..., None]).movedim(-1, 0) * weights).sum(), x)
    torch.testing.assert_close(slope, expected)  # d f / d x, through which L and c learn


def test_fire_without_knees_is_one_line():
    enc = build("fire", causal=True)
    with torch.no_grad():
        enc.mlp[0].weight.zero_()  # every unit on or off everywhere
    x = torch.linspace(0, 1, 12, dtype=torch.float64).view(3, 4)
    torch.testing.assert_close(enc.piecewise(x), enc.mlp(x[..., None]).movedim(-1, 0))


@pytest.mark.parametrize(
    "lo, hi",
    [(0.6, 0.7), (0.4, 0.6), (0.5, 0.9), (0.1, 0.5), (0.55, 0.55)],
    ids=["between-knees", "across-a-knee", "from-a-knee", "to-a-knee", "one-value"],
)
def test_fire_keeps_as_relus_only_the_units_that_bend_inside_the_inputs_range(lo, hi):
    """Units whose knee lies outside the inputs' range (or on its ends) are folded into one
    line; the result is the MLP's, values and gradients, however the range sits on the knees.
    (An input on a knee has two one-sided gradients; the MLP's relu'(0) = 0 is one of them, so
    gradients are compared at the other inputs.)"""
    enc = build("fire", causal=True)
    first = enc.mlp[0]
    with torch.no_grad():
        first.weight[:, 0] = torch.linspace(-2.0, 2.0, first.weight.shape[0])
        first.bias.copy_(-0.5 * first.weight[:, 0])  # every knee at 0.5 ...
        first.weight[0, 0], first.bias[0] = 3.0, -0.6  # ... but one at 0.2
    x = torch.linspace(lo, hi, 24, dtype=torch.float64).view(4, 6).requires_grad_()
    fast, mlp = enc.piecewise(x), enc.mlp(x[..., None]).movedim(-1, 0)
    torch.testing.assert_close(fast, mlp, atol=1e-12, rtol=1e-12)
    off_knees = ((x.detach() - 0.5).abs() > 1e-9) & ((x.detach() - 0.2).abs() > 1e-9)
    weights = torch.randn(fast.shape, dtype=torch.float64) * off_knees
    inputs = [x, *enc.mlp.parameters()]
    for a, b in zip(
        torch.autograd.grad((fast * weights).sum(), inputs),
        torch.autograd.grad((mlp * weights).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_fire_sees_only_the_distance_and_the_normaliser():
    """Below L two pairs at one distance share a bias wherever they sit; past L the query's
    position enters through psi(max(L, i)) alone."""
    enc = build("fire", causal=True, threshold=8.0)
    q, k = qk(30)
    b = enc.bias(q, k, torch.arange(30), torch.arange(30))[0]
    torch.testing.assert_close(b[:, 5, 2], b[:, 8, 5])  # i - j = 3, both rows <= L
    assert not torch.allclose(b[:, 20, 17], b[:, 25, 22])  # past L: normalisers differ
    # only the ratio psi(i - j) / psi(max(L, i)) matters: with c = 1 and L = 8, the pair
    # (15, 12) reads log 4 / log 16 and the pair (5, 3) log 3 / log 9, both 1/2
    enc.c.data.fill_(1.0)
    b = enc.bias(q, k, torch.arange(30), torch.arange(30))[0]
    torch.testing.assert_close(b[:, 15, 12], b[:, 5, 3])
    assert not torch.allclose(b[:, 15, 12], b[:, 5, 2])


# --- xPos -----------------------------------------------------------------------------------


def xpos_literal_scores(enc, q, k, q_pos, k_pos):
    """q_m . k_n with every pair rotated by its own 2 x 2 matrix and scaled by
    zeta^(+m/B) and zeta^(-n/B), no centring."""
    out = torch.zeros(1, H, len(q_pos), len(k_pos), dtype=torch.float64)
    B = enc.scale_base
    for a, m in enumerate(q_pos.tolist()):
        for b, n in enumerate(k_pos.tolist()):
            total = torch.zeros(H, dtype=torch.float64)
            for c in range(D // 2):
                theta = 10000 ** (-2 * c / D)
                zeta = (2 * c / D + enc.gamma) / (1 + enc.gamma)
                rot = lambda t: torch.tensor(  # noqa: E731
                    [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=torch.float64
                )
                qm = rot(m * theta) @ q[0, :, a, 2 * c : 2 * c + 2].T * zeta ** (m / B)
                kn = rot(n * theta) @ k[0, :, b, 2 * c : 2 * c + 2].T * zeta ** (-n / B)
                total += (qm * kn).sum(0)
            out[0, :, a, b] = total
    return out


def test_xpos_scores_are_the_papers_per_pair():
    enc = build("xpos")
    pos = torch.arange(6) + 100
    q, k = qk(6)

    def fast():
        rq, rk = enc.rotate(q, k, pos, pos)
        return rq @ rk.transpose(-2, -1)

    torch.testing.assert_close(fast(), xpos_literal_scores(enc, q, k, pos, pos))


def test_xpos_scores_depend_on_m_minus_n_alone_and_decay():
    enc = build("xpos")
    q, k = qk(1)
    score = lambda m, n: enc.rotate(q, k, torch.tensor([m]), torch.tensor([n]))  # noqa: E731
    near = [(a @ b.transpose(-2, -1)) for a, b in [score(50, 40), score(950, 940)]]
    torch.testing.assert_close(near[0], near[1])
    # with q = k on every pair, the score at distance 0 is |q|^2; far away it is damped
    same = torch.ones(1, H, 1, D, dtype=torch.float64)
    rq, rk = enc.rotate(same, same, torch.tensor([3000]), torch.tensor([0]))
    assert float((rq * rk).sum(-1).abs().max()) < D


def test_xpos_refuses_a_bidirectional_model():
    from posenc_cli.errors import UsageError

    with pytest.raises(UsageError, match="causal models only"):
        build_encoding("xpos", heads=H, head_dim=D, causal=False)


# --- CoPE -----------------------------------------------------------------------------------


def test_cope_is_its_gated_count_per_pair():
    enc = build("cope", npos_max=6)
    n = 7
    pos = torch.arange(n) + 3
    q, k = qk(n, seed=2)
    q = q * 3  # gates away from 1/2, counts past the cap for some pairs

    def literal():
        out = torch.zeros(1, H, n, n, dtype=torch.float64)
        scale = D**-0.5
        for h in range(H):
            for i, j in pairs(n):
                if j > i:
                    continue
                p = sum(torch.sigmoid(q[0, h, i] @ k[0, h, t] * scale) for t in range(j, i + 1))
                p = torch.clamp(p, max=5.0)
                low = int(p.floor())
                high = min(low + 1, 5)
                w = p - low
                e = enc.table[h]
                out[0, h, i, j] = (1 - w) * (q[0, h, i] @ e[low]) + w * (q[0, h, i] @ e[high])
        return out

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert_same_values_and_gradients(
        enc, lambda: enc.bias(q, k, pos, pos) * causal, lambda: literal()
    )


def test_cope_counts_alike_with_gaps_and_for_the_last_queries_alone():
    """The running-sum form (consecutive positions) against the masked sum from the right
    (positions with gaps), and the last queries of a longer context against the full square."""
    enc = build("cope", npos_max=6)
    q, k = qk(7, seed=3)
    q = q * 3
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    square = enc.bias(q, k, torch.arange(7), torch.arange(7)) * causal
    gapped = enc.bias(q, k, torch.arange(7) * 2, torch.arange(7) * 2) * causal
    torch.testing.assert_close(square, gapped, atol=1e-12, rtol=0)
    last = enc.bias(q[:, :, 4:], k, torch.arange(4, 7), torch.arange(7)) * causal[4:]
    torch.testing.assert_close(last, square[:, :, 4:], atol=1e-12, rtol=0)


def test_cope_counts_only_the_gated_keys():
    """A key the query gates shut (sigmoid ~ 0) adds nothing to the positions behind it."""
    enc = build("cope", npos_max=16)
    q, k = qk(5, seed=4)
    k[0, :, 2] = -50 * q[0, :, 4] / q[0, :, 4].norm(dim=-1, keepdim=True)  # query 4 shuts key 2
    p = enc.positions(q, k, torch.arange(5), torch.arange(5))
    gate = torch.sigmoid(q[0, :, 4] @ k[0, :, 1].T * D**-0.5).diagonal()
    torch.testing.assert_close(p[0, :, 4, 1] - p[0, :, 4, 3], gate, atol=1e-6, rtol=0)


# --- FoX ------------------------------------------------------------------------------------


def test_fox_is_the_sum_of_log_forget_gates_between_key_and_query():
    enc = build("fox")
    with torch.no_grad():
        enc.weight.normal_(std=0.5)
    n = 6
    pos = torch.arange(n)
    q, k = qk(n, seed=5)

    def literal():
        out = torch.zeros(1, H, n, n, dtype=torch.float64)
        for h in range(H):
            for i, j in pairs(n):
                if j <= i:
                    gates = [torch.sigmoid(enc.weight[h] @ k[0, h, t] + enc.offset[h])
                             for t in range(j + 1, i + 1)]  # fmt: skip
                    out[0, h, i, j] = sum((torch.log(g) for g in gates), torch.tensor(0.0))
        return out

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert_same_values_and_gradients(enc, lambda: enc.bias(q, k, pos, pos) * causal, literal)


# --- PoPE -----------------------------------------------------------------------------------


def test_pope_scores_are_magnitudes_times_positional_phases_per_pair():
    enc = build("pope")
    with torch.no_grad():
        enc.delta.normal_()
    n = 5
    pos = torch.arange(n) * 3 + 7
    q, k = qk(n, seed=6)

    def literal():
        out = torch.zeros(1, H, n, n, dtype=torch.float64)
        for h in range(H):
            for a, m in enumerate(pos.tolist()):
                for b, s in enumerate(pos.tolist()):
                    out[0, h, a, b] = sum(
                        torch.nn.functional.softplus(q[0, h, a, c])
                        * torch.nn.functional.softplus(k[0, h, b, c])
                        * torch.cos((m - s) * 10000 ** (-c / D) + enc.delta[h, c])
                        for c in range(D)
                    )
        return out

    def fast():
        rq, rk = enc.rotate(q, k, pos, pos)
        return rq @ rk.transpose(-2, -1)

    assert_same_values_and_gradients(enc, fast, literal)


def test_fox_rides_inside_the_causal_kernel_with_the_dense_result():
    """``c_i - c_j`` as one more q/k channel: the same outputs and gradients as the explicit
    bias under the causal mask, and no shortcut once keys outnumber queries."""
    torch.manual_seed(0)
    enc = build_encoding("fox", heads=4, head_dim=8)
    torch.nn.init.normal_(enc.weight, std=1.0)  # gates that differ per token
    att = Attention(32, 4, enc, causal=True).double()
    x = torch.randn(2, 50, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *att.parameters()]
    out = att(x)
    got = torch.autograd.grad(out.square().sum(), inputs)
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    pos = torch.arange(50)
    logits = q @ k.transpose(-2, -1) * 8**-0.5 + enc.bias(q, k, pos, pos)
    ref = att.merge_heads(logits.masked_fill(pos[None] > pos[:, None], -torch.inf).softmax(-1) @ v)
    want = torch.autograd.grad(ref.square().sum(), inputs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    assert enc.attend(q[:, :, 10:], k, v, pos[10:], pos, 8**-0.5, True) is None


@pytest.mark.parametrize("causal", [True, False])
def test_pope_on_long_inputs_takes_the_flash_kernel_with_the_same_numbers(causal, monkeypatch):
    """Past EXPLICIT_MAX_PAIRS PoPE pads v to 2d for SDPA's flash kernel; values and gradients
    equal the module's own path (the hook switched off) in float64."""
    import posenc_cli.encodings.pope as pope_module

    monkeypatch.setattr(pope_module, "EXPLICIT_MAX_PAIRS", 10)
    torch.manual_seed(0)
    enc = build_encoding("pope", heads=H, head_dim=D, causal=causal).double()
    attn = Attention(H * D, H, enc, causal=causal).double()
    x = torch.randn(2, 9, H * D, dtype=torch.float64, requires_grad=True)
    calls = []
    real = enc.attend
    monkeypatch.setattr(enc, "attend", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fast = attn(x)
    assert calls and fast.shape == x.shape
    grads = torch.autograd.grad(fast.square().sum(), [x, *attn.parameters()])
    monkeypatch.setattr(enc, "attend", lambda *a, **kw: None)
    slow = attn(x)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-10)
    again = torch.autograd.grad(slow.square().sum(), [x, *attn.parameters()])
    for a, b in zip(grads, again, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
