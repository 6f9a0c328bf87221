"""DETR-lite (posenc_cli/tasks/detection/detr.py, backbone.py): every 2D encoding trains, the
backbone's BatchNorm is frozen or trained as asked and loads local weights, and position reaches
the model only where asked."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision
from torch import nn
from torch.testing import assert_close
from torchvision.ops import FrozenBatchNorm2d

from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.encodings.base import HOOKS, PositionEncoding, grid_positions
from posenc_cli.encodings.sincos2d import SinCos2D, sincos2d_table
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention
from posenc_cli.tasks.detection.backbone import Backbone
from posenc_cli.tasks.detection.detr import SETTINGS, DETRLite, SineQK, build_detr

DIM, HEADS, CLASSES, QUERIES = 32, 4, 3, 5
TWO_D = sorted(k for k, v in ENCODINGS.items() if v.dims == 2)
# (sine, encoding): every 2D encoding alone, no position at all, and DETR's sine plus one more
CONFIGS = [(False, name) for name in ["none", *TWO_D]] + [(True, "none"), (True, "irpe")]


def tiny(seed: int = 0, **kwargs) -> DETRLite:
    torch.manual_seed(seed)
    options = {"dim": DIM, "heads": HEADS, "enc_layers": 2, "dec_layers": 2}
    options["num_queries"] = QUERIES
    return DETRLite(CLASSES, **{**options, **kwargs})


def images(batch: int = 2, height: int = 64, width: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def encoding_params(model: DETRLite) -> list[nn.Parameter]:
    return list({id(p): p for e in model.encodings for p in e.parameters()}.values())


@pytest.mark.parametrize(("sine", "encoding"), CONFIGS)
def test_every_encoding_builds_forwards_and_trains(sine, encoding):
    model = tiny(sine=sine, encoding=encoding)
    out = model(images())
    assert out["pred_logits"].shape == (2, QUERIES, CLASSES + 1)
    assert out["pred_boxes"].shape == (2, QUERIES, 4)
    assert len(out["aux_outputs"]) == 1
    assert ((out["pred_boxes"] > 0) & (out["pred_boxes"] < 1)).all()
    before = [p.detach().clone() for p in encoding_params(model)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    boxes = [out["pred_boxes"]] + [a["pred_boxes"] for a in out["aux_outputs"]]
    logits = [out["pred_logits"]] + [a["pred_logits"] for a in out["aux_outputs"]]
    loss = sum(b[..., 0].sum() for b in boxes) + sum(x.logsumexp(-1).sum() for x in logits)
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()
    # the encoder and the backbone both get gradient (the whole path is connected)
    assert model.backbone.body.conv1.weight.grad.abs().sum() > 0
    assert model.encoder[0].attn.q.weight.grad.abs().sum() > 0
    # every table gets a gradient; the largest one a non-zero one (swin's prefix bias is never
    # read on a grid without prefix tokens, so its gradient is zero)
    params = encoding_params(model)
    assert all(p.grad is not None for p in params)
    if params:
        assert max(params, key=lambda p: p.numel()).grad.abs().sum() > 0
    opt.step()
    moved = [not torch.equal(p, old) for p, old in zip(params, before, strict=True)]
    assert all(moved) or (encoding == "swin" and any(moved))
    expected_params = {"learned2d", "swin", "irpe"}  # rope2d axial, sincos2d: fixed
    assert (len(before) > 0) == (encoding in expected_params)


@pytest.mark.parametrize("dec_layers", [1, 3])
def test_aux_outputs_are_the_earlier_decoder_layers(dec_layers):
    model = tiny(dec_layers=dec_layers)
    out = model(images())
    assert len(out["aux_outputs"]) == dec_layers - 1
    for aux in out["aux_outputs"]:
        assert aux["pred_logits"].shape == (2, QUERIES, CLASSES + 1)
        assert aux["pred_boxes"].shape == (2, QUERIES, 4)
    # shared heads: the last decoder state through the class head gives pred_logits
    tokens, pos = model.features(images())
    memory = model.encode(tokens, pos)
    seen = []
    model.decoder_norm.register_forward_hook(lambda m, i, o: seen.append(o))
    model.decode(memory, pos)
    for state, aux in zip(seen[:-1], out["aux_outputs"], strict=True):
        assert_close(model.class_head(state), aux["pred_logits"])
        assert_close(model.box_head(state), aux["pred_boxes"])
    assert_close(model.class_head(seen[-1]), out["pred_logits"])


@pytest.mark.parametrize(
    ("sine", "encoding"), [(True, "irpe"), (False, "rope2d"), (False, "learned2d")]
)
def test_other_image_sizes_give_their_own_grid(sine, encoding):
    model = tiny(sine=sine, encoding=encoding)
    x = images(height=96, width=48)
    tokens, pos = model.features(x)
    assert tokens.shape == (2, 12 * 6, DIM)
    assert pos.tolist() == grid_positions(12, 6).tolist()
    out = model(x)
    assert out["pred_boxes"].shape == (2, QUERIES, 4)
    assert torch.isfinite(out["pred_logits"]).all()


def test_backbone_batchnorm_is_frozen_in_train_mode():
    backbone = Backbone("resnet18", stride=8, norm="frozen").train()
    norms = [m for m in backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert norms == []
    frozen = [m for m in backbone.modules() if isinstance(m, FrozenBatchNorm2d)]
    assert len(frozen) > 0
    for m in frozen:  # no trainable statistics or affine terms
        assert all(not isinstance(b, nn.Parameter) for b in m.buffers())
    state = {k: v.clone() for k, v in backbone.state_dict().items()}
    x = images(batch=4)
    full = backbone(x)
    # no batch statistics: an image's features do not depend on the rest of the batch
    assert_close(backbone(x[:1]), full[:1], atol=1e-5, rtol=1e-5)
    for k, v in backbone.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert full.shape == (4, 128, 8, 8)


@pytest.mark.parametrize(("stride", "channels", "side"), [(16, 256, 4), (32, 512, 2)])
def test_backbone_stride_picks_the_stage(stride, channels, side):
    backbone = Backbone("resnet18", stride=stride)
    assert backbone.channels == channels
    assert backbone(images(batch=1)).shape == (1, channels, side, side)


def test_backbone_loads_a_resnet_state_dict_from_a_file(tmp_path):
    torch.manual_seed(3)
    reference = torchvision.models.resnet18(weights=None)  # ordinary BatchNorm, with an fc
    for m in reference.modules():  # non-trivial statistics, so that loading them is visible
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.running_mean, -0.5, 0.5)
            nn.init.uniform_(m.running_var, 0.5, 2.0)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    path = tmp_path / "r18.pth"
    torch.save(reference.state_dict(), path)
    model = tiny(backbone_weights=str(path))
    body = model.backbone.body
    assert torch.equal(body.layer2[0].conv1.weight, reference.layer2[0].conv1.weight)
    assert torch.equal(body.bn1.running_var, reference.bn1.running_var)
    # in eval mode the reference's BatchNorm is the same affine map: the same features
    reference.eval()
    x = images(batch=1)
    stem = reference.maxpool(reference.relu(reference.bn1(reference.conv1(x))))
    expected = reference.layer2(reference.layer1(stem))
    assert_close(model.backbone.train()(x), expected, atol=1e-5, rtol=1e-5)


def test_missing_or_unreadable_weights_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="model.backbone_weights: no file"):
        tiny(backbone_weights=str(tmp_path / "missing.pth"))
    (tmp_path / "junk.pth").write_text("not a checkpoint")
    with pytest.raises(UsageError, match="model.backbone_weights: cannot read"):
        Backbone("resnet18", weights=str(tmp_path / "junk.pth"))


def test_weights_must_hold_exactly_the_kept_stages(tmp_path):
    full = Backbone("resnet18", stride=32).body.state_dict()  # every stage, no fc
    kept = {k: v for k, v in full.items() if k.startswith(("conv1", "bn1", "layer1", "layer2"))}
    # the stages that are cut off (and the classifier) need not be in the file
    torch.save(kept, tmp_path / "stem.pth")
    loaded = Backbone("resnet18", stride=8, weights=str(tmp_path / "stem.pth"))
    assert torch.equal(loaded.body.layer1[0].conv1.weight, full["layer1.0.conv1.weight"])
    partial = {k: v for k, v in kept.items() if k != "layer2.1.conv2.weight"}
    torch.save(partial, tmp_path / "partial.pth")
    with pytest.raises(UsageError, match="lacks 1 resnet18 key.*layer2.1.conv2.weight"):
        Backbone("resnet18", stride=8, weights=str(tmp_path / "partial.pth"))
    # a resnet34 file has a third block in layer1: an unexpected key of a kept stage
    deeper = {**kept, "layer1.2.conv1.weight": kept["layer1.0.conv1.weight"]}
    torch.save(deeper, tmp_path / "deeper.pth")
    with pytest.raises(UsageError, match="has 1 key.*resnet18 lacks, first 'layer1.2.conv1"):
        Backbone("resnet18", stride=8, weights=str(tmp_path / "deeper.pth"))
    wider = {**kept, "conv1.weight": torch.zeros(32, 3, 7, 7)}  # another width of stem
    torch.save(wider, tmp_path / "wider.pth")
    with pytest.raises(UsageError, match="model.backbone_weights: .* does not fit resnet18"):
        Backbone("resnet18", stride=8, weights=str(tmp_path / "wider.pth"))


def test_backbone_norm_auto_trains_batchnorm_from_scratch_and_freezes_loaded_weights(tmp_path):
    scratch = Backbone("resnet18", stride=8)  # auto, no weights: ordinary BatchNorm
    assert scratch.norm == "batch"
    norms = [m for m in scratch.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and not any(isinstance(m, FrozenBatchNorm2d) for m in scratch.modules())
    assert all(m.weight.requires_grad for m in norms)
    before = norms[0].running_mean.clone()
    scratch.train()(images(batch=4))
    assert not torch.equal(norms[0].running_mean, before)  # batch statistics are tracked
    # the same file loads into either kind, with or without BatchNorm's step counters
    state = {k: v for k, v in scratch.body.state_dict().items() if "num_batches" not in k}
    torch.save(state, tmp_path / "r18.pth")
    loaded = Backbone("resnet18", stride=8, weights=str(tmp_path / "r18.pth"))  # auto: frozen
    assert loaded.norm == "frozen"
    assert any(isinstance(m, FrozenBatchNorm2d) for m in loaded.modules())
    trained = Backbone("resnet18", stride=8, weights=str(tmp_path / "r18.pth"), norm="batch")
    x = images(batch=1)
    scratch.eval(), loaded.eval(), trained.eval()
    assert_close(loaded(x), scratch(x), atol=1e-5, rtol=1e-5)
    assert_close(trained(x), scratch(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(UsageError, match="model.backbone_norm: unknown 'group'"):
        Backbone("resnet18", norm="group")  # type: ignore[arg-type]


def test_unknown_backbone_and_stride_are_usage_errors():
    with pytest.raises(UsageError, match="resnet18, resnet34, resnet50"):
        Backbone("resnet101")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="8, 16, 32"):
        Backbone("resnet18", stride=4)  # type: ignore[arg-type]


def test_without_position_the_model_is_permutation_equivariant_over_tokens():
    model = tiny(sine=False, encoding="none")
    tokens = torch.randn(2, 64, DIM)
    pos = grid_positions(8, 8)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    memory = model.encode(tokens, pos)
    assert_close(model.encode(tokens[:, perm], pos), memory[:, perm], atol=1e-5, rtol=1e-5)
    # and the decoder reads the memory as a set
    out, shuffled = model.decode(memory, pos), model.decode(memory[:, perm], pos)
    assert_close(shuffled["pred_boxes"], out["pred_boxes"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("sine", "encoding"), [(True, "none"), (False, "rope2d"), (False, "irpe")])
def test_with_position_the_token_order_matters(sine, encoding):
    """The contrast to the test above: each encoding does reach the encoder."""
    model = tiny(sine=sine, encoding=encoding)
    for p in model.parameters():  # iRPE's tables start at zero
        if p.abs().max() == 0:
            nn.init.normal_(p, std=0.5)
    tokens = torch.randn(2, 64, DIM)
    pos = grid_positions(8, 8)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    shuffled = model.encode(tokens[:, perm], pos)
    assert not torch.allclose(shuffled, model.encode(tokens, pos)[:, perm], atol=1e-3)


def test_sine_plus_irpe_attention_matches_a_direct_computation():
    """SineQK(irpe): q = W_q(x + p), k = W_k(x + p), v = W_v x, logits + iRPE's term."""
    torch.manual_seed(0)
    hd = DIM // HEADS
    irpe = build_encoding("irpe", heads=HEADS, head_dim=hd, on="qkv").double()
    for p in irpe.parameters():
        nn.init.normal_(p, std=0.5)
    sine = SinCos2D(dim=DIM, where="qk")
    att = Attention(DIM, HEADS, SineQK(sine, irpe)).double()
    pos = grid_positions(3, 4)
    x = torch.randn(2, 12, DIM, dtype=torch.float64)
    p = sincos2d_table(3, 4, DIM)  # (12, D)

    def heads(t):
        return t.view(2, 12, HEADS, hd).transpose(1, 2)

    wk, wv = att.kv.weight.chunk(2)
    bk, bv = att.kv.bias.chunk(2)
    q = heads((x + p) @ att.q.weight.T + att.q.bias)
    k = heads((x + p) @ wk.T + bk)
    v = heads(x @ wv.T + bv)
    logits = q @ k.transpose(-2, -1) / math.sqrt(hd) + irpe.bias(q, k, pos, pos)
    weights = logits.softmax(-1)
    out = weights @ v + irpe.value(weights, pos, pos)
    expected = att.proj(out.transpose(1, 2).reshape(2, 12, DIM))
    assert_close(att(x, positions=pos), expected, atol=1e-10, rtol=1e-10)


