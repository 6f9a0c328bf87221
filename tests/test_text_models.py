"""Text models: every 1D encoding in an LM and a classifier, causality, sharing, XL memory,
padding, offsets. Tiny float64 models (dim 32, depth 2, heads 4)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.encodings import ENCODINGS
from posenc_cli.errors import UsageError
from posenc_cli.models.blocks import TransformerBlock, next_memory
from posenc_cli.models.text import TextModel, build_text_model, mean_pool

ONE_D = [n for n in ENCODINGS if ENCODINGS[n].dims == 1]
RELATIVE = [n for n in ONE_D if ENCODINGS[n].family != "absolute"]
# a classifier attends both ways: the causal-only encodings (xPos) have no form for it
BIDIRECTIONAL = [n for n in ONE_D if not ENCODINGS[n].causal_only]


def kinds_of(names: list[str]) -> list[tuple[str, str]]:
    """(encoding, kind) for every kind the encoding has a form for."""
    return [(n, k) for n in names for k in ("lm", "classify") if k == "lm" or n in BIDIRECTIONAL]


VOCAB, CLASSES, DIM, DEPTH = 11, 3, 32, 2
TIGHT = {"atol": 1e-9, "rtol": 1e-9}


def build(name: str, kind: str = "lm", mem_len: int = 0, depth: int = DEPTH, **params) -> TextModel:
    torch.manual_seed(0)
    model = SimpleNamespace(
        dim=DIM, depth=depth, heads=4, mlp_ratio=2.0, dropout=0.0, mem_len=mem_len
    )
    encoding = SimpleNamespace(name=name, params=params)
    task = SimpleNamespace(
        kind=kind, vocab_size=VOCAB, num_classes=CLASSES if kind == "classify" else 0
    )
    return build_text_model(model, encoding, task).double().eval()


def tokens(B: int, T: int, seed: int = 0) -> Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def block_inputs(model: TextModel) -> tuple[list[Tensor], list]:
    """Record the input of every block on each forward call."""
    seen: list[Tensor] = []
    handles = [
        block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
        for block in model.blocks
    ]
    return seen, handles


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_lm_and_classifier_shapes(name):
    lm, clf = build(name, "lm"), build(name, "classify")
    assert lm.kind == "lm" and clf.kind == "classify"
    x = tokens(2, 7)
    out = lm(x)
    assert out.logits.shape == (2, 7, VOCAB) and out.memory is None
    out = clf(x, key_mask=torch.ones(2, 7, dtype=torch.bool))
    assert out.logits.shape == (2, CLASSES) and out.memory is None


@pytest.mark.parametrize("name,kind", kinds_of(ONE_D))
def test_loss_reaches_every_parameter(name, kind):
    model = build(name, kind).train()
    x = tokens(3, 7)
    if kind == "lm":
        logits = model(x).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens(3, 7, seed=1).reshape(-1))
    else:
        mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 6 + [False]])
        loss = F.cross_entropy(model(x, key_mask=mask).logits, torch.tensor([0, 1, 2]))
    loss.backward()
    for pname, p in model.named_parameters():
        # table encodings leave the rows of unused distances at zero: ask for some gradient
        assert p.grad is not None and p.grad.abs().max() > 0, pname


@pytest.mark.parametrize("name", ONE_D)
def test_lm_is_causal(name):
    model = build(name, "lm")
    x = tokens(2, 9)
    future = x.clone()
    future[:, 5:] = (future[:, 5:] + 1) % VOCAB
    a, b = model(x).logits, model(future).logits
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-12, rtol=0)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-6  # the change is seen where it is allowed
    past = x.clone()
    past[:, 0] = (past[:, 0] + 1) % VOCAB
    assert (model(past).logits[:, -1] - a[:, -1]).abs().max() > 1e-6  # attention looks back


@pytest.mark.parametrize("name", ONE_D)
def test_lm_right_padding_leaves_real_positions_alone(name):
    model = build(name, "lm")
    x = tokens(1, 9)
    mask = torch.tensor([[True] * 6 + [False] * 3])
    padded = model(x, key_mask=mask).logits[:, :6]
    torch.testing.assert_close(padded, model(x[:, :6]).logits, **TIGHT)


@pytest.mark.parametrize("name", ONE_D)
def test_lm_batch_of_mixed_lengths_runs_in_groups_exactly(name, monkeypatch):
    """A right-padded batch runs as two groups cut to their widths: each row's real logits and
    the parameters' gradients are those of the batch run whole (``run``)."""
    model = build(name, "lm")
    lengths = torch.tensor([12, 3, 5, 12, 2, 8])
    x = tokens(6, 12)
    mask = torch.arange(12)[None] < lengths[:, None]
    widths = []
    run = model.run
    monkeypatch.setattr(model, "run", lambda t, *rest: widths.append(t.shape[1]) or run(t, *rest))
    grouped = model(x, key_mask=mask).logits
    assert widths == [5, 12]  # the three shortest rows cut to 5 tokens
    grouped[mask].square().sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    whole = run(x, mask, None, 0, None).logits
    whole[mask].square().sum().backward()
    torch.testing.assert_close(grouped[mask], whole[mask], **TIGHT)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for n in got:
        torch.testing.assert_close(want[n], got[n], **TIGHT, msg=n)


