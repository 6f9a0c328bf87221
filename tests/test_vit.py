"""DeiT on timm (posenc_cli.models.vit): every encoding trains, counts and FLOPs equal timm's,
weights ported from timm give timm's logits, any image size runs, and position information
enters only through the encoding (patch permutation test)."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.errors import UsageError
from posenc_cli.models import vit
from posenc_cli.models.vit import ARCHS, build_vit, model_given_params
from tests.helpers import run

IMG = 16  # vit_nano at 16 px: patch 4 -> a 4 x 4 grid, 17 tokens
NANO = ARCHS["vit_nano"]


def nano(encoding: str = "learned2d", seed: int = 0, **kwargs) -> vit.VisionModel:
    torch.manual_seed(seed)
    return build_vit("vit_nano", encoding=encoding, num_classes=3, img_size=IMG, **kwargs)


def randomize_zero_tables(model: torch.nn.Module) -> None:
    """Zero-initialised tables (iRPE) add nothing at first; give them values so tests bite."""
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().max() == 0:
                p.normal_(std=0.5)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def patches_permuted(images: Tensor, patch: int, order: Tensor) -> Tensor:
    """The images with their ``patch x patch`` tiles moved: tile k (row-major) <- tile order[k]."""
    B, C, H, W = images.shape
    h, w = H // patch, W // patch
    tiles = images.reshape(B, C, h, patch, w, patch).permute(0, 2, 4, 1, 3, 5)  # (B,h,w,C,p,p)
    tiles = tiles.reshape(B, h * w, C, patch, patch)[:, order]
    tiles = tiles.reshape(B, h, w, C, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(B, C, H, W)


# --- every encoding -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in ENCODINGS if not ENCODINGS[n].causal_only])
def test_every_encoding_trains(name: str) -> None:
    model = nano(name)
    images, labels = torch.randn(4, 3, IMG, IMG), torch.tensor([0, 1, 2, 0])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(4):
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            assert all(torch.isfinite(g).all() for g in grads)
            tables = list(model.encoding_tensors().values())
            if tables:
                # the last block's relative terms may get none: with class-token pooling only
                # the class query's row matters there, and every pair in it reads one bucket
                assert sum(float(p.grad.abs().sum()) for p in tables) > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(
    "name", [n for n in ENCODINGS if n != "none" and not ENCODINGS[n].causal_only]
)
def test_every_encoding_sees_patch_order(name: str) -> None:
    """The permutation test's counterpart: with an encoding, moving patches changes the output."""
    model = nano(name).double().eval()
    randomize_zero_tables(model)
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain, moved = model(images), model(patches_permuted(images, 4, order))
    # in float64 the 'none' model agrees to ~1e-15 (test below); any position term shows
    assert (plain - moved).abs().max() > 1e-8


def test_no_encoding_is_invariant_to_patch_order() -> None:
    """encoding='none': the class token sees a set of patches, so no hidden position embedding
    (timm's pos_embed, a conv padding effect) exists anywhere in the model."""
    model = nano("none").double().eval()
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(images), model(patches_permuted(images, 4, order)))
    assert model.pos_embed is None and model.encoding_parameters() == 0


# --- exactly timm's DeiT ------------------------------------------------------------------------


def timm_nano(**kwargs) -> VisionTransformer:
    return VisionTransformer(
        img_size=IMG,
        patch_size=NANO.patch_size,
        embed_dim=NANO.dim,
        depth=NANO.depth,
        num_heads=NANO.heads,
        num_classes=3,
        **kwargs,
    )


def port_from_timm(ref: VisionTransformer, model: vit.VisionModel) -> None:
    """timm's weights into ours: qkv split into q and kv, pos_embed into the learned2d table."""
    state = {}
    for name, value in ref.state_dict().items():
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            base, kind = name.rsplit(".qkv.", 1)
            state[f"{base}.q.{kind}"] = value[: NANO.dim]
            state[f"{base}.kv.{kind}"] = value[NANO.dim :]
        elif name == "pos_embed":
            state["encoding.table"] = value[0]
        else:
            state[name] = value
    for i in range(NANO.depth):  # the shared table also appears under every block
        state[f"blocks.{i}.attn.encoding.table"] = state["encoding.table"]
    model.load_state_dict(state)