def test_the_sine_wrapper_hands_every_hook_but_qk_input_to_the_inner_encoding():
    """Read from the interface itself: a hook added to PositionEncoding later is forwarded too
    (a hand-written forwarder once missed ``attend``, so sine + iRPE left iRPE's kernel)."""
    calls = []

    class Recorder(PositionEncoding):
        pass

    for name in HOOKS:
        setattr(Recorder, name, lambda self, *a, _name=name, **k: calls.append((_name, a)))
    wrapped = SineQK(SinCos2D(dim=DIM, where="qk"), Recorder(heads=HEADS, head_dim=DIM // HEADS))
    assert "attend" in HOOKS and "window_value" in HOOKS
    for name in HOOKS:
        if name != "qk_input":
            getattr(wrapped, name)(name, 1)
    assert calls == [(name, (name, 1)) for name in HOOKS if name != "qk_input"]


def test_sine_plus_contextual_irpe_runs_on_irpes_own_kernel(monkeypatch):
    irpe = build_encoding("irpe", heads=HEADS, head_dim=DIM // HEADS, on="qk")
    att = Attention(DIM, HEADS, SineQK(SinCos2D(dim=DIM, where="qk"), irpe))
    asked = []
    original = type(irpe).attend

    def attend(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        asked.append(out is not None)
        return out

    monkeypatch.setattr(type(irpe), "attend", attend)
    att(torch.randn(2, 12, DIM), positions=grid_positions(3, 4))
    assert asked == [True]


@pytest.mark.parametrize("sine", [True, False])
def test_decoder_cross_attention_keys_carry_the_sine_only_with_sine(sine):
    model = tiny(sine=sine)
    seen = {}

    def grab(module, args, kwargs):
        seen["query"], seen["key"], seen["value"] = args[:3]

    model.decoder[0].cross_attn.register_forward_pre_hook(grab, with_kwargs=True)
    memory = torch.randn(2, 12, DIM)
    model.decode(memory, grid_positions(3, 4))
    added = sincos2d_table(3, 4, DIM).float() if sine else torch.zeros(12, DIM)
    assert_close(seen["key"], memory + added)
    assert torch.equal(seen["value"], memory)


def test_encodings_per_layer_or_shared_and_their_parameter_count():
    irpe = tiny(encoding="irpe", enc_layers=3)
    assert len({id(e) for e in irpe.encodings}) == 3  # per_layer: one each
    buckets = 7 * 7 + 1  # product method, ratio 1.9: beta = 3.8 -> 2*3 + 1 per axis, + prefix
    assert irpe.encoding_parameters() == 3 * buckets * (DIM // HEADS)
    learned = tiny(encoding="learned2d", enc_layers=3, image_size=64)
    assert len({id(e.inner) for e in learned.encodings}) == 1  # shared, under 3 sine wrappers
    assert learned.encoding_parameters() == 8 * 8 * DIM  # 64 px / stride 8, no class token
    assert tiny(encoding="none").encoding_parameters() == 0


def test_build_detr_converts_and_checks_recipe_values():
    model = build_detr(
        CLASSES, dim="32", heads=4, sine="false", encoding="irpe",
        encoding_params={"mode": "bias"}, num_queries=QUERIES, backbone_stride=16,
    )  # fmt: skip
    assert model.sine is None and model.backbone.stride == 16
    assert model.encodings[0].mode == "bias"
    with pytest.raises(UsageError, match="did you mean 'num_queries'"):
        build_detr(CLASSES, num_querys=5)
    with pytest.raises(UsageError, match="sine"):
        build_detr(CLASSES, dim=DIM, sine=True, encoding="sincos2d")
    with pytest.raises(UsageError, match="for sequences"):
        build_detr(CLASSES, dim=DIM, encoding="t5")
    with pytest.raises(UsageError, match="multiple of model.heads"):
        build_detr(CLASSES, dim=30, heads=4)
    with pytest.raises(UsageError, match="irpe has no parameter|has no parameter 'methd'"):
        build_detr(CLASSES, dim=DIM, encoding="irpe", encoding_params={"methd": "cross"})


def test_settings_are_the_published_comparison():
    for name, (sine, encoding) in SETTINGS.items():
        model = tiny(sine=sine, encoding=encoding, enc_layers=1, dec_layers=1)
        assert (model.sine is not None) == sine
        inner = [e.inner if isinstance(e, SineQK) else e for e in model.encodings]
        assert all(type(e) is ENCODINGS[encoding] for e in inner), name