def test_lm_batch_runs_whole_where_groups_save_little():
    model = build("alibi", "lm")
    widths = []
    run = model.run
    model.run = lambda t, *rest: widths.append(t.shape[1]) or run(t, *rest)
    x = tokens(4, 12)
    near = torch.arange(12)[None] < torch.tensor([[12], [10], [11], [12]])
    model(x, key_mask=near)  # the short half would keep 11 of 12 tokens
    model(x, key_mask=near.flip(1))  # left padding: a real token sees the padding
    model(x, key_mask=torch.ones(4, 12, dtype=torch.bool))
    assert widths == [12, 12, 12]


def test_shared_encoding_is_built_once():
    model = build("t5", "lm", depth=3)
    names = [n for n, _ in model.named_parameters() if "encoding" in n]
    assert names == ["encoding.table.weight"]
    assert all(block.attn.encoding is model.encoding for block in model.blocks)


def test_per_layer_encoding_is_built_per_block():
    model = build("shaw", "lm", depth=3)
    assert model.encoding is None
    names = [n for n, _ in model.named_parameters() if "encoding" in n]
    expected = [f"blocks.{i}.attn.encoding.{t}_table" for i in range(3) for t in ("key", "value")]
    assert names == expected
    assert len({id(block.attn.encoding) for block in model.blocks}) == 3


@pytest.mark.parametrize("name", ONE_D)
def test_sharing_follows_the_registry_flag(name):
    model = build(name, "lm", depth=3)
    encodings = [block.attn.encoding for block in model.blocks]
    if ENCODINGS[name].per_layer:
        assert len({id(e) for e in encodings}) == 3 and model.encoding is None
    else:
        assert all(e is model.encoding for e in encodings)
        own = {id(p) for p in model.encoding.parameters()}
        # each shared parameter is counted once, under the model-level name
        shared = [n for n, p in model.named_parameters() if id(p) in own]
        assert len(shared) == len(own) and all(n.startswith("encoding.") for n in shared)


@pytest.mark.parametrize("mem_len,offset", [(6, 0), (9, 4)])
@pytest.mark.parametrize("name", ONE_D)
def test_memory_continues_the_sequence(name, mem_len, offset):
    """Two segments of T with mem_len >= T equal one causal run over both. This holds for the
    absolute encodings too: positions continue after the memory."""
    T = 6
    model = build(name, "lm", mem_len=mem_len)
    x = tokens(2, 2 * T)
    full = model(x, offset=offset).logits
    first = model(x[:, :T], offset=offset)
    second = model(x[:, T:], memory=first.memory, offset=offset)
    torch.testing.assert_close(first.logits, full[:, :T], **TIGHT)
    torch.testing.assert_close(second.logits, full[:, T:], **TIGHT)
    alone = model(x[:, T:], offset=offset + T).logits
    assert (alone - full[:, T:]).abs().max() > 1e-6  # the memory is what made them equal


def test_memory_is_detached():
    model = build("xl", "lm", mem_len=4).train()
    x = tokens(2, 10)
    first = model(x[:, :5])
    assert all(p.requires_grad for p in model.parameters())
    assert len(first.memory) == DEPTH
    for m in first.memory:
        assert not m.requires_grad and m.grad_fn is None
    second = model(x[:, 5:], memory=first.memory)
    second.logits.sum().backward()  # no graph into the first segment is kept or needed
    assert all(m.grad is None for m in first.memory)


