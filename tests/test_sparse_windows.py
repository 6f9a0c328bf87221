"""Strided windows and global tokens (issue 18, sparse patterns) against full attention under
the same mask, the mask built by a literal loop over every (query, key) pair; float64, 1e-9."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import ENCODINGS, encoding_class
from posenc_cli.encodings.base import BackboneFacts, grid_positions
from posenc_cli.errors import UsageError
from posenc_cli.kernels import flex
from posenc_cli.models import flex_path
from posenc_cli.models.attention import Attention
from posenc_cli.models.window import slot_keys, slot_offsets, window_attention
from posenc_cli.profiling.memory import peak_bytes
from posenc_cli.profiling.sweep import fit_exponent, make_step
from posenc_cli.profiling.workloads import LayerWorkload
from tests.helpers import run
from tests.test_window import masked_full_attention, pair

CPU = torch.device("cpu")

IMAGE = ["none"] + [n for n in ENCODINGS if ENCODINGS[n].dims == 2]
# (name, params): every kind of per-slot term, with and without a value term
ENCODERS = [
    ("none", {}),
    ("swin", {}),
    ("irpe", {"mode": "bias", "on": "qk"}),
    ("irpe", {"mode": "contextual", "on": "qkv"}),
    ("irpe", {"mode": "contextual", "on": "kv", "method": "cross"}),
]
# (window, dilation, stride, global patches)
PATTERNS = [(3, 1, 2, 0), (3, 1, 3, 0), (3, 2, 3, 0), (3, 1, None, 4), (3, 1, 2, 3), (5, 1, 2, 6)]


def literal_mask(height, width, prefix, window, dilation=1, stride=None, global_tokens=0):
    """Who may attend whom, pair by pair: the global tokens (the prefix, then the first
    ``global_tokens`` patches) with everyone; two patches when their offset is a local slot
    (within ``window // 2`` slots ``dilation`` apart on both axes) or a lattice slot (the same
    with ``stride``)."""
    r = window // 2
    cells = [None] * prefix + [(i, j) for i in range(height) for j in range(width)]
    n = len(cells)

    def on_square(dr, dc, spacing):
        return all(abs(d) <= r * spacing and d % spacing == 0 for d in (dr, dc))

    mask = torch.zeros(n, n, dtype=torch.bool)
    for a in range(n):
        for b in range(n):
            if a < prefix + global_tokens or b < prefix + global_tokens:
                mask[a, b] = True
                continue
            dr, dc = cells[a][0] - cells[b][0], cells[a][1] - cells[b][1]
            lattice = stride is not None and on_square(dr, dc, stride)
            mask[a, b] = on_square(dr, dc, dilation) or lattice
    return mask


def grid_encoding(name, params, height, width, prefix):
    facts = BackboneFacts(dim=32, heads=4, height=height, width=width, prefix_tokens=prefix)
    cls = encoding_class(name)
    enc = cls(**facts.for_encoding(cls, params)).double()
    for p in enc.parameters():  # zero-initialised tables would hide a wrong slot
        torch.nn.init.normal_(p, std=0.5)
    return enc


def dense(q, k, v, enc, pos, mask, scale):
    """Full attention with the encoding's dense ``bias`` and ``value`` under ``mask``."""
    logits = q @ k.transpose(-2, -1) * scale
    bias = enc.bias(q, k, pos, pos)
    logits = logits if bias is None else logits + bias
    attn = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    extra = enc.value(attn, pos, pos)
    return attn @ v if extra is None else attn @ v + extra


@pytest.mark.parametrize(("name", "params"), ENCODERS)
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize(("window", "dilation", "stride", "global_tokens"), PATTERNS)
def test_sparse_path_equals_full_attention_under_the_same_mask(
    name, params, prefix, window, dilation, stride, global_tokens
):
    torch.manual_seed(0)
    height, width = 7, 9  # not square: rows and columns cannot be swapped unnoticed
    # swin's table must reach the lattice's farthest slot
    enc = grid_encoding(name, params, 2 * height, 2 * width, prefix)
    pos = grid_positions(height, width, prefix)
    q, k, v = (torch.randn(2, 4, len(pos), 8, dtype=torch.float64) for _ in range(3))
    mask = literal_mask(height, width, prefix, window, dilation, stride, global_tokens)
    got = window_attention(q, k, v, enc, pos, window, 0.3, dilation, stride, global_tokens)
    want = dense(q, k, v, enc, pos, mask, 0.3)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", IMAGE)
