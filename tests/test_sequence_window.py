"""Sparse patterns on a 1D sequence (local, dilated and strided windows, global tokens) against
full attention under a mask written pair by pair from the pattern's definition, in float64:
values and gradients of the input and of the encodings' parameters, causal and not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc_cli.config.loader import load_recipe
from posenc_cli.encodings import encoding_class
from posenc_cli.encodings.base import BackboneFacts
from posenc_cli.errors import UsageError
from posenc_cli.kernels import blocked_bias, flex
from posenc_cli.kernels.visibility import Band, Visibility
from posenc_cli.models.attention import Attention
from posenc_cli.models.text import TextModel, sequence_window
from posenc_cli.profiling.memory import peak_bytes
from posenc_cli.profiling.sweep import fit_exponent, make_step
from posenc_cli.profiling.workloads import LayerWorkload

CPU = torch.device("cpu")

# blocked: no bias, rotation, content-free biases, pairwise content; dense: value terms, CoPE
NAMES = ["none", "rope", "alibi", "t5", "kerple", "sandwich", "fire", "xl", "deberta", "shaw"]
PATTERNS = [  # window, dilation, stride, global tokens
    (5, 1, None, 0),
    (5, 3, None, 0),
    (3, 1, 4, 0),
    (5, 1, None, 3),
    (3, 2, 5, 2),
]


def allowed(i: int, j: int, pattern, causal: bool) -> bool:
    """The pattern's definition for query i and key j, in plain Python."""
    window, dilation, stride, glob = pattern
    half, offset = window // 2, i - j
    local = abs(offset) <= half * dilation and offset % dilation == 0
    lattice = stride is not None and abs(offset) <= half * stride and offset % stride == 0
    seen = local or lattice or i < glob or j < glob
    return seen and (j <= i or not causal)


def reference(att: Attention, x, pattern, causal):
    """Softmax attention over every key, the pattern's pairs masked, through the encoding's
    dense hooks."""
    enc, N = att.encoding, x.shape[1]
    pos = torch.arange(N)
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, dim=-1))
    q, k = enc.rotate(q, k, pos, pos)
    logits = q @ k.transpose(-2, -1) * enc.logit_scale()
    bias = enc.bias(q, k, pos, pos)
    logits = logits if bias is None else logits + bias
    mask = torch.tensor([[allowed(i, j, pattern, causal) for j in range(N)] for i in range(N)])
    attn = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    extra = enc.value(attn, pos, pos)
    out = attn @ v if extra is None else attn @ v + extra
    return att.merge_heads(out)


def build(name: str, pattern, causal: bool) -> Attention:
    torch.manual_seed(0)
    window, dilation, stride, glob = pattern
    facts = BackboneFacts(dim=32, heads=4, causal=causal, train_length=64)
    cls = encoding_class(name)
    enc = cls(**facts.for_encoding(cls, {}))
    att = Attention(32, 4, enc, causal, window=window, dilation=dilation, stride=stride,
                    global_tokens=glob)  # fmt: skip
    for p in enc.parameters():  # away from zero-initialised tables, so the bias matters
        p.data.add_(0.3 * torch.randn_like(p))
    return att.double()


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_window_equals_masked_full_attention(name, causal, pattern, monkeypatch):
    monkeypatch.setattr(blocked_bias, "BLOCK", 8)  # several blocks over 37 tokens
    att = build(name, pattern, causal)
    x = torch.randn(2, 37, 32, dtype=torch.float64, requires_grad=True)
    out = att(x)
    ref = reference(att, x, pattern, causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    inputs = [x, *(p for p in att.encoding.parameters() if p.requires_grad)]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("name", "blocked"), [("none", True), ("alibi", True), ("xl", True), ("shaw", False)]
)
def test_the_band_runs_block_by_block_where_the_terms_allow(name, blocked, monkeypatch):
    """Every block sees only the keys within its reach (and the global ones): the keys the
    kernel is handed per block, not the whole sequence."""
    monkeypatch.setattr(blocked_bias, "BLOCK", 8)
    seen_keys = []
    original = blocked_bias.blocks

    def spy(q_pos, k_pos, seen, block):
        for rows, keys in original(q_pos, k_pos, seen, block):
            seen_keys.append(len(k_pos[keys]))
            yield rows, keys

    monkeypatch.setattr(blocked_bias, "blocks", spy)
    att = build(name, (5, 1, None, 2), causal=True)
    att(torch.randn(1, 64, 32, dtype=torch.float64))
    if blocked:  # 8 rows, 2 keys behind them, 2 global keys
        assert seen_keys and max(seen_keys[1:]) <= 8 + 2 + 2
    else:
        assert not seen_keys


def test_band_blocks_index_the_global_keys_beside_the_band():
    band = Band(3, 1, None, 2)
    pos = torch.arange(5, 45)
    got = [(r, k) for r, k in blocked_bias.blocks(pos, pos, Visibility(False, band, 5), 8)]
    assert got[0][1] == slice(0, 40)  # the global queries see every key
    rows, keys = got[2]
    assert rows == slice(16, 24) and keys.tolist() == [0, 1, *range(15, 25)]


def test_visibility_matches_the_definition():
    band = Band(5, 2, 3, 1)
    pos = torch.arange(3, 30)
    for causal in (True, False):
        hidden = Visibility(causal, band, 3).hidden(pos, pos)
        for i in range(27):
            for j in range(27):
                assert bool(hidden[i, j]) != allowed(i, j, (5, 2, 3, 1), causal)


