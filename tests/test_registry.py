"""Every registry entry, automatically: builds, shapes, gradients, masks, invariances."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import ENCODINGS, build_encoding, check_params, user_params
from posenc_cli.encodings.base import grid_positions
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention
from tests.helpers import DIM, layer

NAMES = [n for n in ENCODINGS if ENCODINGS[n].dims == 1]
IMAGE = [n for n in ENCODINGS if ENCODINGS[n].dims == 2]
RELATIVE = [n for n in NAMES if ENCODINGS[n].family in ("relative", "bias", "rotary")]


def x_of(n: int = 10, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, n, DIM, generator=torch.Generator().manual_seed(seed)).double()


@pytest.mark.parametrize("name", NAMES)
def test_forward_shape_and_finite(name):
    out = layer(name)(x_of())
    assert out.shape == (2, 10, DIM)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_learned_parameter(name):
    module = layer(name)
    module(x_of()).square().sum().backward()
    for pname, p in module.encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} got no gradient"


@pytest.mark.parametrize("name", NAMES)
def test_queries_shorter_than_keys(name):
    module = layer(name, causal=True)
    out = module(x_of(4), memory=x_of(6, seed=2))
    assert out.shape == (2, 4, DIM) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_causal_right_padding_gives_each_sequence_alone(name):
    """Under a causal mask the module drops a right-padding key mask (the fast causal paths
    serve): every real query still gets what its sequence alone gives, values and gradients."""
    module = layer(name, causal=True)
    lengths = [9, 6, 2]
    x = x_of(9, batch=3).requires_grad_()
    key_mask = torch.arange(9)[None] < torch.tensor(lengths)[:, None]
    out = module(x, key_mask=key_mask)
    out[key_mask].square().sum().backward()
    batched = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad()
    for b, n in enumerate(lengths):
        alone = x[b : b + 1, :n].detach().requires_grad_()
        want = module(alone)
        want.square().sum().backward()
        torch.testing.assert_close(out[b, :n], want[0], atol=1e-10, rtol=0)
        torch.testing.assert_close(x.grad[b, :n], alone.grad[0], atol=1e-10, rtol=0)
        assert not x.grad[b, n:].any()  # nothing read flows back into the padding
    for pname, grad in batched.items():
        summed = dict(module.named_parameters())[pname].grad
        torch.testing.assert_close(grad, summed, atol=1e-10, rtol=0, msg=pname)


def test_only_causal_right_padding_drops_the_key_mask(monkeypatch):
    seen = []
    dense = Attention.dense

    def spy(self, q, k, v, q_pos, k_pos, scale, key_mask, *rest):
        seen.append(key_mask)
        return dense(self, q, k, v, q_pos, k_pos, scale, key_mask, *rest)

    monkeypatch.setattr(Attention, "dense", spy)
    right = torch.arange(9)[None] < torch.tensor([[5], [9]])
    layer("none", causal=True)(x_of(9), key_mask=right)
    layer("none", causal=True)(x_of(9), key_mask=right.flip(1))  # left padding: kept
    layer("none")(x_of(9), key_mask=right)  # no causal mask to hide the padding: kept
    assert seen[0] is None and seen[1] is not None and seen[2] is not None


@pytest.mark.parametrize("name", NAMES)
def test_causal_never_looks_ahead(name):
    module = layer(name, causal=True)
    x = x_of(12)
    changed = x.clone()
    changed[:, 7:] = torch.randn_like(changed[:, 7:])
    torch.testing.assert_close(module(x)[:, :7], module(changed)[:, :7], atol=1e-12, rtol=0)
    assert not torch.allclose(module(x)[:, 7:], module(changed)[:, 7:])


@pytest.mark.parametrize("name", NAMES)
def test_padded_keys_are_ignored(name):
    module = layer(name)
    x = x_of(9)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, 6:] = False
    changed = x.clone()
    changed[1, 6:] = torch.randn_like(changed[1, 6:])
    a = module(x, key_mask=key_mask)
    b = module(changed, key_mask=key_mask)
    torch.testing.assert_close(a[1, :6], b[1, :6], atol=1e-12, rtol=0)
    torch.testing.assert_close(a[0], b[0], atol=1e-12, rtol=0)


def test_none_is_permutation_equivariant():
    module = layer("none")
    x = x_of(11)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(module(x[:, perm]), module(x)[:, perm], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "none"])
def test_position_aware_encodings_break_permutation_equivariance(name):
    module = layer(name)
    x = x_of(11)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(module(x[:, perm]), module(x)[:, perm], atol=1e-6)


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_encodings_are_translation_invariant(name):
    """Shifting every position by the same amount changes nothing: only j - i is seen."""
    module = layer(name)
    x = x_of(10)
    torch.testing.assert_close(module(x, offset=0), module(x, offset=37), atol=1e-9, rtol=1e-9)


def test_absolute_sinusoid_is_not_translation_invariant():
    module = layer("sinusoidal")
    x = x_of(10)
    assert not torch.allclose(module(x, offset=0), module(x, offset=37), atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_fused_path_equals_dense_reference(name):
    """The attention module's output against softmax(q k^T * scale + bias) v + value, in float64,
    computed here from the hooks with plain tensor algebra."""
    module = layer(name, causal=True)
    enc, att = module.encoding, module.attention
    x = enc.embed(x_of(9), torch.arange(9))
    pos = torch.arange(9)
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    q, k = enc.rotate(q, k, pos, pos)
    logits = q @ k.transpose(-2, -1) * enc.logit_scale()
    bias = enc.bias(q, k, pos, pos)
    if bias is not None:
        logits = logits + bias
    logits = logits.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    weights = logits.softmax(-1)
    out = weights @ v
    extra = enc.value(weights, pos, pos)
    if extra is not None:
        out = out + extra
    expected = att.proj(out.transpose(1, 2).reshape(2, 9, DIM))
    got = att(x)
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9)


def test_unknown_encoding_names_a_close_match():
    with pytest.raises(UsageError, match=r"did you mean 'alibi'.*valid: none"):
        build_encoding("albi")


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(UsageError, match=r"no parameter 'num_bucket'.*'num_buckets'"):
        build_encoding("t5", num_bucket=16)


def test_parameter_values_are_converted_by_declared_type():
    assert check_params("learned", {"length": "128"}) == {"length": 128}
    with pytest.raises(UsageError, match="learned.length: expected int"):
        check_params("learned", {"length": "long"})


@pytest.mark.parametrize("name", IMAGE)
def test_image_encodings_on_a_rectangular_grid_with_a_class_token(name):
    torch.manual_seed(0)
    enc = build_encoding(name, dim=DIM, heads=4, head_dim=DIM // 4)
    att = Attention(DIM, 4, enc).double()
    enc.double()
    positions = grid_positions(3, 5, prefix=1)
    x = enc.embed(x_of(16), positions)
    out = att(x, positions=positions)
    assert out.shape == (2, 16, DIM) and torch.isfinite(out).all()
    out.square().sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} got no gradient"


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_model_arguments_are_not_user_parameters(name):
    assert not {"dim", "heads", "head_dim", "causal"} & set(user_params(name))


def test_backbone_facts_reach_only_the_encodings_that_name_them():
    from posenc_cli.encodings import encoding_class
    from posenc_cli.encodings.base import BackboneFacts

    facts = BackboneFacts(dim=64, heads=4, height=7, width=7, prefix_tokens=1, length=50)
    swin = facts.for_encoding(encoding_class("swin"), {"height": 9})
    assert swin["height"] == 9 and swin["width"] == 7 and swin["head_dim"] == 16  # user wins
    assert "length" not in swin  # swin's constructor names no 1D table
    learned = facts.for_encoding(encoding_class("learned"), {})
    assert learned["length"] == 50 and "height" not in learned
    assert "prefix_tokens" not in facts.for_encoding(encoding_class("rope"), {})