@pytest.mark.parametrize("size", [(IMG, IMG), (24, 12)])
def test_learned2d_model_is_timm_deit(size: tuple[int, int]) -> None:
    """Ported weights give timm's logits, also at another image size (timm's dynamic_img_size
    resamples with antialias, which learned2d's antialias=True reproduces)."""
    torch.manual_seed(0)
    ref = timm_nano(dynamic_img_size=True).double().eval()
    model = nano(encoding_params={"antialias": True}).double().eval()
    port_from_timm(ref, model)
    images = torch.randn(2, 3, *size, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(images), ref(images))


def test_deit_parameter_counts_equal_timm() -> None:
    for arch, timm_name in [("deit_tiny", "deit_tiny_patch16_224")]:
        model, ref = build_vit(arch), timm.create_model(timm_name, pretrained=False)
        assert count(model) == count(ref) == 5_717_416
        assert model.encoding_parameters() == ref.pos_embed.numel() == 197 * 192


def test_deit_tiny_irpe_parameter_count() -> None:
    """iRPE-K, product, contextual, shared head: (7*7 + 1) buckets x head_dim 64 per layer.
    The official DeiT-Ti + iRPE (5.76 M) keeps the learned table: absolute=True."""
    per_layer = ((2 * 3 + 1) ** 2 + 1) * 64  # beta = 2 * 1.9 -> 3, plus the class bucket
    irpe = build_vit("deit_tiny", encoding="irpe")
    assert irpe.encoding_parameters() == 12 * per_layer == 38_400
    assert count(irpe) == 5_717_416 - 197 * 192 + 12 * per_layer
    both = build_vit("deit_tiny", encoding="irpe", absolute=True)
    assert count(both) == 5_717_416 + 12 * per_layer == 5_755_816
    assert round(count(both) / 1e6, 2) == 5.76
    assert both.encoding_parameters() == 197 * 192 + 12 * per_layer


def forward_flops(model: torch.nn.Module, images: Tensor) -> int:
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(images)
    return counter.get_total_flops()


def test_deit_tiny_flops_equal_timm_at_224() -> None:
    """Batch 1 at 224 px; FlopCounterMode counts 2 per multiply-add, the math SDPA path is forced
    so attention is counted. MACs = depth (12 N d^2 + 2 N^2 d) + patch embed + head."""
    images = torch.randn(1, 3, 224, 224)
    ours = forward_flops(build_vit("deit_tiny").eval(), images)
    theirs = forward_flops(timm.create_model("deit_tiny_patch16_224").eval(), images)
    N, d = 197, 192
    macs = 12 * (12 * N * d**2 + 2 * N**2 * d) + 196 * (3 * 16 * 16) * d + d * 1000
    assert ours == theirs == 2 * macs == 2 * 1_253_683_200


# --- options ------------------------------------------------------------------------------------