def test_band_mask_mod_is_the_same_pattern():
    """The GPU path's mask_mod, evaluated pair by pair on the CPU."""
    band = Band(5, 2, 3, 2)
    pos = torch.arange(30)
    for causal in (True, False):
        mask = flex.band_mask(Visibility(causal, band, 0), pos, pos)
        got = torch.stack([mask(0, 0, torch.tensor(i), pos) for i in range(30)])
        assert torch.equal(got, ~Visibility(causal, band, 0).hidden(pos, pos))


def test_band_flex_forward_equals_the_blocked_path():
    """FlexAttention's eager CPU forward under the band's block mask (the GPU path's numbers)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    pos = torch.arange(128)
    seen = Visibility(True, Band(7, 2, None, 3), 0)
    with torch.no_grad():
        got = flex.attention(q, k, v, None, flex.band_mask(seen, pos, pos), 0.25)
    logits = (q @ k.transpose(-2, -1) * 0.25).masked_fill(seen.hidden(pos, pos), float("-inf"))
    torch.testing.assert_close(got, logits.softmax(-1) @ v, rtol=1e-5, atol=1e-5)


def test_a_key_mask_takes_the_dense_path_under_the_same_pattern():
    att = build("alibi", (5, 1, None, 0), causal=False)
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    keep = torch.ones(2, 20, dtype=torch.bool)
    torch.testing.assert_close(att(x, key_mask=keep), att(x), rtol=0, atol=1e-12)


def test_bad_window_input_is_one_line():
    with pytest.raises(UsageError, match="global_tokens 40 exceeds the 20 tokens"):
        build("none", (5, 1, None, 40), causal=True)(torch.randn(1, 20, 32, dtype=torch.float64))
    att = build("none", (5, 1, None, 0), causal=True)
    with pytest.raises(UsageError, match="window attention takes no memory"):
        att(torch.randn(1, 4, 32, dtype=torch.float64), memory=torch.randn(1, 3, 32).double())


def test_plain_dense_fallback_does_not_take_the_causal_kernel():
    """Under a band, the fused path must not fall back to SDPA's own causal mask."""
    att = build("none", (3, 1, None, 0), causal=True)
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    keep = torch.ones(1, 12, dtype=torch.bool)
    out = att(x, key_mask=keep)  # the dense path
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, dim=-1))
    pos = torch.arange(12)
    mask = ~Visibility(True, Band(3), 0).hidden(pos, pos)
    ref = att.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["model.window_dilation=2"], "window_dilation .*shapes a sparse window"),
        (["model.window_global=4"], "window_global .*shapes a sparse window"),
        (["model.window=4"], "model.window"),
        (["model.window=9", "model.attention=linear"], "linear attention has no window"),
        (["model.window=9", "model.mem_len=16"], "takes no memory"),
        (["model.window=9", "model.random_positions=512"], "consecutive positions"),
    ],
)
def test_recipes_refuse_windows_they_cannot_run(overrides, words):
    with pytest.raises(UsageError, match=words):
        load_recipe("text/lm-extrapolation", overrides)


def test_the_sparse_lm_recipe_builds_windowed_blocks():
    recipe = load_recipe("text/lm-sparse", ["model.window_dilation=2", "model.window_global=4"])
    model = TextModel(kind="lm", vocab_size=20, window=sequence_window(recipe.model))
    assert all(block.attn.band == Band(17, 2, None, 4) for block in model.blocks)
    assert sequence_window(load_recipe("text/lm-extrapolation").model) is None


def test_memory_of_a_band_on_a_sequence_grows_linearly():
    """The profiler's layer on a sequence: a training step's peak memory under a window, where
    full attention would grow quadratically."""
    sizes = [1024, 2048, 4096]
    workload = LayerWorkload(dim=8, heads=1, window=9, dilation=2, sequence=True)
    peaks = []
    for n in sizes:
        subject = workload.subject("alibi")
        peaks.append(peak_bytes(make_step(subject, subject.inputs(n, 1, CPU), "train"), CPU))
    assert 0.85 < fit_exponent(sizes, peaks) < 1.1


@pytest.mark.parametrize("name", ["xpos", "pope", "learned", "sinusoidal", "cope", "fox"])
def test_the_other_sequence_encodings_under_a_causal_band(name, monkeypatch):
    """Rotations with a decay or of their own kind, input embeddings (their W(x + p) is left to
    the module, so only the output is compared with a second path: the dense one under the same
    mask, reached through a key mask of all-real tokens), content-read position (CoPE) and the
    forget gate (FoX), whose own kernel must not run under a window."""
    monkeypatch.setattr(blocked_bias, "BLOCK", 8)
    att = build(name, (5, 2, None, 2), causal=True)
    x = torch.randn(2, 37, 32, dtype=torch.float64, requires_grad=True)
    x_in = att.encoding.embed(x, torch.arange(37))
    out = att(x_in)
    dense = att(x_in, key_mask=torch.ones(2, 37, dtype=torch.bool))
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-10)
    if att.encoding.qk_input(torch.arange(37)) is None:
        torch.testing.assert_close(out, reference(att, x_in, (5, 2, None, 2), True), rtol=0,
                                   atol=1e-10)  # fmt: skip
    got = torch.autograd.grad(out.sum(), x)
    want = torch.autograd.grad(dense.sum(), x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
