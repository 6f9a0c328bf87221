"""The GPU path's score_mods and block masks against the explicit path.

On the CPU FlexAttention runs eagerly without gradients (torch 2.14 raises in its backward), so
every score_mod is checked there under ``torch.no_grad()``, and its gradients by applying it to
every pair at once under autograd; values and gradients of the compiled kernel are checked on
CUDA, skipped cleanly without a GPU."""

from __future__ import annotations

import shutil

import pytest
import torch

from posenc_cli.encodings import build_encoding, encoding_class
from posenc_cli.encodings.base import BackboneFacts, grid_positions
from posenc_cli.kernels import flex
from posenc_cli.kernels.visibility import Visibility
from posenc_cli.models import flex_path
from posenc_cli.models.attention import Attention
from posenc_cli.models.window import window_attention

ONE_D = ["alibi", "t5", "kerple", "sandwich", "fire"]
TWO_D = [
    ("swin", {}),
    ("irpe", {"mode": "bias", "on": "k"}),
    ("irpe", {"mode": "bias", "on": "qk"}),
    ("irpe", {"mode": "bias", "method": "cross", "on": "qk"}),
]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def dense(q, k, v, bias, mask, scale):
    logits = q @ k.transpose(-2, -1) * scale + bias
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(-1) @ v


