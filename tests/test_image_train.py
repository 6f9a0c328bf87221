"""Image experiments end to end: recipes of kind image, training, evaluation at other sizes and
shifts, comparison over seeds, resume, and the DeiT-Ti recipe's counts in ``posenc profile``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from posenc_cli.config import dump_recipe, expand_sweep, load_recipe
from posenc_cli.errors import UsageError
from posenc_cli.tasks.image.train import train_image
from tests.helpers import ddp_train, run, torchrun_available

TINY = {
    "kind": "image",
    "seed": 0,
    "model": {"arch": "vit_nano", "dim": 16, "depth": 1, "heads": 2, "drop_path": 0.1},
    "encoding": {"name": "learned2d"},
    "data": {"dataset": "digits", "image_size": 16, "train_size": 96, "val_size": 32},
    "train": {"epochs": 2, "batch_size": 32, "lr": 2e-3, "warmup_epochs": 1},
    "eval": {"sizes": [16, 24], "shifts": [0, 4], "batch_size": 64},
}


def write_recipe(tmp_path: Path, **changes) -> Path:
    tree = json.loads(json.dumps(TINY))
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if name:
            tree.setdefault(section, {})[name] = value
        else:
            tree[section] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_image_recipe_round_trips_through_dump(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, **{"sweep": {"encoding.name": ["none", "irpe"]}}))
    assert recipe.kind == "image" and recipe.model.arch == "vit_nano"
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(dump_recipe(recipe))
    assert load_recipe(dumped) == recipe
    assert [name for name, _ in expand_sweep(recipe)] == [
        "encoding.name=none",
        "encoding.name=irpe",
    ]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"kind": "video"}, "kind: unknown kind 'video'"),
        ({"model.mem_len": 4}, "model.mem_len"),  # a text key in an image recipe
        ({"model.arch": "deit_tiniest"}, "deit_tiny"),
        ({"data.image_size": 18}, "patch size 4"),
        ({"encoding.method": "spiral"}, "encoding"),
        ({"train.mixup": -1.0}, "train.mixup"),
    ],
)
def test_bad_image_recipes_name_the_key(tmp_path, change, words):
    with pytest.raises(UsageError) as err:
        load_recipe(write_recipe(tmp_path, **change))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_kind_cannot_be_overridden(tmp_path):
    with pytest.raises(UsageError, match="kind"):
        load_recipe(write_recipe(tmp_path), ["kind=text"])


def test_text_recipes_are_unchanged_by_kinds():
    recipe = load_recipe("quickstart")
    assert recipe.kind == "text" and "kind" not in dump_recipe(recipe)


def test_train_evaluate_and_compare_an_image_sweep(capsys, tmp_path):
    path = write_recipe(
        tmp_path, **{"sweep": {"seed": [0, 1]}, "train.epochs": 1, "encoding.name": "rope2d"}
    )
    code, out, err = run(capsys, "train", str(path), "--out", str(tmp_path / "runs"))
    assert code == 0, err
    assert "top1" in out and "16px" in out
    run_dir = tmp_path / "runs" / "seed=0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "image" and summary["encoding"] == "rope2d"
    evaluated = json.loads((run_dir / "eval.json").read_text())
    assert set(evaluated["lengths"]) == {"16", "16+4", "24", "24+4"}
    assert all(0 <= r["top1"] <= r["top5"] <= 100 for r in evaluated["lengths"].values())
    code, out, _ = run(capsys, "compare", str(tmp_path / "runs"), "--format", "json")
    result = json.loads(out)
    assert result["kind"] == "image" and result["groups"]["rope2d"]["seeds"] == [0, 1]
    code, out, err = run(capsys, "compare", str(tmp_path / "runs"), "--metric", "exact_match")
    assert code == 2 and "top1" in err


def test_evaluate_at_other_sizes_and_a_table_that_cannot_stretch(capsys, tmp_path):
    path = write_recipe(tmp_path, **{"train.epochs": 1, "encoding.name": "swin"})
    assert run(capsys, "train", str(path), "--out", str(tmp_path / "swin"))[0] == 0
    code, out, err = run(
        capsys, "evaluate", str(tmp_path / "swin"), "--sizes", "16,32", "--shifts", "0",
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    points = json.loads(out)["lengths"]
    assert "top1" in points["16"] and "swin" in points["32"]["error"]


def test_a_resumed_run_ends_like_the_uninterrupted_one(tmp_path):
    """Mixup, CutMix, EMA, drop path and shuffling all draw from seeds of (seed, epoch)."""
    changes = {"train.mixup": 0.8, "train.cutmix": 1.0, "train.ema": True, "train.epochs": 2}
    recipe = load_recipe(write_recipe(tmp_path, **changes))
    whole = train_image(recipe, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train_image(recipe, tmp_path / "parts", interrupt_at=4)  # 3 steps an epoch
    resumed = train_image(recipe, tmp_path / "parts", resume=True)
    speed = "images_per_s"  # a timing, not a result
    final = {k: v for k, v in resumed["final"].items() if k != speed}
    assert final == pytest.approx({k: v for k, v in whole["final"].items() if k != speed})
    with pytest.raises(UsageError, match="--resume"):
        train_image(recipe, tmp_path / "whole")


def test_deit_tiny_recipe_profile_counts_match_timm_and_the_irpe_paper(capsys):
    """DeiT-Ti at 224: 5,717,416 parameters and 1.254 GMACs (timm's deit_tiny_patch16_224);
    with iRPE (contextual product on keys, shared head) beside the table: 5.76 M parameters."""
    code, out, err = run(
        capsys, "profile", "image/deit-tiny-imagenet", "--compare", "learned2d,irpe",
        "--sizes", "224", "--rounds", "1", "--min-time", "0.001", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["encoding"]: r for r in doc["results"]}
    assert doc["size_unit"] == "px" and rows["learned2d"]["points"][0]["tokens"] == 197
    assert rows["learned2d"]["parameters"] == 5_717_416
    assert rows["learned2d"]["points"][0]["macs"] == 1_253_683_200
    assert rows["irpe"]["parameters"] == 5_717_416 + 12 * 50 * 64  # 50 buckets x head_dim
    assert round(rows["irpe"]["parameters"] / 1e6, 2) == 5.76
    # q . r_b for every query, head and bucket in 12 layers
    assert rows["irpe"]["points"][0]["encoding_flops"] == 2 * 12 * 3 * 197 * 64 * 50


def test_full_scale_recipe_validates_without_its_data(capsys):
    runs = expand_sweep(load_recipe("image/deit-tiny-imagenet"))
    assert [r.encoding.name for _, r in runs] == ["learned2d", "irpe"]
    assert runs[0][1].train.epochs == 300 and runs[0][1].train.batch_size == 1024


@pytest.mark.skipif(not torchrun_available(), reason="torchrun not installed")
def test_two_process_ddp_image_run_on_cpu(tmp_path):
    path = write_recipe(tmp_path, **{"train.epochs": 1, "train.device": "cpu"})
    out = tmp_path / "ddp"
    summary = ddp_train([str(path)], out)
    assert summary["world_size"] == 2 and summary["final"]["epoch"] == 1
    assert (out / "eval.json").is_file()