@pytest.mark.parametrize("mem_len,T2,kept", [(3, 2, 3), (8, 5, 8), (3, 5, 3), (20, 5, 10)])
def test_memory_keeps_the_last_mem_len_block_inputs(mem_len, T2, kept):
    """memory[l] = the last mem_len positions of [old memory; input of block l]."""
    T1 = 5
    model = build("rope", "lm", mem_len=mem_len)
    seen, handles = block_inputs(model)
    x = tokens(2, T1 + T2)
    first = model(x[:, :T1])
    inputs1 = seen[:DEPTH]
    second = model(x[:, T1:], memory=first.memory)
    inputs2 = seen[DEPTH:]
    for h in handles:
        h.remove()
    for layer in range(DEPTH):
        torch.testing.assert_close(first.memory[layer], inputs1[layer][:, -mem_len:], **TIGHT)
        both = torch.cat([inputs1[layer][:, -mem_len:], inputs2[layer]], dim=1)
        assert second.memory[layer].shape == (2, kept, DIM)
        torch.testing.assert_close(second.memory[layer], both[:, -mem_len:], **TIGHT)


def test_next_memory_plain():
    old = torch.arange(6.0).view(1, 3, 2)  # positions 0..2
    x = torch.arange(6.0, 10.0).view(1, 2, 2)  # positions 3..4
    got = next_memory(old, x, 4)
    assert got.tolist() == [[[2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]]
    assert next_memory(None, x, 5).tolist() == x.tolist()


def test_no_memory_without_mem_len_or_for_a_classifier():
    x = tokens(1, 4)
    assert build("rope", "lm", mem_len=0)(x).memory is None
    assert build("rope", "classify")(x).memory is None
    memory = build("rope", "lm", mem_len=4)(x).memory
    for model in (build("rope", "lm", mem_len=0), build("rope", "classify")):
        with pytest.raises(ValueError, match="mem_len"):
            model(x, memory=memory)
    with pytest.raises(UsageError, match="mem_len"):
        build("rope", "classify", mem_len=4)


def test_key_mask_with_memory_covers_memory_and_tokens():
    model = build("alibi", "lm", mem_len=4)
    x = tokens(2, 8)
    first = model(x[:, :4])
    plain = model(x[:, 4:], memory=first.memory).logits
    masked = model(x[:, 4:], memory=first.memory, key_mask=torch.ones(2, 8, dtype=torch.bool))
    torch.testing.assert_close(masked.logits, plain, **TIGHT)
    hidden = torch.ones(2, 8, dtype=torch.bool)
    hidden[:, 0] = False  # hiding one memory position must matter
    assert (model(x[:, 4:], memory=first.memory, key_mask=hidden).logits - plain).abs().max() > 0
    with pytest.raises(ValueError, match="cover memory and tokens"):
        model(x[:, 4:], memory=first.memory, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="layers"):
        model(x[:, 4:], memory=first.memory[:1])


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_classifier_ignores_padding(name):
    model = build(name, "classify")
    x = tokens(2, 8)
    mask = torch.tensor([[True] * 5 + [False] * 3, [True] * 8])
    base = model(x, key_mask=mask).logits
    changed = x.clone()
    changed[0, 5:] = (changed[0, 5:] + 3) % VOCAB
    torch.testing.assert_close(model(changed, key_mask=mask).logits, base, atol=1e-12, rtol=0)
    # the padded row is the short sequence on its own
    torch.testing.assert_close(base[:1], model(x[:1, :5]).logits, **TIGHT)
    real = x.clone()
    real[0, 4] = (real[0, 4] + 3) % VOCAB
    assert (model(real, key_mask=mask).logits[0] - base[0]).abs().max() > 1e-6


def test_classifier_is_bidirectional():
    model = build("rope", "classify")
    seen, handles = block_inputs(model)
    x = tokens(1, 6)
    model(x)
    changed = x.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    model(changed)
    for h in handles:
        h.remove()
    # block 1's input at position 0 depends on the last token: block 0 looked ahead
    assert (seen[1][0, 0] - seen[3][0, 0]).abs().max() > 1e-6


def test_mean_pool_against_a_loop():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    got = mean_pool(x, mask)
    for b in range(3):
        rows = [x[b, t] for t in range(5) if mask[b, t]]
        torch.testing.assert_close(got[b], sum(rows) / len(rows), **TIGHT)
    torch.testing.assert_close(mean_pool(x, None), x.mean(1), **TIGHT)


@pytest.mark.parametrize("name,kind", kinds_of(RELATIVE))
def test_relative_encodings_ignore_offset(name, kind):
    model = build(name, kind)
    x = tokens(2, 7)
    torch.testing.assert_close(model(x, offset=13).logits, model(x).logits, **TIGHT)


@pytest.mark.parametrize("kind", ["lm", "classify"])
def test_sinusoidal_sees_offset(kind):
    model = build("sinusoidal", kind)
    x = tokens(2, 7)
    assert (model(x, offset=13).logits - model(x).logits).abs().max() > 1e-6


def test_learned_raises_past_its_table():
    model = build("learned", "lm", mem_len=4, length=8)
    x = tokens(1, 6)
    assert model(x, offset=2).logits.shape == (1, 6, VOCAB)  # positions 2..7 fit
    assert (model(x, offset=2).logits - model(x).logits).abs().max() > 1e-6
    with pytest.raises(UsageError, match="length"):
        model(x, offset=3)
    memory = model(x).memory  # 4 positions: the next segment starts at position 4
    with pytest.raises(UsageError, match="length"):
        model(x, memory=memory)


def test_build_errors():
    with pytest.raises(UsageError, match="model.dim"):
        build_text_model(
            SimpleNamespace(dim=30, depth=1, heads=4, mlp_ratio=2.0, dropout=0.0, mem_len=0),
            SimpleNamespace(name="rope", params={}),
            SimpleNamespace(kind="lm", vocab_size=5, num_classes=0),
        )
    with pytest.raises(UsageError, match="a text model takes 1D or N-D encodings"):
        build("rope2d")
    with pytest.raises(UsageError, match="no parameter"):
        build("t5", num_bucket=8)
    assert build("t5", num_buckets=8).encoding.num_buckets == 8  # params reach the encoding


def test_block_is_pre_norm():
    """x + attn(LN(x)), then + mlp(LN(.)); memory is normalised by the same LayerNorm."""
    torch.manual_seed(0)
    block = TransformerBlock(DIM, 4, None, True, 2.0, 0.0).double().eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, DIM, generator=gen, dtype=torch.float64)
    mem = torch.randn(2, 3, DIM, generator=gen, dtype=torch.float64)

    def ln(t, norm):
        mu, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    def mlp(t):
        return block.mlp.fc2(F.gelu(block.mlp.fc1(t)))

    h = x + block.attn(ln(x, block.norm1), memory=ln(mem, block.norm1))
    want = h + mlp(ln(h, block.norm2))
    got, new_memory = block(x, memory=mem, mem_len=6)
    torch.testing.assert_close(got, want, **TIGHT)
    torch.testing.assert_close(new_memory, torch.cat([mem, x], 1)[:, -6:], **TIGHT)
    assert block(x)[1] is None