def grid_encoding(name, params, height=4, width=5, prefix=1):
    facts = BackboneFacts(dim=32, heads=4, height=height, width=width, prefix_tokens=prefix)
    cls = encoding_class(name)
    enc = cls(**facts.for_encoding(cls, params))
    for p in enc.parameters():  # learned tables start at zero in some encodings: make them count
        torch.nn.init.normal_(p, std=0.5)
    return enc


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("name", ONE_D)
@pytest.mark.parametrize("causal", [True, False])
def test_one_d_score_mods_equal_the_bias(name, causal):
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal).double()
    memory, N = 5, 33
    k_pos = torch.arange(7, 7 + memory + N)  # not from 0, keys longer than queries
    q_pos = k_pos[memory:]
    q, k, v = randn(2, 4, N, 8), randn(2, 4, N + memory, 8), randn(2, 4, N + memory, 8)
    mask = (k_pos[None, :] <= q_pos[:, None]) if causal else None
    with torch.no_grad():
        mod = flex_path.score_mod_for(enc, q, q_pos, k_pos)
        got = flex.attention(q, k, v, mod, flex.causal_mask(q_pos, k_pos) if causal else None, 0.3)
        want = dense(q, k, v, enc.bias(q, k, q_pos, k_pos), mask, 0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_fire_past_its_threshold_takes_the_per_row_normaliser():
    torch.manual_seed(0)
    enc = build_encoding("fire", dim=32, heads=4, head_dim=8, causal=True, threshold=8.0).double()
    pos = torch.arange(40)
    q, k, v = randn(1, 4, 40, 8), randn(1, 4, 40, 8), randn(1, 4, 40, 8)
    with torch.no_grad():
        got = flex.attention(q, k, v, enc.score_mod(q, pos, pos), flex.causal_mask(pos, pos))
        want = dense(q, k, v, enc.bias(q, k, pos, pos), pos[None, :] <= pos[:, None], 8**-0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, params", TWO_D)
def test_two_d_score_mods_equal_the_bias_with_prefix_tokens(name, params):
    torch.manual_seed(0)
    enc = grid_encoding(name, params).double()
    assert enc.content_free and enc.toeplitz
    pos = grid_positions(4, 5, prefix=1)
    q, k, v = (randn(2, 4, len(pos), 8) for _ in range(3))
    with torch.no_grad():
        got = flex.attention(q, k, v, flex_path.score_mod_for(enc, q, pos, pos), None, 0.3)
        want = dense(q, k, v, enc.bias(q, k, pos, pos), None, 0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, params", [("swin", {}), ("irpe", {"mode": "bias", "on": "k"})])
@pytest.mark.parametrize("dilation", [1, 2])
def test_window_block_mask_equals_window_attention(name, params, dilation):
    torch.manual_seed(0)
    enc = grid_encoding(name, params, height=6, width=6).double()
    pos = grid_positions(6, 6, prefix=1)
    q, k, v = (randn(2, 4, len(pos), 8) for _ in range(3))
    with torch.no_grad():
        mod = flex_path.score_mod_for(enc, q, pos, pos)
        got = flex.attention(q, k, v, mod, flex.window_mask(pos, 3, dilation), 0.3)
        want = window_attention(q, k, v, enc, pos, 3, 0.3, dilation)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def every_pair(mod, scores):
    """A score_mod applied to all of ``scores`` (B, H, Nq, Nk) at once, each index broadcast
    along its own axis, under autograd: the function the compiled kernel differentiates on CUDA,
    which FlexAttention's CPU path cannot take a backward through."""
    index = [torch.arange(n).view([-1 if d == axis else 1 for d in range(4)])
             for axis, n in enumerate(scores.shape)]  # fmt: skip
    return mod(scores, *index)


def gradients_through(enc, q_pos, k_pos, causal, bias_of):
    """Gradients of one attention's output, for the queries and every learned parameter of
    ``enc``, with the bias taken from ``bias_of(q, k)``."""
    torch.manual_seed(1)
    q, k, v, weights = (randn(2, 4, n, 8) for n in (len(q_pos), len(k_pos), len(k_pos), len(q_pos)))
    q.requires_grad_()
    mask = (k_pos[None, :] <= q_pos[:, None]) if causal else None
    out = dense(q, k, v, bias_of(q, k), mask, 0.3)
    learned = [q] + [p for p in enc.parameters() if p.requires_grad]
    return torch.autograd.grad((out * weights).sum(), learned)


def gradient_cases():
    """Every score_mod of the GPU path with learned tables made to count: (id, encoding,
    query positions, key positions, causal)."""
    k_pos = torch.arange(7, 45)  # not from 0, and 5 keys more than queries
    for name in ONE_D:
        for causal in (True, False):
            enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal).double()
            for p in enc.parameters():
                if p.dim() > 1:
                    torch.nn.init.normal_(p, std=0.5)
            yield f"{name}-{'causal' if causal else 'bidirectional'}", enc, k_pos[5:], k_pos, causal
    for breakpoints in ("fixed", "learned"):
        rescaled = dict(num_buckets=8, max_distance="auto", train_length=16)
        enc = build_encoding(
            "t5", heads=4, head_dim=8, causal=True, breakpoints=breakpoints, **rescaled
        )
        torch.nn.init.normal_(enc.table.weight, std=0.5)
        yield f"t5-rescaled-{breakpoints}", enc.double(), k_pos, k_pos, True
    pos = grid_positions(4, 5, prefix=1)
    for name, params in TWO_D:
        yield f"{name}-{params}", grid_encoding(name, params).double(), pos, pos, False


@pytest.mark.parametrize("case", list(gradient_cases()), ids=lambda case: case[0])
def test_score_mods_carry_the_gradients_of_the_explicit_bias(case):
    _, enc, q_pos, k_pos, causal = case

    def through_mod(q, k):  # every score_mod here adds its bias to the score
        zeros = q.new_zeros(*q.shape[:2], len(q_pos), len(k_pos))
        return every_pair(flex_path.score_mod_for(enc, q, q_pos, k_pos), zeros)

    def explicit(q, k):
        return enc.bias(q, k, q_pos, k_pos)

    got = gradients_through(enc, q_pos, k_pos, causal, through_mod)
    want = gradients_through(enc, q_pos, k_pos, causal, explicit)
    assert len(want) > 1 or case[0].startswith(("alibi", "sandwich"))  # tables reached
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


def test_content_dependent_encodings_are_left_to_the_other_paths():
    att = Attention(32, 4, build_encoding("shaw", dim=32, heads=4, head_dim=8))
    assert not att.flex_serves(None, torch.arange(8))
    assert Attention(32, 4, build_encoding("alibi", heads=4, head_dim=8)).flex_serves(
        None, torch.arange(8)
    )


@cuda
@pytest.mark.parametrize("name", ONE_D)
def test_cuda_values_and_gradients_match_the_cpu_path(name):
    torch.manual_seed(0)
    enc = build_encoding(name, dim=64, heads=4, head_dim=16, causal=True)
    cpu = Attention(64, 4, enc, causal=True)
    gpu = Attention(64, 4, build_encoding(name, dim=64, heads=4, head_dim=16, causal=True))
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    x = torch.randn(2, 300, 64)
    outs, grads = [], []
    for att, xs in ((cpu, x.clone().requires_grad_()), (gpu, x.cuda().requires_grad_())):
        out = att(xs)
        out.square().sum().backward()
        outs.append(out.detach().cpu())
        grads.append([p.grad.cpu() for p in att.parameters()] + [xs.grad.cpu()])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-3, atol=1e-4)
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)


