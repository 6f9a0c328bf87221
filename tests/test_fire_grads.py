"""FIRE's parameter gradients by hand (``encodings/fire_grads.py``) against autograd through its
own bias, in float64, and the blocked kernel that takes them against dense attention."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import build_encoding, fire_grads
from posenc_cli.kernels import blocked_bias
from posenc_cli.models.attention import Attention
from tests.test_blocked_bias import dense, grads_of, qkv, route_blocked, same_results


def fire(causal: bool, threshold: float = 8.0, seed: int = 0):
    torch.manual_seed(seed)
    enc = build_encoding("fire", dim=32, heads=4, head_dim=8, causal=causal, threshold=threshold)
    return enc.double()


def autograd_grads(enc, grad, q_pos, k_pos):
    q = torch.zeros(1, 4, len(q_pos), 8, dtype=torch.float64)
    bias = enc.bias(q, q, q_pos, k_pos)[0]
    return torch.autograd.grad((bias * grad).sum(), list(enc.parameters()), allow_unused=True)


# (queries, keys): rows under the threshold 8 only, across it (row 8 itself, where max(L, i)
# splits its gradient), past it only; keys before the queries (memory) and not from 0
RANGES = {
    "under": (torch.arange(2, 8), torch.arange(0, 8)),
    "across": (torch.arange(5, 14), torch.arange(3, 14)),
    "past": (torch.arange(20, 31), torch.arange(11, 31)),
    "far-keys": (torch.arange(40, 46), torch.arange(3, 12)),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("where", RANGES)
@pytest.mark.parametrize("seed", [0, 1])
def test_hand_gradients_equal_autograd_through_the_bias(causal, where, seed):
    enc = fire(causal, seed=seed)
    q_pos, k_pos = RANGES[where]
    grad = torch.randn(4, len(q_pos), len(k_pos), dtype=torch.float64)
    got = fire_grads.parameter_grads(enc, grad, q_pos, k_pos)
    want = autograd_grads(enc, grad, q_pos, k_pos)
    names = [name for name, _ in enc.named_parameters()]
    for name, g, w in zip(names, got, want, strict=True):
        w = torch.zeros_like(g) if w is None else w
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "c, threshold", [(1e-7, 8.0), (0.1, 0.5)], ids=["c-clamped", "threshold-clamped"]
)
def test_a_clamped_parameter_gets_no_gradient_as_under_autograd(c, threshold):
    enc = fire(True)
    with torch.no_grad():  # training may take them there
        enc.c.fill_(c)
        enc.threshold.fill_(threshold)
    q_pos, k_pos = RANGES["across"]
    grad = torch.randn(4, len(q_pos), len(k_pos), dtype=torch.float64)
    got = fire_grads.parameter_grads(enc, grad, q_pos, k_pos)
    want = autograd_grads(enc, grad, q_pos, k_pos)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, rtol=1e-9, atol=0)
    by_name = dict(zip([name for name, _ in enc.named_parameters()], got, strict=True))
    assert float(by_name["c" if c < 1e-6 else "threshold"]) == 0.0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("memory", [0, 7])
@pytest.mark.parametrize("tile", [blocked_bias.KEY_TILE, 5])
def test_kernel_with_fire_blocks_equals_dense_attention(monkeypatch, causal, memory, tile):
    """``bias_blocks`` through the kernel, blocks of 16 and tiles of 5 keys, the threshold 8
    inside the queries' range: every tile's gradient comes from ``add_grads``, past the
    threshold from the pieces its bias was computed from, and the output and the gradients of
    q, k, v and every parameter are dense attention's."""
    monkeypatch.setattr(blocked_bias, "KEY_TILE", tile)
    enc = fire(causal)
    block = enc.bias_blocks()
    calls = []
    real = fire_grads.parameter_grads
    monkeypatch.setattr(
        fire_grads, "parameter_grads", lambda *a: calls.append(a[-1] is not None) or real(*a)
    )
    N = 45
    q, k, v = qkv(4, N, N + memory)
    k_pos = torch.arange(3, 3 + N + memory)
    q_pos = k_pos[memory:]
    learned = list(enc.parameters())
    inputs = [q, k, v, *learned]
    out = blocked_bias.blocked_bias_attention(
        q, k, v, q_pos, k_pos, block, learned, 8**-0.5, causal, 16
    )
    ref = dense(q, k, v, enc.bias(q, k, q_pos, k_pos), q_pos, k_pos, 8**-0.5, causal)
    same_results(out, grads_of(out, inputs, 1), ref, grads_of(ref, inputs, 1))
    assert calls and all(calls)  # every tile reaches past the threshold and kept its pieces


def test_attention_module_sends_fire_through_the_hand_gradients(monkeypatch):
    """The module asks the encoding for its blocks (``bias_blocks``), so training takes the hand
    path, and its gradients are those of the unblocked module."""
    enc = fire(True)
    att = Attention(32, 4, enc, causal=True).double()
    x = torch.randn(2, 30, 32, dtype=torch.float64)
    inputs = list(att.parameters())
    used = []
    real = fire_grads.parameter_grads
    monkeypatch.setattr(fire_grads, "parameter_grads", lambda *a: used.append(1) or real(*a))

    def run(blocked: bool):
        route_blocked(monkeypatch, blocked)
        out = att(x)
        return out, grads_of(out, inputs, 2)

    fast, fast_grads = run(True)
    assert used
    slow, slow_grads = run(False)
    same_results(fast, fast_grads, slow, slow_grads)