def test_every_image_encoding_through_the_attention_module(name):
    """The module's whole path (embedding, q/k inputs, rotation) on a strided window with
    global patches and a class token, against the full module's arithmetic under the mask."""
    params = {"swin": {"height": 9, "width": 9}, "learned2d": {"prefix_tokens": 1}}
    windowed, full = pair(
        name, 3, options={"stride": 2, "global_tokens": 3}, **params.get(name, {})
    )
    positions = grid_positions(5, 6, prefix=1)
    x = torch.randn(2, len(positions), 16, dtype=torch.float64)
    got = windowed(windowed.encoding.embed(x, positions), positions=positions)
    mask = literal_mask(5, 6, 1, 3, stride=2, global_tokens=3)
    torch.testing.assert_close(
        got, masked_full_attention(full, x, positions, mask), atol=1e-9, rtol=1e-9
    )


def test_all_patches_global_is_full_attention():
    windowed, full = pair("irpe", 3, options={"global_tokens": 12}, mode="contextual", on="qkv")
    positions = grid_positions(3, 4, prefix=1)
    x = torch.randn(1, 13, 16, dtype=torch.float64)
    torch.testing.assert_close(
        windowed(x, positions=positions), full(x, positions=positions), atol=1e-9, rtol=1e-9
    )


def test_strided_slots_by_hand():
    """Window 3, stride 2: the 3 x 3 square, then the lattice {-2, 0, 2}^2 without its centre,
    which the square already has (query minus key, row-major in the key's place)."""
    square = [[1, 1], [1, 0], [1, -1], [0, 1], [0, 0], [0, -1], [-1, 1], [-1, 0], [-1, -1]]
    lattice = [[2, 2], [2, 0], [2, -2], [0, 2], [0, -2], [-2, 2], [-2, 0], [-2, -2]]
    assert slot_offsets(3, stride=2).tolist() == square + lattice
    assert slot_offsets(3, stride=1).tolist() == square  # the lattice is the square: no slot twice
    # dilated square {-2, 0, 2}^2 and a stride-4 lattice: only the centre is shared
    assert len(slot_offsets(3, dilation=2, stride=4)) == 17
    # on a 3 x 4 grid, patch (0, 0) (index 0) has on-grid keys at its own place, to its right and
    # below (offset -1), and at (0, 2) and (2, 0), (2, 2) on the lattice; the rest fall off
    keys = slot_keys(3, 4, slot_offsets(3, stride=2))[0].tolist()
    assert keys == [12, 12, 12, 12, 0, 1, 12, 4, 5, 12, 12, 12, 12, 2, 12, 8, 10]


def test_the_mask_by_hand():
    """A 3 x 4 grid, one class token, window 1 (the patch itself), stride 2, one global patch:
    the allowed keys of three queries, written out."""
    mask = literal_mask(3, 4, 1, 1, stride=2, global_tokens=1)
    assert mask[1 + 6].nonzero().flatten().tolist() == [0, 1, 7]  # (1, 2): itself, the globals
    # window 1 has a 1 x 1 lattice: the same slot. With window 3 the lattice reaches 2 away
    mask = literal_mask(3, 4, 1, 3, stride=2, global_tokens=1)
    row = mask[1 + 0].nonzero().flatten().tolist()  # (0, 0) is global: it sees all
    assert row == list(range(13))
    # (2, 3): its 3 x 3 neighbourhood (1..2, 2..3), the lattice (0, 1), (0, 3), (2, 1), globals
    assert mask[1 + 11].nonzero().flatten().tolist() == [0, 1, 2, 4, 7, 8, 10, 11, 12]


@pytest.mark.parametrize(("window", "dilation", "stride", "global_tokens"), PATTERNS)
def test_the_block_mask_is_the_literal_mask(window, dilation, stride, global_tokens):
    pos = grid_positions(7, 9, prefix=1)
    mod = flex.window_mask(pos, window, dilation, stride, global_tokens)
    n = torch.arange(len(pos))
    got = mod(0, 0, n[:, None], n[None, :])
    assert torch.equal(got, literal_mask(7, 9, 1, window, dilation, stride, global_tokens))