def test_encodings_keep_their_own_init() -> None:
    """timm re-initialises every Linear; XL's W_R, u, v must come back as XL built them."""
    model = nano("xl")
    given = model_given_params("xl", NANO, IMG // NANO.patch_size)
    torch.manual_seed(0)
    fresh = [build_encoding("xl", **given) for _ in range(NANO.depth)]
    for block, enc in zip(model.blocks, fresh, strict=True):
        for key, value in enc.state_dict().items():
            torch.testing.assert_close(block.attn.encoding.state_dict()[key], value)


def test_shared_and_per_layer_instances() -> None:
    t5, shaw = nano("t5"), nano("shaw")
    assert all(b.attn.encoding is t5.encoding for b in t5.blocks)
    assert t5.encoding_parameters() == count(t5.encoding)
    assert shaw.encoding is None
    assert len({id(b.attn.encoding) for b in shaw.blocks}) == NANO.depth
    assert shaw.encoding_parameters() == sum(count(b.attn.encoding) for b in shaw.blocks)
    assert "encoding.table" in nano("learned2d").no_weight_decay()


@pytest.mark.parametrize("name", ["learned2d", "rope2d", "irpe", "sincos2d"])
def test_other_image_size_at_call_time(name: str) -> None:
    """At 24 x 12 px (6 x 3 grid) the model equals one built for that size with the same
    weights, the learned2d table resized: the grid is read from the input."""
    model = nano(name).eval()
    randomize_zero_tables(model)
    grid = {"height": 6, "width": 3} if name == "learned2d" else None
    big = build_vit("vit_nano", encoding=name, encoding_params=grid, num_classes=3).eval()
    state = dict(model.state_dict())
    if name == "learned2d":
        table = model.encoding.resized(6, 3).detach()
        state = {k: table if k.endswith("encoding.table") else v for k, v in state.items()}
    big.load_state_dict(state)
    images = torch.randn(2, 3, 24, 12)
    with torch.no_grad():
        out = model(images)
        torch.testing.assert_close(out, big(images))
    assert out.shape == (2, 3)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_1d_encodings_see_the_flattened_sequence(name: str) -> None:
    """Class token at 0, then patches row-major: positions arange(1 + h*w)."""
    model = nano(name).eval()
    seen: list[Tensor] = []
    hook = "rotate" if name == "rope" else "bias"
    original = getattr(model.encoding, hook)

    def spy(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor):
        seen.append(k_pos)
        return original(q, k, q_pos, k_pos)

    setattr(model.encoding, hook, spy)
    with torch.no_grad():
        model(torch.randn(1, 3, 8, 12))  # 2 x 3 grid
    assert len(seen) == NANO.depth
    for k_pos in seen:
        assert torch.equal(k_pos, torch.arange(7))
    assert torch.equal(nano("irpe").token_positions(2, 3, None), grid_positions(2, 3, 1))


def test_window_attention_is_local() -> None:
    """window=3, one block: a patch's output does not depend on pixels two patches away (only on
    its 3 x 3 neighbourhood and the class token), but does on its neighbour's."""
    model = nano("irpe", window=3, depth=1).double()
    assert model.blocks[0].attn.window == 3
    images = torch.randn(1, 3, IMG, IMG, dtype=torch.float64, requires_grad=True)
    tokens = model.forward_features(images)  # (1, 17, D)
    # a random readout: the plain sum of a LayerNorm output is constant
    (tokens[0, 1] * torch.randn(NANO.dim, dtype=torch.float64)).sum().backward()  # patch (0, 0)
    grad = images.grad[0].abs().sum(0)  # (H, W)
    assert grad[:4, 4:8].sum() > 0  # patch (0, 1): inside the window
    assert grad[:4, 8:].sum() == 0 and grad[8:, :].sum() == 0  # two patches away: outside


def test_a_dilated_window_reaches_every_other_patch() -> None:
    """window=3 dilated 2, one block: patch (0, 0) sees patches (0, 2) and (2, 0), not its
    neighbour (0, 1); IMG = 16 with 4 px patches is a 4 x 4 grid."""
    model = nano("irpe", window=3, window_dilation=2, depth=1).double()
    assert model.blocks[0].attn.dilation == 2
    images = torch.randn(1, 3, IMG, IMG, dtype=torch.float64, requires_grad=True)
    tokens = model.forward_features(images)
    (tokens[0, 1] * torch.randn(NANO.dim, dtype=torch.float64)).sum().backward()
    grad = images.grad[0].abs().sum(0)
    assert grad[:4, 8:12].sum() > 0 and grad[8:12, :4].sum() > 0  # two patches away: slots
    assert grad[:4, 4:8].sum() == 0 and grad[4:8, :4].sum() == 0  # the neighbours: not


def test_window_dilation_in_a_recipe_needs_a_window(capsys, tmp_path) -> None:
    code, _, err = run(
        capsys, "train", "image/base", "model.window_dilation=2", "--out", str(tmp_path / "r")
    )
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "model.window_dilation 2" in err and "set model.window too" in err


def test_window_needs_a_grid_encoding() -> None:
    with pytest.raises(UsageError, match="window"):
        nano("rope", window=3)
    assert nano("none", window=3)(torch.randn(1, 3, IMG, IMG)).shape == (1, 3)


def test_usage_errors() -> None:
    with pytest.raises(UsageError, match="did you mean 'deit_tiny'"):
        build_vit("deit_tiyn")
    with pytest.raises(UsageError, match="did you mean 'learned2d'"):
        build_vit("vit_nano", encoding="learned2")
    with pytest.raises(UsageError, match="did you mean 'depth'"):
        build_vit("vit_nano", dept=3)
    with pytest.raises(UsageError, match="divisible"):
        build_vit("vit_nano", heads=3)
    with pytest.raises(UsageError, match="patch size"):
        nano()(torch.randn(1, 3, 18, 16))
    with pytest.raises(UsageError, match="already absolute"):
        nano("sincos2d", absolute=True)


def test_custom_size_overrides() -> None:
    model = build_vit("vit_nano", dim=48, depth=3, heads=4, patch_size=8, mlp_ratio=2.0)
    assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.heads) == (48, 3, 4)
    assert model.blocks[0].mlp.fc1.out_features == 96
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


