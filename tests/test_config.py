"""Recipes: shipped files, extends, overrides, sweeps, the encoding rule, one-line errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from posenc_cli.config import (
    Recipe,
    dump_recipe,
    expand_sweep,
    load_recipe,
    recipe_to_dict,
    shipped,
    shipped_recipes,
)
from posenc_cli.encodings import ENCODINGS
from posenc_cli.errors import UsageError
from posenc_cli.tasks.text.schema import DataConfig, EvalConfig, ModelConfig, TrainConfig

ONE_D = [name for name, cls in ENCODINGS.items() if cls.dims == 1]
BIDIRECTIONAL = [name for name in ONE_D if not ENCODINGS[name].causal_only]
SHIPPED = [
    "detection/coco-r50",
    "detection/shapes",
    "detection/shapes-dense",
    "detection/shapes-irpe",
    "image/base",
    "image/captions",
    "image/chirps",
    "image/deit-direction",
    "image/deit-mnist",
    "image/deit-mnist-irpe-on",
    "image/deit-tiny-imagenet",
    "image/encodings",
    "image/irpe-ablation",
    "image/irpe-ablation-table",
    "image/irpe-ablation-v",
    "image/mnist-resolution",
    "image/motion",
    "image/resolution",
    "image/sparse-windows",
    "quickstart",
    "text/base",
    "text/code-lm",
    "text/extrapolation",
    "text/length-gen/addition",
    "text/length-gen/base",
    "text/length-gen/copy",
    "text/length-gen/copy-randomized",
    "text/length-gen/parity",
    "text/length-gen/parity-curriculum",
    "text/length-gen/parity-long",
    "text/length-gen/parity-scratchpad",
    "text/length-gen/parity-uniform-ones",
    "text/length-gen/reverse",
    "text/length-gen/sort",
    "text/length-gen/summation",
    "text/length-gen/summation-curriculum",
    "text/length-gen/summation-curriculum-long",
    "text/length-gen/summation-long",
    "text/lm-adaptive",
    "text/lm-adaptive-shaw",
    "text/lm-extrapolation",
    "text/lm-linear",
    "text/lm-sparse",
    "text/shaw-clip",
    "text/t5-buckets",
    "text/word-order",
]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fails(ref, overrides=(), *needles: str) -> str:
    """The UsageError's message; it must be one line, start with the recipe, hold ``needles``."""
    with pytest.raises(UsageError) as caught:
        load_recipe(ref, list(overrides))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("recipe "), message
    for needle in needles:
        assert needle in message, message
    return message


def reload(recipe: Recipe, folder: Path, name: str = "resolved.yaml") -> Recipe:
    return load_recipe(write(folder, name, dump_recipe(recipe)))


# ----------------------------------------------------------------------------- shipped recipes


def test_the_shipped_recipes_are_the_ones_documented():
    assert sorted(shipped_recipes()) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_loads_expands_and_round_trips(name, tmp_path):
    recipe = load_recipe(name)
    assert recipe.source == name and recipe.notes == []
    runs = expand_sweep(recipe)
    sizes = [len(values) for values in (recipe.sweep or {}).values()]
    assert len(runs) == math.prod(sizes)
    assert len({run_name for run_name, _ in runs}) == len(runs)
    for _, run in runs:
        assert run.sweep is None
        assert ENCODINGS[run.encoding.name].dims == 1 or recipe.kind != "text"
    assert reload(recipe, tmp_path) == recipe
    assert reload(runs[-1][1], tmp_path) == runs[-1][1]


