"""The shapes writer, the COCO loader, COCO scoring and the prediction picture, on tiny sets."""

import contextlib
import io
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO

from posenc_cli.errors import UsageError
from posenc_cli.tasks.detection.coco import (
    MEAN,
    STD,
    CocoDetectionData,
    build_detection_data,
    collate,
)
from posenc_cli.tasks.detection.coco_eval import coco_evaluate
from posenc_cli.tasks.detection.criterion import postprocess
from posenc_cli.tasks.detection.draw import draw_predictions
from posenc_cli.tasks.detection.shapes import CATEGORIES, MARKER, make_shapes

SIZE = 48


@pytest.fixture(scope="module")
def plain_set(tmp_path_factory) -> Path:
    """Six 48-pixel images on plain backgrounds: every non-background pixel is a shape."""
    out = tmp_path_factory.mktemp("shapes") / "plain"
    make_shapes(out, images=6, seed=3, size=SIZE, max_objects=4, background="plain")
    return out


def quiet_coco(path: Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


def annotations_by_image(root: Path, split: str) -> tuple[dict, dict[int, list[dict]]]:
    coco = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
    by_image: dict[int, list[dict]] = {image["id"]: [] for image in coco["images"]}
    for ann in coco["annotations"]:
        by_image[ann["image_id"]].append(ann)
    return coco, by_image


def test_the_json_is_coco_and_ids_follow_coco_rules(plain_set):
    ids = {"image": [], "annotation": []}
    for split in ("train", "val"):
        coco = quiet_coco(plain_set / "annotations" / f"instances_{split}.json")
        assert [coco.cats[i]["name"] for i in sorted(coco.cats)] == list(CATEGORIES)
        assert sorted(coco.cats) == [1, 2, 3]
        ids["image"] += coco.getImgIds()
        ids["annotation"] += coco.getAnnIds()
        for ann in coco.loadAnns(coco.getAnnIds()):
            assert ann["iscrowd"] == 0 and ann["category_id"] in (1, 2, 3)
    assert len(quiet_coco(plain_set / "annotations" / "instances_val.json").getImgIds()) == 1
    for kind in ids.values():  # unique across splits and never 0 (COCOeval's "no match")
        assert len(set(kind)) == len(kind) and min(kind) >= 1


def test_boxes_are_the_tight_boxes_of_the_drawn_pixels(plain_set):
    for split in ("train", "val"):
        coco, by_image = annotations_by_image(plain_set, split)
        for image in coco["images"]:
            pixels = np.asarray(Image.open(plain_set / split / image["file_name"]).convert("RGB"))
            assert pixels.shape == (image["height"], image["width"], 3) == (SIZE, SIZE, 3)
            corners = [pixels[0, 0], pixels[0, -1], pixels[-1, 0], pixels[-1, -1]]
            background = max(corners, key=lambda c: sum((c == d).all() for d in corners))
            foreground = (pixels != background).any(-1)  # (S, S)
            anns = by_image[image["id"]]
            assert 1 <= len(anns) <= 4
            inside_some_box = np.zeros_like(foreground)
            for ann in anns:
                x, y, w, h = (int(v) for v in ann["bbox"])
                assert ann["bbox"] == [float(x), float(y), float(w), float(h)]
                assert 0 <= x and 0 <= y and w > 0 and h > 0
                assert x + w <= image["width"] and y + h <= image["height"]
                inside_some_box[y : y + h, x : x + w] = True
                region = foreground[y : y + h, x : x + w]
                # tight: each edge row and column of the box holds a drawn pixel
                assert region[0].any() and region[-1].any()
                assert region[:, 0].any() and region[:, -1].any()
            assert not (foreground & ~inside_some_box).any()
            # visible areas partition the foreground: each pixel belongs to one shape
            assert sum(ann["area"] for ann in anns) == foreground.sum()


def test_same_seed_same_bytes_other_seed_other_set(tmp_path):
    a = make_shapes(tmp_path / "a", images=4, seed=7, size=32)
    make_shapes(tmp_path / "b", images=4, seed=7, size=32)
    make_shapes(tmp_path / "c", images=4, seed=8, size=32)
    assert not a.reused and (a.train_images, a.val_images) == (3, 1)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.*"))
    assert len(files) == 4 + 2 + 1  # pictures, two jsons, the marker
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    train = Path("annotations/instances_train.json")
    assert (tmp_path / "a" / train).read_bytes() != (tmp_path / "c" / train).read_bytes()


def test_a_foreign_folder_is_refused_and_an_old_set_is_reused_or_rebuilt(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        make_shapes(foreign, images=3, size=32)
    assert (foreign / "notes.txt").read_text() == "mine"

    out = tmp_path / "set"
    make_shapes(out, images=5, size=32, val_fraction=0.4)
    assert make_shapes(out, images=5, size=32, val_fraction=0.4).reused
    rebuilt = make_shapes(out, images=3, size=32, val_fraction=0.4)
    assert not rebuilt.reused and (rebuilt.train_images, rebuilt.val_images) == (2, 1)
    assert len(list(out.glob("*/*.png"))) == 3  # the two stale pictures are gone
    assert (out / MARKER).is_file()


@pytest.mark.parametrize(
    "kwargs",
    [{"images": 0}, {"size": 8}, {"max_objects": 0}, {"val_fraction": 1.0}, {"seed": -1}],
)
def test_bad_parameters_are_usage_errors(tmp_path, kwargs):
    with pytest.raises(UsageError):
        make_shapes(tmp_path / "x", **{"images": 2, **kwargs})


def test_loader_targets_round_trip_to_the_json_boxes(plain_set):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=32))
    assert data.layout == "shapes" and data.class_names == list(CATEGORIES)
    assert data.label_to_category == [1, 2, 3] and data.num_classes == 3
    _, by_image = annotations_by_image(plain_set, "val")
    image, target = data.val[0]
    assert image.shape == (3, 32, 32) and target["orig_size"].tolist() == [SIZE, SIZE]
    anns = by_image[target["image_id"]]
    assert target["labels"].tolist() == [a["category_id"] - 1 for a in anns]
    cx, cy, w, h = (target["boxes"] * SIZE).unbind(-1)
    back = torch.stack([cx - w / 2, cy - h / 2, w, h], -1)
    torch.testing.assert_close(back, torch.tensor([a["bbox"] for a in anns]), atol=1e-4, rtol=0)