def attention_cases():
    """One Attention per kind of score_mod and mask_mod the GPU path builds: (attention,
    positions)."""
    seq = torch.arange(3, 43)  # not from 0
    for name in ONE_D:
        for causal in (True, False):
            enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal)
            yield (
                f"{name}-{'causal' if causal else 'bidirectional'}",
                Attention(32, 4, enc, causal=causal),
                seq,
            )
    enc = build_encoding("alibi", dim=32, heads=4, head_dim=8, causal=True)
    band = Attention(32, 4, enc, causal=True, window=5, dilation=2, stride=3, global_tokens=2)
    yield "alibi-band", band, seq
    pos = grid_positions(6, 7, prefix=1)
    for name, params in TWO_D:
        yield f"{name}-{params}", Attention(32, 4, grid_encoding(name, params, 6, 7)), pos
    window = Attention(
        32, 4, grid_encoding("swin", {}, 6, 7), window=3, dilation=2, stride=2, global_tokens=3
    )
    yield "swin-window", window, pos


@pytest.mark.parametrize("case", list(attention_cases()), ids=lambda case: case[0])
def test_every_mod_of_the_gpu_path_traces_into_one_graph(case, monkeypatch):
    """CUDA compiles what Attention.flex builds into one graph: run the same calls through
    torch.compile here (``fullgraph``, the eager backend, so no CUDA is needed), where a
    score_mod or mask_mod that breaks the graph raises, and match the unfused call."""
    _, att, pos = case
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, len(pos), 8) for _ in range(3))
    assert att.flex_serves(None, pos)
    with torch.no_grad():
        want = att.flex(q, k, v, pos, pos, 0.3)
        monkeypatch.setattr(flex, "kernel", lambda q: flex.compiled("eager"))
        got = att.flex(q, k, v, pos, pos, 0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# one case of each kind of mod inductor lowers: the distance table under the causal mask and
# with no mask of its own (only the padded keys'), FIRE's own score_mod, a sequence's band, a
# grid's offset table with prefix tokens under the window
INDUCTOR = ["alibi-causal", "alibi-bidirectional", "fire-causal", "alibi-band", "swin-window"]
compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs a C++ compiler")


@compiler
@pytest.mark.parametrize(
    "case", [c for c in attention_cases() if c[0] in INDUCTOR], ids=lambda case: case[0]
)
def test_inductor_compiles_each_kind_of_mod_on_the_cpu(case, monkeypatch):
    """What CUDA runs, lowered by inductor (its CPU template; forward only, no gradients there)
    at lengths off the block (40 and 43 tokens, padded to 128): the same values as the unfused
    call. Unpadded, such lengths came out wrong on the CPU in torch 2.14."""
    _, att, pos = case
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, len(pos), 8) for _ in range(3))
    with torch.no_grad():
        want = att.flex(q, k, v, pos, pos, 0.3)
        monkeypatch.setattr(flex, "kernel", lambda q: flex.compiled("inductor"))
        got = att.flex(q, k, v, pos, pos, 0.3)
    assert len(pos) % flex.BLOCK != 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_padding_hides_the_padded_keys_and_never_reads_positions_out_of_range():
    """A call off the block is padded: with no mask of its own it gains one for the padded keys,
    and its score_mod sees only real indices (a read past the positions raises in eager)."""
    torch.manual_seed(0)
    n = 37
    pos = torch.arange(n)
    q, k, v = (randn(1, 2, n, 8) for _ in range(3))

    def mod(score, b, h, q_idx, kv_idx):
        return score + pos[kv_idx].to(score.dtype) * 0.01 - pos[q_idx].to(score.dtype) * 0.02

    with torch.no_grad():
        got = flex.attention(q, k, v, mod, None, 0.5)
    bias = pos.double()[None, :] * 0.01 - pos.double()[:, None] * 0.02
    torch.testing.assert_close(got, dense(q, k, v, bias, None, 0.5), rtol=0, atol=1e-10)
    assert got.shape == (1, 2, n, 8)