def test_shipped_sweeps_cover_what_they_promise():
    extrapolation = load_recipe("text/extrapolation")
    assert extrapolation.sweep == {"encoding.name": ONE_D, "seed": [0, 1, 2]}
    assert max(extrapolation.eval.lengths) == 4 * extrapolation.data.train_lengths[1]
    words = load_recipe("text/word-order")
    assert words.data.task == "word-order" and words.sweep["encoding.name"] == BIDIRECTIONAL
    shaw = load_recipe("text/shaw-clip")
    assert shaw.encoding.name == "shaw"
    assert shaw.sweep["encoding.max_distance"] == [0, 1, 2, 4, 8, 16, 64]
    t5 = load_recipe("text/t5-buckets")
    assert t5.encoding.name == "t5" and t5.sweep["encoding.num_buckets"] == [8, 16, 32, 64]
    lm = load_recipe("text/code-lm")
    context = lm.data.train_lengths
    assert lm.data.task == "text" and lm.encoding.name == "xl" and context[0] == context[1]
    assert lm.sweep == {"model.mem_len": [0, 128]}
    assert lm.eval.lengths == [context[1], 2 * context[1], 4 * context[1]]
    quick = load_recipe("quickstart")
    assert quick.sweep == {"encoding.name": ["none", "sinusoidal", "rope", "alibi", "t5"]}


def test_every_shipped_recipe_but_the_base_extends_it():
    files = shipped_recipes()
    for name in SHIPPED:
        raw = yaml.safe_load(files[name].read_text())
        if name.startswith("text/") and name != "text/base":
            # the length-generalisation base extends text/base from its subfolder; the linear
            # and sparse attention studies are the LM study with their own keys
            parents = {
                "text/length-gen/base": "../base.yaml",
                "text/length-gen/summation-long": "summation.yaml",
                "text/length-gen/summation-curriculum": "summation.yaml",
                "text/length-gen/summation-curriculum-long": "summation-curriculum.yaml",
                "text/length-gen/parity-long": "parity.yaml",
                "text/length-gen/parity-curriculum": "parity.yaml",
                "text/length-gen/parity-uniform-ones": "parity.yaml",
                "text/lm-linear": "lm-extrapolation.yaml",
                "text/lm-sparse": "lm-extrapolation.yaml",
            }
            assert raw["extends"] == parents.get(name, "base.yaml"), name


def test_the_linear_attention_study_is_the_lm_study_with_one_more_key():
    linear, lm = load_recipe("text/lm-linear"), load_recipe("text/lm-extrapolation")
    assert (linear.model, linear.data, linear.train, linear.eval) == (
        lm.model, lm.data, lm.train, lm.eval
    )  # fmt: skip
    assert linear.sweep == {
        "model.attention": ["softmax", "linear"],
        "encoding.name": ["none", "rope", "alibi", "t5"],
        "seed": [0, 1, 2],
    }


def test_the_sparse_attention_study_is_the_lm_study_under_a_window():
    sparse, lm = load_recipe("text/lm-sparse"), load_recipe("text/lm-extrapolation")
    assert (sparse.data, sparse.train, sparse.eval) == (lm.data, lm.train, lm.eval)
    assert dataclasses.replace(sparse.model, window=0) == lm.model
    assert sparse.model.window == 17 and set(sparse.sweep["encoding.name"]) == {"rope", "alibi"}


def test_length_generalisation_recipes_share_one_protocol():
    """Kazemnejad et al.'s sizes: trained on 1-20, tested to 40, every 1D encoding, 3 seeds,
    the same budget and early stop for all; each task recipe differs only in the task."""
    tasks = ["addition", "copy", "parity", "parity-scratchpad", "reverse", "sort", "summation"]
    randomized = load_recipe("text/length-gen/copy-randomized")
    assert randomized.model.random_positions == 256 and randomized.data.task == "copy"
    reading = {n for n in ONE_D if ENCODINGS[n].reads_positions}
    assert sorted(randomized.sweep["encoding.name"]) == sorted(reading)
    for task in tasks:
        recipe = load_recipe(f"text/length-gen/{task}")
        assert recipe.data.task == task and recipe.data.train_lengths == [1, 20]
        # every 1D encoding once, in the recipe's own order (slowest first, for --jobs)
        assert sorted(recipe.sweep["encoding.name"]) == sorted(ONE_D)
        assert recipe.sweep["seed"] == [0, 1, 2] and len(recipe.sweep) == 2
        assert max(recipe.eval.lengths) == 40 and 20 in recipe.eval.lengths
        assert recipe.train.stop_at == 0.99 and recipe.train.steps == 6000