def test_boxes_cover_the_shapes_after_resizing(plain_set):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=40))
    for index in range(len(data.train)):
        data.train.train = False  # no flip here; the flip has its own test
        image, target = data.train[index]
        rgb = image * torch.tensor(STD)[:, None, None] + torch.tensor(MEAN)[:, None, None]
        background = rgb[:, 0, 0]  # a corner; plain backgrounds
        foreground = (rgb - background[:, None, None]).abs().amax(0) > 0.05  # (S, S)
        covered = torch.zeros_like(foreground)
        for cx, cy, w, h in (target["boxes"] * 40).tolist():
            # within one pixel of the scaled box: bilinear resizing smears edges by that much
            x0, y0 = math.floor(cx - w / 2) - 1, math.floor(cy - h / 2) - 1
            x1, y1 = math.ceil(cx + w / 2) + 1, math.ceil(cy + h / 2) + 1
            covered[max(y0, 0) : y1, max(x0, 0) : x1] = True
            inner = foreground[max(y0 + 2, 0) : y1 - 2, max(x0 + 2, 0) : x1 - 2]
            assert inner.any()
        assert not (foreground & ~covered).any()


def test_train_flip_mirrors_image_and_boxes(plain_set):
    flipping = CocoDetectionData(
        plain_set / "train", plain_set / "annotations/instances_train.json", 32, train=True
    )
    fixed = CocoDetectionData(
        plain_set / "train", plain_set / "annotations/instances_train.json", 32, train=False
    )
    plain_image, plain_target = fixed[0]
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        image, target = flipping[0]
        flipped = not torch.equal(image, plain_image)
        seen.add(flipped)
        want = plain_target["boxes"].clone()
        if flipped:
            torch.testing.assert_close(image, plain_image.flip(-1))
            want[:, 0] = 1 - want[:, 0]
        torch.testing.assert_close(target["boxes"], want)
    assert seen == {True, False}


def test_collate_stacks_images_and_keeps_targets(plain_set):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=24))
    images, targets = collate([data.train[0], data.train[1], data.train[2]])
    assert images.shape == (3, 3, 24, 24)
    assert [t["image_id"] for t in targets] == data.train.ids[:3]


def write_coco_layout(root: Path) -> None:
    """COCO 2017 names, category ids with gaps, a crowd box and a zero-width box."""
    (root / "annotations").mkdir(parents=True)
    categories = [{"id": 3, "name": "car"}, {"id": 7, "name": "train"}]
    for split in ("train2017", "val2017"):
        (root / split).mkdir()
        Image.new("RGB", (40, 20), (10, 20, 30)).save(root / split / "a.jpg")
        annotations = [
            {"id": 1, "image_id": 5, "category_id": 7, "bbox": [4, 2, 10, 8], "area": 80,
             "iscrowd": 0},
            {"id": 2, "image_id": 5, "category_id": 3, "bbox": [30, 5, 20, 10], "area": 100,
             "iscrowd": 0},  # runs past the right edge: clipped to x 30..40
            {"id": 3, "image_id": 5, "category_id": 3, "bbox": [1, 1, 5, 5], "area": 25,
             "iscrowd": 1},
            {"id": 4, "image_id": 5, "category_id": 3, "bbox": [8, 8, 0, 4], "area": 0,
             "iscrowd": 0},
        ]  # fmt: skip
        coco = {
            "images": [{"id": 5, "file_name": "a.jpg", "width": 40, "height": 20}],
            "annotations": annotations,
            "categories": categories,
        }
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))


