"""Linear attention through the one attention module, against its dense equations (float64):
the position kept as rotation (rope), as exp of a bias of j - i (Toeplitz weights), or in the
input (none, absolute), causal and not; and refused, with the fix, where it cannot be kept."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.config import load_recipe
from posenc_cli.encodings import build_encoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels import linear_attention as la
from posenc_cli.models.attention import Attention

KEPT = ["none", "sinusoidal", "rope", "alibi", "t5", "kerple", "sandwich"]


def dense_linear(att: Attention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """sum_n w(m, n) phi(q_m) . phi(k_n) v_n / sum_n w(m, n) phi(q_m) . phi(k_n), the rotary
    form turning only the numerator's features, written pair by pair."""
    enc = att.encoding
    n = x.shape[1]
    pos = torch.arange(n)
    x = enc.embed(x, pos)
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    fq, fk = la.features(q), la.features(k)
    plain = fq @ fk.transpose(-2, -1)  # (B, H, N, N)
    if enc.family == "rotary":
        inv = enc.inv_freq.double()
        rq, rk = la.rotate_features(fq, pos, inv), la.rotate_features(fk, pos, inv)
        numerator, denominator = rq @ rk.transpose(-2, -1), plain
    else:
        bias = enc.bias(q, k, pos, pos) if enc.toeplitz else torch.zeros(1, 1, n, n)
        numerator = denominator = plain * bias.exp()
    if causal:
        keep = pos[None, :] <= pos[:, None]
        numerator, denominator = numerator * keep, denominator * keep
    out = (numerator @ v) / (denominator.sum(-1, keepdim=True) + la.EPS)
    return att.merge_heads(out)


@pytest.mark.parametrize("name", KEPT)
@pytest.mark.parametrize("causal", [True, False])
def test_linear_form_equals_its_dense_equations(name, causal):
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal, **(
        {"length": 40} if name == "learned" else {}
    ))  # fmt: skip
    att = Attention(32, 4, enc, causal=causal, form="linear").double()
    x = torch.randn(2, 30, 32, dtype=torch.float64)
    got = att(enc.embed(x, torch.arange(30)))
    torch.testing.assert_close(got, dense_linear(att, x, causal), rtol=0, atol=1e-12)


def test_an_encoding_whose_term_needs_the_logits_is_refused():
    att = Attention(32, 4, build_encoding("xl", dim=32, heads=4, head_dim=8), form="linear")
    with pytest.raises(UsageError, match="TransformerXLRelative has another term"):
        att(torch.randn(1, 8, 32))
    with pytest.raises(UsageError, match="attention must be 'softmax' or 'linear'"):
        Attention(32, 4, form="performer")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["model.attention=linear", "encoding.name=shaw"], "cannot keep 'shaw'"),
        # rotations RoFormer's form would drop or misread: xPos's decay, a partial RoPE, YaRN
        (["model.attention=linear", "encoding.name=xpos"], "cannot keep 'xpos'"),
        (["model.attention=linear", "encoding.name=rope", "encoding.fraction=0.5"], "cannot keep"),
        (
            [
                "model.attention=linear",
                "encoding.name=rope",
                "encoding.scaling=yarn",
                "encoding.factor=4",
                "encoding.original_length=64",
            ],
            "cannot keep",
        ),  # fmt: skip
        (["model.attention=linear", "encoding.name=rope", "data.task=copy"], "pads its sequences"),
    ],
)
def test_recipes_refuse_linear_attention_they_cannot_run(overrides, words):
    with pytest.raises(UsageError, match=words):
        load_recipe("text/lm-extrapolation", overrides)


def test_a_bias_over_positions_that_are_not_consecutive_is_refused():
    att = Attention(32, 4, build_encoding("alibi", heads=4, head_dim=8), form="linear")
    with pytest.raises(UsageError, match="needs consecutive positions"):
        att(torch.randn(1, 4, 32), positions=torch.tensor([0, 3, 9, 10]))
