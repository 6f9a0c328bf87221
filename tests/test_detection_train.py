"""Detection experiments end to end: recipes of kind detection, a procedural shapes set written
in COCO format, training DETR-lite, COCO AP from pycocotools, the prediction picture, comparison
over seeds, resume, and ``posenc profile`` on DETR-lite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from posenc_cli.config import dump_recipe, expand_sweep, load_recipe
from posenc_cli.errors import UsageError
from posenc_cli.tasks.detection.train import train_detection
from tests.helpers import ddp_train, run, torchrun_available

TINY = {
    "kind": "detection",
    "seed": 0,
    "model": {
        "dim": 16,
        "heads": 2,
        "enc_layers": 1,
        "dec_layers": 2,
        "num_queries": 6,
        "backbone_stride": 16,
    },
    "encoding": {"name": "irpe"},
    "data": {"root": "shapes", "image_size": 64, "shapes_images": 15, "shapes_max_objects": 2},
    "train": {"epochs": 2, "batch_size": 6, "lr": 1e-4},
    "eval": {"batch_size": 8, "pictures": 2},
}


def write_recipe(tmp_path: Path, **changes) -> Path:
    tree = json.loads(json.dumps(TINY))
    tree["data"]["root"] = str(tmp_path / "shapes")
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if name:
            tree.setdefault(section, {})[name] = value
        else:
            tree[section] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_detection_recipe_round_trips(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, sweep={"model.sine": [False, True]}))
    assert recipe.kind == "detection" and recipe.model.backbone == "resnet18"
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(dump_recipe(recipe))
    assert load_recipe(dumped) == recipe
    assert len(expand_sweep(recipe)) == 2


@pytest.mark.parametrize(
    "change, words",
    [
        ({"encoding.name": "rope"}, "sequences"),  # a 1D encoding in a 2D encoder
        ({"encoding.name": "sincos2d"}, "model.sine"),  # the sine twice
        ({"model.backbone": "resnet20"}, "model.backbone"),
        ({"model.backbone_stride": 4}, "model.backbone_stride"),
        ({"model.heads": 3}, "model.heads"),
        ({"train.eos_coef": 0}, "train.eos_coef"),
        ({"data.vocab": 3}, "data.vocab"),
    ],
)
def test_bad_detection_recipes_name_the_problem(tmp_path, change, words):
    with pytest.raises(UsageError) as err:
        load_recipe(write_recipe(tmp_path, **change))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_train_evaluate_and_compare_detection(capsys, tmp_path):
    path = write_recipe(tmp_path, sweep={"seed": [0, 1]}, **{"train.epochs": 1})
    code, out, err = run(capsys, "train", str(path), "--out", str(tmp_path / "runs"))
    assert code == 0, err
    assert "AP" in out
    run_dir = tmp_path / "runs" / "seed=0"
    assert (tmp_path / "shapes" / "annotations" / "instances_val.json").is_file()
    scores = json.loads((run_dir / "eval.json").read_text())["lengths"]["val"]
    assert {"AP", "AP50", "AP75", "loss"} <= set(scores)
    assert all(0.0 <= scores[k] <= 100.0 for k in ("AP", "AP50", "AP75"))
    assert (run_dir / "predictions.png").read_bytes()[:4] == b"\x89PNG"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "val_AP" in metrics[-1] and metrics[-1]["epoch"] == 1
    code, out, _ = run(capsys, "compare", str(tmp_path / "runs"), "--format", "json")
    result = json.loads(out)
    assert result["kind"] == "detection" and result["groups"]["irpe"]["seeds"] == [0, 1]
    code, out, err = run(capsys, "evaluate", str(run_dir), "--format", "json")
    assert code == 0 and json.loads(out)["lengths"]["val"] == scores


def test_a_resumed_detection_run_ends_like_the_uninterrupted_one(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path))
    whole = train_detection(recipe, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train_detection(recipe, tmp_path / "parts", interrupt_at=3)  # 2 steps an epoch
    resumed = train_detection(recipe, tmp_path / "parts", resume=True)
    speed = "images_per_s"  # a timing, not a result
    final = {k: v for k, v in resumed["final"].items() if k != speed}
    assert final == pytest.approx({k: v for k, v in whole["final"].items() if k != speed})


def test_profile_runs_on_detr_lite(capsys, tmp_path):
    code, out, err = run(
        capsys, "profile", str(write_recipe(tmp_path)), "--compare", "none,rope2d,irpe",
        "--sizes", "64,128", "--rounds", "1", "--min-time", "0.001", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["encoding"]: r for r in doc["results"]}
    assert [p["tokens"] for p in rows["irpe"]["points"]] == [16, 64]  # stride 16: 4x4, 8x8
    assert rows["none"]["encoding_parameters"] == 0 and rows["irpe"]["encoding_parameters"] > 0
    assert rows["irpe"]["points"][1]["encoding_flops"] > 0  # q . r per bucket
    assert all(p["flops"] > 0 and p["peak_bytes"] > 0 for r in rows.values() for p in r["points"])


def test_shipped_detection_recipes_validate():
    shapes = expand_sweep(load_recipe("detection/shapes"))
    settings = {(r.model.sine, r.encoding.name) for _, r in shapes}
    assert {(False, "none"), (True, "none"), (True, "irpe"), (False, "rope2d")} <= settings
    coco = expand_sweep(load_recipe("detection/coco-r50"))
    assert {r.encoding.name for _, r in coco} == {"none", "irpe"}
    assert all(r.model.backbone == "resnet50" and r.model.sine for _, r in coco)


@pytest.mark.skipif(not torchrun_available(), reason="torchrun not installed")
def test_two_process_ddp_detection_run_on_cpu(tmp_path):
    path = write_recipe(tmp_path, **{"train.epochs": 1, "train.device": "cpu"})
    out = tmp_path / "ddp"
    summary = ddp_train([str(path)], out)
    assert summary["world_size"] == 2 and summary["final"]["epoch"] == 1
    assert (out / "eval.json").is_file()


def test_a_sweep_in_two_processes_finishes_every_run(capsys, tmp_path):
    """``--jobs 2``: the shapes set is written once before the workers start (two runs writing
    it at once would race), and every run is trained and evaluated in its own process."""
    path = write_recipe(tmp_path, sweep={"model.sine": [False, True]}, **{"train.epochs": 1})
    out = tmp_path / "runs"
    code, stdout, err = run(capsys, "train", str(path), "--out", str(out), "--jobs", "2")
    assert code == 0, err
    assert "2 runs in 2 processes" in err and "AP" in stdout
    assert "1/2 finished model.sine=" in err and "2/2 finished model.sine=" in err  # no bar
    assert json.loads((out / "sweep.json").read_text())["runs"] == [
        "model.sine=false",
        "model.sine=true",
    ]
    for name in ("model.sine=false", "model.sine=true"):
        assert (out / name / "eval.json").is_file()
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["threads"] == max(1, torch.get_num_threads() // 2)  # each worker's share
    # finished runs are kept on --resume, and a bad --jobs is a one-line error
    code, _, err = run(capsys, "train", str(path), "--out", str(out), "--jobs", "2", "--resume")
    assert code == 0 and err.count("finished earlier") == 2
    code, _, err = run(capsys, "train", str(path), "--jobs", "0")
    assert code == 2 and "--jobs 0" in err and "Traceback" not in err
