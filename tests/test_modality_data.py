"""The procedural video and spectrogram sets (motion, chirps) and how the ViT lays out their
positions: the answers are recomputed from the pixels, the layouts written out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from posenc_cli.data.images import build_image_data
from posenc_cli.data.images.chirps import BANDS, ChirpSpectrograms
from posenc_cli.data.images.motion import VELOCITY, MotionClips
from posenc_cli.errors import UsageError
from posenc_cli.models.clip_layout import clip_positions
from posenc_cli.models.vit import build_vit


def data_config(**changes) -> SimpleNamespace:
    base = dict(dataset="motion", root=None, image_size=16, train_size=8, val_size=8, seed=0,
                randaugment=None, random_erasing=0.0, hflip=None, crop_scale=[0.08, 1.0],
                interpolation="bicubic", shift=0, frames=4)  # fmt: skip
    return SimpleNamespace(**{**base, **changes})


def square_centres(clip: torch.Tensor, frames: int, side: int) -> list[tuple[float, float]]:
    """The bright square's centre in each frame: its pixels are the only ones above 0.5 on
    every channel (the background stays below 0.3 plus noise)."""
    centres = []
    for t in range(frames):
        frame = clip[:, t * side : (t + 1) * side]
        rows, cols = (frame.min(0).values > 0.5).nonzero(as_tuple=True)
        centres.append((rows.float().mean().item(), cols.float().mean().item()))
    return centres


@pytest.mark.parametrize("side,frames", [(16, 4), (24, 3)])
def test_motion_moves_the_square_one_step_per_frame_in_the_labelled_direction(side, frames):
    clips = MotionClips(12, side, frames, seed=3, split="train")
    for i in range(len(clips)):
        clip, label = clips[i]
        assert clip.shape == (3, frames * side, side) and label == i % 4
        centres = square_centres(clip, frames, side)
        for before, after in zip(centres, centres[1:], strict=False):
            moved = (after[0] - before[0], after[1] - before[1])
            assert moved == tuple(clips.step * v for v in VELOCITY[label])


def test_motion_items_are_the_same_on_every_access_and_splits_differ():
    a, b = MotionClips(4, 16, 4, 0, "train"), MotionClips(4, 16, 4, 0, "val")
    assert torch.equal(a[1][0], MotionClips(4, 16, 4, 0, "train")[1][0])
    assert not torch.equal(a[1][0], b[1][0])


def chirp_order(spectrogram: torch.Tensor) -> list[str]:
    """The chirps from left to right, each 'rise' or 'fall' from its loud cells: a rising chirp
    climbs to higher bands, which are lower rows."""
    loud = spectrogram[0] > 0.55  # the floor stays below 0.2 plus noise
    columns = loud.any(0).nonzero().flatten().tolist()
    runs, order = [[columns[0]]], []
    for c in columns[1:]:
        runs[-1].append(c) if c == runs[-1][-1] + 1 else runs.append([c])
    for run in runs:
        top = [int(loud[:, c].nonzero().min()) for c in run]
        order.append("rise" if top[-1] < top[0] else "fall")
    return order


@pytest.mark.parametrize("length", [32, 64, 128])
def test_chirps_label_says_which_chirp_comes_first(length):
    spectrograms = ChirpSpectrograms(10, length, seed=1, split="val")
    for i in range(len(spectrograms)):
        image, label = spectrograms[i]
        assert image.shape == (1, BANDS, length)
        expected = ["rise", "fall"] if label == 0 else ["fall", "rise"]
        assert chirp_order(image) == expected


@pytest.mark.parametrize("changes,word", [
    (dict(frames=1), "frames >= 2"),
    (dict(frames=9, image_size=16), "holds the square's path"),
    (dict(shift=2), "data.shift"),
    (dict(hflip=0.5), "data.hflip"),
    (dict(dataset="digits", frames=2), "only motion has frames"),
    (dict(dataset="chirps", frames=1, image_size=16), "at least 18 time steps"),
])  # fmt: skip
def test_bad_settings_are_one_line_usage_errors(changes, word):
    with pytest.raises(UsageError, match=word) as err:
        data = build_image_data(data_config(**changes))
        data.train[0]
    assert "\n" not in str(err.value)


# --- positions of a clip -----------------------------------------------------------------------


def test_clip_positions_written_out():
    """2 frames of 2 x 2 patches: the class token, then frame 0's four patches, then frame 1's."""
    three = [[-1, -1, -1], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1],
             [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1]]  # fmt: skip
    assert clip_positions(3, 2, 4, 2).tolist() == three
    assert clip_positions(2, 2, 4, 2).tolist() == [row[1:] for row in three]
    assert clip_positions(1, 2, 4, 2).tolist() == list(range(9))
    assert clip_positions(3, 1, 2, 2).tolist() == three[:5]  # an image: t = 0


@pytest.mark.parametrize("encoding,params,axes", [
    ("irpe_nd", {}, 3), ("mrope", {}, 3), ("irpe_nd", {"axes": 2}, 2), ("irpe", {}, 2),
    ("t5", {}, 1), ("learned", {}, 1),
])  # fmt: skip
def test_the_vit_gives_each_encoding_the_axes_it_reads(encoding, params, axes):
    model = build_vit("vit_nano", encoding=encoding, encoding_params=params, num_classes=4,
                      img_size=16, frames=4)  # fmt: skip
    assert model(torch.randn(2, 3, 64, 16)).shape == (2, 4)
    positions = model.token_positions(16, 4, None)
    assert positions.shape == ((1 + 64, axes) if axes > 1 else (1 + 64,))


@pytest.mark.parametrize("kwargs,word", [
    (dict(encoding="irpe_nd", encoding_params={"axes": 4}), "at most 3"),
    (dict(encoding="irpe", window=3), "one image's grid"),
    (dict(encoding="irpe", frames=0), "frames must be >= 1"),
])  # fmt: skip
def test_layouts_the_vit_cannot_give_are_usage_errors(kwargs, word):
    settings = {"num_classes": 4, "img_size": 16, "frames": 4, **kwargs}
    with pytest.raises(UsageError, match=word):
        build_vit("vit_nano", **settings)


def test_a_clip_whose_rows_do_not_split_into_frames_is_a_usage_error():
    model = build_vit("vit_nano", encoding="irpe_nd", num_classes=4, img_size=16, frames=4)
    with pytest.raises(UsageError, match="4 frames stacked along the rows"):
        model(torch.randn(1, 3, 40, 16))


# --- captions: text and an image in one sequence -------------------------------------------


def relation_of(cross: tuple[float, float], square: tuple[float, float]) -> str:
    """Where the cross's centre lies from the square's (rows grow downwards), by the dominant
    axis."""
    d_row, d_col = cross[0] - square[0], cross[1] - square[1]
    if abs(d_col) > abs(d_row):
        return "left" if d_col < 0 else "right"
    return "above" if d_row < 0 else "below"


def test_a_caption_is_true_exactly_when_its_label_says_so():
    """The truth is recomputed from the scene's two centres, not from the set's word list."""
    from posenc_cli.data.images.captions import WORDS, CaptionedScenes
    from posenc_cli.data.images.direction import make_scene

    scenes = CaptionedScenes(40, 32, seed=2, split="train")
    seen = set()
    for i in range(len(scenes)):
        (image, words), label = scenes[i]
        rng = scenes.rng(i)
        scene = make_scene(rng, scenes.geometry, int(rng.integers(4)))  # the set's first draws
        truth = relation_of(scene.cross_centre, scene.square_centre)
        assert image.shape == (3, 32, 32) and words.shape == (1,) and label == i % 2
        assert (WORDS[int(words[0])] == truth) == (label == 1)
        seen.add((WORDS[int(words[0])], label))
    assert len(seen) == 8  # every word, true and false


def test_caption_positions_follow_mrope_rule_and_2d_encodings_see_prefix_tokens():
    """Two words before a 2 x 2 image: the words at (0, 0, 0) and (1, 1, 1), the image starting
    at 2 on every axis; for 2D encodings the words sit with the class token at (-1, -1)."""
    assert clip_positions(3, 1, 2, 2, words=2).tolist() == [
        [-1, -1, -1], [0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 3], [2, 3, 2], [2, 3, 3]
    ]  # fmt: skip
    assert clip_positions(2, 1, 2, 2, words=2).tolist() == [[-1, -1]] * 3 + [
        [0, 0], [0, 1], [1, 0], [1, 1]
    ]  # fmt: skip
    assert clip_positions(1, 1, 2, 2, words=2).tolist() == list(range(7))


@pytest.mark.parametrize(
    "encoding", ["irpe_nd", "mrope", "irpe", "rope2d", "t5", "learned", "learned2d"]
)
def test_a_captioned_vit_reads_the_words(encoding):
    torch.manual_seed(0)
    model = build_vit("vit_nano", encoding=encoding, num_classes=2, img_size=16,
                      caption_vocab=6, caption_words=3, pool="avg").eval()  # fmt: skip
    for p in model.encoding_tensors().values():  # iRPE's zero tables would hide the order
        torch.nn.init.normal_(p, std=0.5)
    images, words = torch.randn(2, 3, 16, 16), torch.tensor([[0, 2, 1], [0, 2, 1]])
    other = torch.tensor([[1, 2, 0], [1, 2, 0]])  # the same words in the other order
    assert model(images, words).shape == (2, 2)
    # iRPE's shared prefix bucket and RoPE-2D's unrotated prefix see the words as a bag;
    # DeiT's table (learned2d) keeps a row per prefix token, so it orders them
    unordered = encoding in ("irpe", "rope2d")
    assert torch.allclose(model(images, words), model(images, other)) == unordered


@pytest.mark.parametrize("call,word", [
    (lambda m: m(torch.randn(1, 3, 16, 16)), "reads captions"),
    (lambda m: m(torch.randn(1, 3, 16, 16), torch.zeros(1, 2, dtype=torch.long)), "(1, 3)"),
])  # fmt: skip
def test_captions_missing_or_misshapen_are_usage_errors(call, word):
    model = build_vit("vit_nano", encoding="t5", num_classes=2, img_size=16, caption_vocab=6,
                      caption_words=3)  # fmt: skip
    with pytest.raises(UsageError, match=word):
        call(model)


def test_window_attention_with_captions_is_a_usage_error():
    with pytest.raises(UsageError, match="no slot for caption words"):
        build_vit("vit_nano", encoding="irpe", num_classes=2, img_size=16, window=3,
                  caption_vocab=6, caption_words=3)  # fmt: skip


def test_a_captions_recipe_trains_evaluates_and_refuses_mixup(capsys, tmp_path):
    import json

    import yaml

    from tests.helpers import run

    tree = {
        "kind": "image", "encoding": {"name": "irpe_nd"},
        "model": {"arch": "vit_nano", "dim": 16, "depth": 1, "heads": 2, "pool": "avg"},
        "data": {"dataset": "captions", "image_size": 16, "train_size": 32, "val_size": 16},
        "train": {"epochs": 1, "batch_size": 16, "warmup_epochs": 0, "device": "cpu"},
        "eval": {"sizes": [16, 24], "shifts": [0]},
    }  # fmt: skip
    path = tmp_path / "captions.yaml"
    path.write_text(yaml.safe_dump(tree))
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "run"))
    assert code == 0, err
    evaluated = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert set(evaluated["lengths"]) == {"16", "24"}
    tree["train"]["mixup"] = 0.8
    path.write_text(yaml.safe_dump(tree))
    code, _, err = run(capsys, "train", str(path), "--out", str(tmp_path / "mixed"))
    assert code == 2 and "a caption belongs to one" in err


def test_sample_grids_draw_clips_spectrograms_and_captioned_scenes(tmp_path):
    from posenc_cli.data.images import sample_grid
    from posenc_cli.data.images.captions import CaptionedScenes

    for name, data in [("motion", MotionClips(4, 16, 4, 0, "val")),
                       ("chirps", ChirpSpectrograms(4, 32, 0, "val")),
                       ("captions", CaptionedScenes(4, 32, 0, "val"))]:  # fmt: skip
        assert sample_grid(data, 4, tmp_path / f"{name}.png").stat().st_size > 0