@pytest.mark.parametrize("name, params", [("swin", {}), ("irpe", {"mode": "bias", "on": "k"})])
def test_flex_attention_with_the_block_mask_equals_the_sparse_path(name, params):
    """FlexAttention's eager CPU form (no gradients there): the score_mod and block mask of the
    GPU path against the CPU sparse path."""
    torch.manual_seed(0)
    enc = grid_encoding(name, params, 12, 12, 1)
    pos = grid_positions(6, 7, prefix=1)
    q, k, v = (torch.randn(2, 4, len(pos), 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        mod = flex_path.score_mod_for(enc, q, pos, pos)
        got = flex.attention(q, k, v, mod, flex.window_mask(pos, 3, 1, 2, 3), 0.3)
        want = window_attention(q, k, v, enc, pos, 3, 0.3, 1, 2, 3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"window": 3, "stride": 0}, "stride must be an integer >= 1 and needs a window"),
        ({"stride": 2}, "stride must be an integer >= 1 and needs a window"),
        ({"global_tokens": 2}, "global_tokens must be >= 0 and needs a window"),
        ({"window": 3, "global_tokens": -1}, "global_tokens must be >= 0"),
    ],
)
def test_bad_options_are_one_line_usage_errors(options, words):
    with pytest.raises(UsageError, match=words) as err:
        Attention(16, 2, **options)
    assert "\n" not in str(err.value)


def test_more_global_patches_than_the_grid_has():
    att = Attention(16, 2, window=3, global_tokens=13)
    with pytest.raises(UsageError, match="global_tokens 13 exceeds the 12 patches") as err:
        att(torch.randn(1, 13, 16), positions=grid_positions(3, 4, prefix=1))
    assert "give at most 12" in str(err.value) and "\n" not in str(err.value)


def test_vit_takes_the_sparse_options():
    from posenc_cli.models.vit import build_vit

    model = build_vit(
        "vit_nano", encoding="irpe", num_classes=3, img_size=16, depth=1, window=3,
        window_stride=2, window_global=2,
    )  # fmt: skip
    assert (model.blocks[0].attn.stride, model.blocks[0].attn.global_tokens) == (2, 2)
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 3)


def test_recipe_keys_reach_the_model():
    from posenc_cli.config import load_recipe
    from posenc_cli.tasks.image.train import build_image_model

    keys = ["model.window=3", "model.window_stride=3", "model.window_global=4"]
    recipe = load_recipe("image/base", [*keys, "encoding.name=irpe"])
    attn = build_image_model(recipe, 10, 3, recipe.data.image_size).blocks[0].attn
    assert (attn.window, attn.stride, attn.global_tokens) == (3, 3, 4)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "image/base", "model.window_stride=2"], "set it, e.g. 3"),
        (["train", "image/base", "model.window=3", "model.window_global=65"], "at most 64"),
        (["profile", "--layer", "attention", "--stride", "2"], "--stride 2"),
        (["profile", "--layer", "attention", "--window", "3", "--stride", "0"], "stride >= 1"),
        (["profile", "--layer", "attention", "--global-tokens", "4"], "--global-tokens 4"),
        (
            [
                "profile",
                "--layer",
                "attention",
                "--window",
                "3",
                "--global-tokens",
                "64",
                "--lengths",
                "256,16",
            ],
            "--global-tokens 64 exceeds the shortest --lengths, 16 tokens",
        ),
    ],
)
def test_bad_recipe_keys_and_flags_are_one_line(capsys, tmp_path, args, words):
    code, _, err = run(capsys, *args, *(["--out", str(tmp_path / "r")] if "train" in args else []))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert words in err


def test_memory_of_the_strided_window_with_global_patches_grows_linearly():
    sizes = [256, 1024, 4096]
    subject = LayerWorkload(dim=8, heads=1, window=7, stride=7, global_tokens=16).subject("irpe")
    peaks = [peak_bytes(make_step(subject, subject.inputs(n, 1, CPU), "train"), CPU) for n in sizes]
    # linear, not quadratic; what the step holds whatever the size (the slot table and
    # small per-band buffers) pulls the fit a little below 1 at these small sizes
    assert 0.8 < fit_exponent(sizes, peaks) < 1.1