@pytest.mark.parametrize("task", ["summation", "parity"])
def test_the_long_studies_are_their_task_with_three_times_the_cap(task):
    long = load_recipe(f"text/length-gen/{task}-long")
    short = load_recipe(f"text/length-gen/{task}")
    assert (long.model, long.data, long.eval) == (short.model, short.data, short.eval)
    assert dataclasses.replace(long.train, steps=6000) == short.train
    assert long.train.steps == 18000
    assert long.sweep == {
        "encoding.name": ["none", "t5", "alibi", "rope", "learned", "sinusoidal"],
        "seed": [0, 1, 2],
    }


def test_checkouts_fall_back_to_the_recipes_folder(monkeypatch):
    def no_package(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(shipped.resources, "files", no_package)
    assert sorted(shipped_recipes()) == SHIPPED
    assert (Path(shipped.__file__).parents[2] / "recipes" / "__init__.py").is_file()


def test_loading_leaves_the_callers_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_recipe("text/extrapolation")  # builds every run's encoding to check it
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------------------- defaults, extends


def test_a_recipe_of_empty_sections_gives_the_documented_defaults(tmp_path):
    recipe = load_recipe(write(tmp_path, "bare.yaml", "model: {}\n"))
    assert recipe == Recipe()
    assert recipe.model == ModelConfig(dim=64, depth=2, heads=4, mlp_ratio=4.0, mem_len=0)
    assert recipe.data == DataConfig(task="copy", vocab=16, train_lengths=[5, 20], corpus=None)
    assert recipe.train == TrainConfig(steps=1000, batch_size=32, lr=3e-4, warmup=100)
    assert recipe.eval == EvalConfig(lengths=[10, 20, 40], batches=8, shift=0)
    assert (recipe.encoding.name, recipe.encoding.params, recipe.sweep) == ("rope", {}, None)


def test_extends_chain_merges_key_by_key_deepest_first(tmp_path):
    write(tmp_path, "lib/c.yaml", "train: {steps: 10, lr: 1e-3}\nmodel: {dim: 32}\n")
    write(tmp_path, "lib/b.yaml", "extends: c.yaml\ntrain: {steps: 20}\n")
    top = write(tmp_path, "a.yaml", "extends: lib/b.yaml\nmodel: {depth: 3}\n")
    recipe = load_recipe(top)
    assert (recipe.train.steps, recipe.train.lr) == (20, 1e-3)
    assert (recipe.model.dim, recipe.model.depth, recipe.model.heads) == (32, 3, 4)


@pytest.mark.parametrize("ref", ["text/shaw-clip", "text/shaw-clip.yaml"])
def test_a_user_recipe_extends_a_shipped_one_by_short_name(tmp_path, ref):
    mine = write(tmp_path, "mine.yaml", f"extends: {ref}\ntrain: {{steps: 7}}\n")
    recipe = load_recipe(mine)
    shipped = load_recipe("text/shaw-clip")
    assert recipe.train.steps == 7 and shipped.train.steps != 7
    assert recipe.encoding == shipped.encoding and recipe.sweep == shipped.sweep


def test_extends_cycles_are_errors(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    fails(tmp_path / "a.yaml", (), "extends", "cycle", "a.yaml", "b.yaml")
    fails(write(tmp_path, "self.yaml", "extends: self.yaml\n"), (), "extends: cycle")


def test_a_missing_parent_or_recipe_is_named_with_a_close_match(tmp_path):
    fails(write(tmp_path, "a.yaml", "extends: text/bsae\n"), (), "extends", "'text/base'")
    fails(tmp_path / "nope.yaml", (), "nope.yaml", "no such file")
    fails("text/extrapolatoin", (), "did you mean 'text/extrapolation'")


def test_an_error_in_a_parent_names_the_file_that_set_it(tmp_path):
    write(tmp_path, "base.yaml", "train: {lr: fast}\n")
    message = fails(write(tmp_path, "top.yaml", "extends: base.yaml\n"), (), "train.lr")
    assert message.startswith("recipe ") and "top.yaml" in message
    assert "set in" in message and "base.yaml" in message


def test_yaml_syntax_errors_give_the_line(tmp_path):
    bad = write(tmp_path, "bad.yaml", "model:\n  dim: 64\n depth: 2\n")
    fails(bad, (), "line 3", "YAML syntax error")
    write(tmp_path, "bad_base.yaml", "train: [1, 2\n")
    fails(write(tmp_path, "top.yaml", "extends: bad_base.yaml\n"), (), "bad_base.yaml", "line 2")


def test_corpus_paths_are_relative_to_the_file_that_sets_them(tmp_path, monkeypatch):
    corpus = write(tmp_path, "data/corpus.txt", "hello")
    recipe_file = write(tmp_path, "data/r.yaml", "data: {task: text, corpus: corpus.txt}\n")
    monkeypatch.chdir(tmp_path)
    assert load_recipe(recipe_file).data.corpus == str(corpus)
    # an override is relative to the working directory
    assert load_recipe(recipe_file, ["data.corpus=data"]).data.corpus == str(tmp_path / "data")


# ----------------------------------------------------------------------------- overrides


def test_overrides_convert_by_the_declared_type():
    recipe = load_recipe(
        "text/base",
        [
            "train.lr=3e-4",
            "seed=3",
            "model.mlp_ratio=2",
            "eval.lengths=[8, 16]",
            "train.device=cpu",
        ],
    )
    assert recipe.train.lr == 3e-4 and isinstance(recipe.train.lr, float)
    assert recipe.seed == 3 and isinstance(recipe.seed, int)
    assert recipe.model.mlp_ratio == 2.0 and isinstance(recipe.model.mlp_ratio, float)
    assert recipe.eval.lengths == [8, 16] and recipe.train.device == "cpu"
    rope = load_recipe("text/base", ["encoding.base=500"])
    assert rope.encoding.params == {"base": 500.0} and isinstance(
        rope.encoding.params["base"], float
    )


def test_sweep_null_gives_one_run():
    recipe = load_recipe("text/extrapolation", ["sweep=null"])
    assert recipe.sweep is None
    [(name, run)] = expand_sweep(recipe)
    assert name == "run" and run == recipe


def test_an_override_fixes_a_swept_key():
    recipe = load_recipe("text/extrapolation", ["seed=3"])
    assert recipe.sweep == {"encoding.name": ONE_D}
    assert {run.seed for _, run in expand_sweep(recipe)} == {3}
    rope = load_recipe("text/extrapolation", ["encoding.name=rope"])
    assert rope.sweep == {"seed": [0, 1, 2]}
    assert {run.encoding.name for _, run in expand_sweep(rope)} == {"rope"}


def test_sweep_axes_can_be_added_and_removed_by_override():
    recipe = load_recipe("text/base", ["sweep.train.lr=[1e-3, 3e-4]", "sweep.seed=[0, 1]"])
    assert recipe.sweep == {"train.lr": [1e-3, 3e-4], "seed": [0, 1]}
    assert load_recipe("text/extrapolation", ["sweep.seed=null"]).sweep == {"encoding.name": ONE_D}


# ----------------------------------------------------------------------------- encoding rule


@pytest.fixture
def rope500(tmp_path) -> Path:
    return write(tmp_path, "rope500.yaml", "encoding: {name: rope, base: 500}\n")


def test_a_name_change_keeps_only_the_parameters_the_new_encoding_has(tmp_path, rope500):
    alibi = load_recipe(write(tmp_path, "a.yaml", "extends: rope500.yaml\nencoding: {name: alibi}"))
    assert alibi.encoding.params == {}
    assert len(alibi.notes) == 1 and "encoding.base" in alibi.notes[0]
    assert "alibi" in alibi.notes[0] and "rope500.yaml" in alibi.notes[0]
    assert "# note: encoding.base" in dump_recipe(alibi)
    sinusoidal = load_recipe(rope500, ["encoding.name=sinusoidal"])
    assert sinusoidal.encoding.params == {"base": 500.0} and sinusoidal.notes == []
    same = load_recipe(rope500, ["encoding.name=rope", "encoding.fraction=0.5"])
    assert same.encoding.params == {"base": 500.0, "fraction": 0.5}


def test_parameters_beside_the_name_are_checked_strictly(rope500):
    message = fails(rope500, ["encoding.name=alibi", "encoding.base=3"], "encoding.base", "'alibi'")
    assert "set by an override" in message
    fails(rope500, ["encoding.max_distance=3"], "encoding.max_distance", "'rope'")


def test_null_removes_an_encoding_parameter(rope500):
    assert load_recipe(rope500, ["encoding.base=null"]).encoding.params == {}


def test_a_sweep_over_names_drops_parameters_a_run_encoding_lacks(rope500, tmp_path):
    recipe = load_recipe(rope500, ["sweep.encoding.name=[rope, alibi]"])
    runs = dict(expand_sweep(recipe))
    assert runs["encoding.name=rope"].encoding.params == {"base": 500.0}
    alibi = runs["encoding.name=alibi"]
    assert alibi.encoding.params == {} and "encoding.base" in alibi.notes[0]
    assert "# note: encoding.base" in dump_recipe(alibi)
    assert reload(alibi, tmp_path) == alibi


def test_a_swept_parameter_applies_to_the_runs_that_have_it():
    recipe = load_recipe(
        "text/base", ["sweep.encoding.name=[shaw, alibi]", "sweep.encoding.max_distance=[2, 8]"]
    )
    runs = dict(expand_sweep(recipe))
    assert runs["encoding.name=shaw,encoding.max_distance=8"].encoding.params == {"max_distance": 8}
    alibi = runs["encoding.name=alibi,encoding.max_distance=2"]
    assert alibi.encoding.params == {} and "max_distance" in alibi.notes[0]
    message = fails("text/shaw-clip", ["encoding.name=alibi"], "sweep.encoding.max_distance")
    assert "sweep.encoding.max_distance=null" in message


# ----------------------------------------------------------------------------- sweeps, dumps


def test_sweep_order_names_and_values():
    recipe = load_recipe(
        "text/base", ["sweep.encoding.name=[rope, alibi]", "sweep.train.lr=[1e-3, 3e-4]"]
    )
    runs = expand_sweep(recipe)
    assert [name for name, _ in runs] == [
        "encoding.name=rope,train.lr=0.001",
        "encoding.name=rope,train.lr=0.0003",
        "encoding.name=alibi,train.lr=0.001",
        "encoding.name=alibi,train.lr=0.0003",
    ]
    assert [(r.encoding.name, r.train.lr) for _, r in runs] == [
        ("rope", 1e-3),
        ("rope", 3e-4),
        ("alibi", 1e-3),
        ("alibi", 3e-4),
    ]
    assert all(run.sweep is None and run.model == recipe.model for _, run in runs)


def test_a_recipe_without_sweep_is_one_run_named_run():
    recipe = load_recipe("text/base")
    assert expand_sweep(recipe) == [("run", recipe)]


def test_dump_and_load_round_trip(tmp_path, rope500):
    recipe = load_recipe(
        rope500,
        ["train.lr=2e-4", "eval.shift=5", "sweep.seed=[0, 1]", "sweep.encoding.fraction=[0.5, 1]"],
    )
    text = dump_recipe(recipe)
    assert yaml.safe_load(text) == recipe_to_dict(recipe)
    assert recipe_to_dict(recipe)["encoding"] == {"name": "rope", "base": 500.0}
    again = reload(recipe, tmp_path)
    assert again == recipe and expand_sweep(again) == expand_sweep(recipe)
    for name, run in expand_sweep(recipe):
        assert reload(run, tmp_path, f"{name}.yaml") == run


# ----------------------------------------------------------------------------- bad input


BAD_OVERRIDES = [
    (["model.dimm=3"], "model.dimm", "did you mean 'dim'"),
    (["trian.lr=1"], "trian.lr", "did you mean 'train'"),
    (["train.lr=fast"], "train.lr", "expected float, got 'fast'"),
    (["model.depth=2.5"], "model.depth", "expected int"),
    (["seed=-1"], "seed", ">= 0"),
    (["train.steps=0"], "train.steps", ">= 1"),
    (["train.eval_every=0"], "train.eval_every", ">= 1"),
    (["model.dropout=1"], "model.dropout", "in [0, 1)"),
    (["data.val_fraction=0"], "data.val_fraction", "in (0, 1)"),
    (["eval.shift=-1"], "eval.shift", ">= 0"),
    (["train.batch_size=0"], "train.batch_size", ">= 1"),
    (["train.lr=0"], "train.lr", "> 0"),
    (["train.lr=-1e-3"], "train.lr", "> 0"),
    (["model.depth=0"], "model.depth", ">= 1"),
    (["model.heads=6"], "model.heads", "does not divide"),
    (["train.device=gpu"], "train.device", "'gpu' is not one of"),
    (["data.train_lengths=[20, 5]"], "data.train_lengths", "1 <= min <= max"),
    (["data.train_lengths=[0, 5]"], "data.train_lengths", "1 <= min <= max"),
    (["data.train_lengths=[5]"], "data.train_lengths", "[min, max]"),
    (["data.task=cpy"], "data.task", "did you mean 'copy'"),
    (["data.curriculum=-1"], "data.curriculum", ">= 0"),
    (["data.task=word-order", "data.curriculum=100"], "data.curriculum", "algorithmic task"),
    (["data.ones=uniform"], "data.ones", "parity tasks only"),
    (["data.task=parity", "data.ones=fair"], "data.ones", "'fair' is not one of"),
    (["eval.lengths=[]"], "eval.lengths", "non-empty"),
    (["data.corpus=no/such/file.txt"], "data.corpus", "no such file"),
    (["data.task=word-order", "model.mem_len=16"], "model.mem_len", "language-model"),
    (["encoding.name=rop"], "encoding.name", "did you mean 'rope'"),
    (["encoding.name=swin"], "encoding.name", "2D"),
    (["encoding.bsae=3"], "encoding.bsae", "did you mean 'base'"),
    (["encoding.base=low"], "encoding.base", "expected float"),
    (["encoding.name=t5", "encoding.num_buckets=1"], "encoding", "num_buckets"),
    (["sweep.seed=[]"], "sweep.seed", "non-empty list"),
    (["sweep.seed=3"], "sweep.seed", "non-empty list"),
    (["sweep.seed=[1, 1]"], "sweep.seed", "twice"),
    (["sweep.model.dimm=[8]"], "sweep.model.dimm", "did you mean 'dim'"),
    (["sweep.train.lr=[fast]"], "sweep.train.lr", "expected float"),
    (["sweep=5"], "sweep", "mapping"),
    (["sweep.model.heads=[4, 6]"], "model.heads", "sweep run model.heads=6"),
    (["extends=x.yaml"], "extends", "cannot be overridden"),
    (["model=3"], "model", "model.KEY"),
    (["lr"], "KEY=VALUE", "recipe text/base"),
]


@pytest.mark.parametrize(("overrides", "key", "hint"), BAD_OVERRIDES)
def test_bad_overrides_give_one_line_naming_the_key(overrides, key, hint):
    message = fails("text/base", overrides, key, hint)
    assert message.startswith("recipe text/base: ")


BAD_FILES = [
    ("modle: {dim: 8}\n", "modle", "did you mean 'model'"),
    ("model: 8\n", "model", "mapping"),
    ("model: {dim: 64, heads: 3}\n", "model.heads", "does not divide"),
    ("- 1\n- 2\n", "recipe", "mapping"),
    ("sweep: {seed: []}\n", "sweep.seed", "non-empty list"),
    ("sweep: {sweep: [1]}\n", "sweep.sweep", "cannot be swept"),
    ("extends: 3\n", "extends", "shipped recipe name"),
]


@pytest.mark.parametrize(("text", "key", "hint"), BAD_FILES)
def test_bad_files_give_one_line_naming_the_key(tmp_path, text, key, hint):
    path = write(tmp_path, "bad.yaml", text)
    message = fails(path, (), key, hint)
    assert message.startswith(f"recipe {path}: ")


def test_a_key_yaml_reads_as_a_boolean_is_answered_with_the_fix(tmp_path):
    path = write(tmp_path, "on.yaml", "kind: image\nencoding:\n  name: irpe\n  on: qk\n")
    with pytest.raises(UsageError, match='quote it, e.g. "on": qk'):
        load_recipe(path)