def test_coco_layout_maps_categories_and_drops_crowd_and_empty_boxes(tmp_path):
    write_coco_layout(tmp_path)
    data = build_detection_data(SimpleNamespace(root=tmp_path, image_size=16))
    assert data.layout == "coco" and data.label_to_category == [3, 7]
    assert data.class_names == ["car", "train"]
    _, target = data.val[0]
    assert target["labels"].tolist() == [1, 0]
    want = torch.tensor([[9 / 40, 6 / 20, 10 / 40, 8 / 20], [35 / 40, 10 / 20, 10 / 40, 10 / 20]])
    torch.testing.assert_close(target["boxes"], want)
    assert target["orig_size"].tolist() == [20, 40]


def test_missing_data_is_a_usage_error_naming_data_root(tmp_path):
    with pytest.raises(UsageError, match="data.root"):
        build_detection_data(SimpleNamespace(root=tmp_path / "nowhere", image_size=16))
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(UsageError, match="data.root.*instances_train"):
        build_detection_data(SimpleNamespace(root=tmp_path / "empty", image_size=16))
    make_shapes(tmp_path / "set", images=3, size=32)
    first = sorted((tmp_path / "set" / "train").glob("*.png"))[0]
    first.unlink()
    with pytest.raises(UsageError, match=f"data.root.*missing.*{first.name}"):
        build_detection_data(SimpleNamespace(root=tmp_path / "set", image_size=16))
    make_shapes(tmp_path / "other", images=3, size=32)
    shutil.rmtree(tmp_path / "other" / "val")
    with pytest.raises(UsageError, match="data.root.*image folder"):
        cfg = SimpleNamespace(root=tmp_path / "other", image_size=16, layout="shapes")
        build_detection_data(cfg)


def perfect_predictions(data, split="val") -> dict[int, dict[str, torch.Tensor]]:
    """Ground truth as detections with score ~1, plus a low-scoring stray query per image."""
    dataset = getattr(data, split)
    dataset.train = False
    predictions = {}
    for index in range(len(dataset)):
        _, target = dataset[index]
        m = len(target["labels"])
        logits = torch.full((1, m + 1, data.num_classes + 1), -10.0)
        logits[0, torch.arange(m), target["labels"]] = 10.0
        logits[0, m, -1] = 10.0  # the stray says no-object
        boxes = torch.cat([target["boxes"], torch.tensor([[0.5, 0.5, 0.3, 0.3]])])[None]
        outputs = {"pred_logits": logits, "pred_boxes": boxes}
        predictions[target["image_id"]] = postprocess(outputs, target["orig_size"][None])[0]
    return predictions


def test_a_perfect_prediction_scores_ap_one(plain_set):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=32))
    predictions = perfect_predictions(data, "train")
    scores = coco_evaluate(data.train.coco, predictions, data.label_to_category)
    assert scores["AP"] == pytest.approx(1.0) and scores["AP50"] == pytest.approx(1.0)
    assert scores["AP75"] == pytest.approx(1.0) and scores["APs"] == pytest.approx(1.0)
    assert math.isnan(scores["APl"])  # no shape is over 96^2 pixels: undefined, not 0


def test_no_detections_or_wrong_labels_score_zero(plain_set):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=32))
    coco, lut = data.train.coco, data.label_to_category
    assert coco_evaluate(coco, {}, lut)["AP"] == 0.0
    predictions = perfect_predictions(data, "train")
    empty = {i: {k: v[:0] for k, v in p.items()} for i, p in predictions.items()}
    assert coco_evaluate(coco, empty, lut)["AP"] == 0.0
    # every true box with the wrong class (the stray query dropped: it may hit a box by chance)
    kept = {i: {k: v[:-1] for k, v in p.items()} for i, p in predictions.items()}
    shifted = {i: {**p, "labels": (p["labels"] + 1) % 3} for i, p in kept.items()}
    assert coco_evaluate(coco, shifted, lut)["AP"] == 0.0
    # scoring half the images scores only those: still perfect on what was seen
    some = dict(list(predictions.items())[:2])
    assert coco_evaluate(coco, some, lut)["AP"] == pytest.approx(1.0)


def test_draw_predictions_writes_a_png(plain_set, tmp_path):
    data = build_detection_data(SimpleNamespace(root=plain_set, image_size=32))
    images, targets = collate([data.train[i] for i in range(3)])
    predictions = perfect_predictions(data, "train")
    path = draw_predictions(
        images,
        [predictions[t["image_id"]] for t in targets],
        targets,
        data.class_names,
        tmp_path / "pictures" / "pred.png",
        score_threshold=0.5,
        max_images=2,
    )
    with Image.open(path) as picture:
        assert picture.format == "PNG" and picture.width > picture.height > 100