def test_block_masks_are_built_once_per_pattern_and_positions(monkeypatch):
    """Every layer of every step asks for the same block mask: it is built once per pattern and
    positions, and a new pattern or new positions get their own."""
    from torch.nn.attention import flex_attention as module

    builds = []
    build = module.create_block_mask
    monkeypatch.setattr(
        module, "create_block_mask", lambda *a, **o: builds.append(1) or build(*a, **o)
    )
    monkeypatch.setattr(flex, "_block_masks", type(flex._block_masks)())
    enc = build_encoding("alibi", dim=32, heads=4, head_dim=8, causal=True)
    layers = [
        Attention(32, 4, enc, causal=True),
        Attention(32, 4, enc, causal=True, window=3),
        Attention(32, 4, enc, causal=True, window=5),
    ]
    calls = [(0, torch.arange(40)), (0, torch.arange(40)), (0, torch.arange(3, 43)),
             (1, torch.arange(40)), (2, torch.arange(40)), (2, torch.arange(40))]  # fmt: skip
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 40, 8) for _ in range(3))
    with torch.no_grad():
        for layer, pos in calls:
            got = layers[layer].flex(q, k, v, pos, pos, 0.3)
            seen = layers[layer].band
            want = (q @ k.transpose(-2, -1) * 0.3 + enc.bias(q, k, pos, pos)).masked_fill(
                Visibility(True, seen, int(pos[0])).hidden(pos, pos), float("-inf")
            ).softmax(-1) @ v
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(builds) == 4  # causal at 0 and at 3, then each window once


def test_more_shapes_than_dynamos_default_limit_still_compile(monkeypatch):
    """One static kernel per length: a profile visits more lengths than dynamo's default of 8,
    and with fullgraph the 9th would be an error rather than a fallback."""
    monkeypatch.setattr(flex, "kernel", lambda q: flex.compiled("eager"))
    enc = build_encoding("alibi", dim=32, heads=4, head_dim=8, causal=True)
    att = Attention(32, 4, enc, causal=True)
    with torch.no_grad():
        for n in range(20, 32):
            q, k, v = (torch.randn(1, 4, n, 8) for _ in range(3))
            pos = torch.arange(n)
            want = flex.eager(q, k, v, score_mod=flex_path.score_mod_for(enc, q, pos, pos),
                              block_mask=flex.block_mask(flex.causal_mask(pos, pos), ("c",), n, n,
                                                         q.device))  # fmt: skip
            torch.testing.assert_close(att.flex(q, k, v, pos, pos, None), want, rtol=0, atol=0)