# --- timm registry ------------------------------------------------------------------------------


def test_timm_registry_round_trip() -> None:
    assert {f"posenc_{a}" for a in ARCHS} <= set(timm.list_models("posenc_*"))
    model = timm.create_model("posenc_vit_nano", encoding="irpe", num_classes=10, img_size=IMG)
    assert model.encoding_name == "irpe" and model.head.out_features == 10
    assert model(torch.randn(1, 3, IMG, IMG)).shape == (1, 10)
    tiny = timm.create_model("posenc_deit_tiny", drop_path_rate=0.1)
    assert tiny.encoding_name == "learned2d" and count(tiny) == 5_717_416
    with pytest.raises(UsageError, match="pretrained"):
        timm.create_model("posenc_deit_tiny", pretrained=True)


def test_registering_twice_is_harmless() -> None:
    before = timm.models.model_entrypoint("posenc_deit_tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vit.register_archs()
    assert timm.models.model_entrypoint("posenc_deit_tiny") is before


def test_dropout_and_drop_path_as_timm() -> None:
    """In training mode with the same seed, ported weights give timm's logits: dropout sits on
    the input, the attention weights, the attention output and the MLP, as timm's ``drop``."""
    torch.manual_seed(0)
    rates = {"pos_drop_rate": 0.2, "attn_drop_rate": 0.2, "proj_drop_rate": 0.2}
    ref = timm_nano(dynamic_img_size=True, drop_path_rate=0.3, **rates).double().train()
    model = nano(dropout=0.2, drop_path=0.3).double().train()
    port_from_timm(ref, model)
    images = torch.randn(4, 3, IMG, IMG, dtype=torch.float64)
    torch.manual_seed(1)
    expected = ref(images)
    torch.manual_seed(1)
    torch.testing.assert_close(model(images), expected)
    assert not torch.allclose(model(images), expected)  # the draws matter


def test_grad_checkpointing_gives_the_same_gradients() -> None:
    model = nano("irpe").double()
    randomize_zero_tables(model)
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    grads = []
    for enable in (False, True):
        model.set_grad_checkpointing(enable)
        model.zero_grad()
        model(images).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, recomputed)


def test_average_pooling_reads_the_patches_not_the_class_token():
    import torch

    from posenc_cli.models.vit import build_vit

    torch.manual_seed(0)
    model = build_vit("vit_nano", "none", num_classes=3, img_size=16, pool="avg").eval()
    images = torch.randn(2, 3, 16, 16)
    tokens = model.forward_features(images)  # (B, 1 + 16, D)
    expected = model.head(model.fc_norm(tokens[:, 1:].mean(dim=1)))
    torch.testing.assert_close(model(images), expected)


def test_a_causal_only_encoding_is_refused_by_the_bidirectional_vit():
    causal_only = [n for n in ENCODINGS if ENCODINGS[n].causal_only]
    assert causal_only  # xpos, cope, fox
    for name in causal_only:
        with pytest.raises(UsageError, match="causal"):
            nano(name)