def test_padded_tokens_skip_the_mlp():
    """Under a key mask the MLP runs on the real tokens only; a padded token keeps x + attn."""
    torch.manual_seed(0)
    block = TransformerBlock(DIM, 4, None, True, 2.0, 0.0).double().eval()
    x = torch.randn(2, 6, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    got, _ = block(x, key_mask=mask)
    full, _ = block(x)
    torch.testing.assert_close(got[mask], full[mask], **TIGHT)
    attended = x + block.attn(block.norm1(x), key_mask=mask)
    torch.testing.assert_close(got[~mask], attended[~mask], **TIGHT)


@pytest.mark.parametrize("name", ["none", "t5", "rope", "cope"])
def test_padding_changes_no_gradient(name):
    """A right-padded LM batch trains as if the padding ran through the whole block: the loss on
    real tokens and every parameter's gradient are those of the unmasked forward."""
    x = tokens(3, 9)
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [5], [2]])

    def grads(key_mask):
        model = build(name, "lm")
        logits = model(x, key_mask=key_mask).logits[mask]
        logits.logsumexp(-1).sum().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    masked, plain = grads(mask), grads(None)
    assert masked.keys() == plain.keys()
    for n in plain:
        torch.testing.assert_close(masked[n], plain[n], **TIGHT, msg=n)


def test_a_causal_only_encoding_is_refused_by_a_classifier():
    with pytest.raises(UsageError, match="xpos: defined for causal models only"):
        build("xpos", "classify")
    assert build("xpos", "lm").kind == "lm"  # and an LM takes it
