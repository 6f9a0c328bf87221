"""Numbers per encoding for the selection table, from studies (run or sweep directories, one
``posenc compare`` each) and a profile (``posenc profile --format json`` or its profile.json).

- extrapolation: a study's metric at the largest evaluated length up to 4x the trained one,
  against 1x (the longest trained length, or the trained image side);
- compute and memory: time and peak-memory ratios to ``none`` at the largest size profiled;
- long sequences: the profile's growth exponents of time and memory;
- training stability: the seed spread at 1x and the share of runs that diverged;
- implementation complexity: ``code_size``'s lines and attention path;
- multimodal fit: the dimensions it serves, and its counterpart for the other one.

A study's metric is perplexity for a character LM (the ALiBi paper's), else its task's first
metric (token accuracy, top-1, AP). Only the groups that are an encoding at its defaults enter
the table; a study that sweeps other settings is left to ``compare``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc_cli.compare import LOWER_IS_BETTER, compare, metrics_of, read_runs, study_name
from posenc_cli.encodings import ENCODINGS, encoding_class
from posenc_cli.errors import UsageError
from posenc_cli.report import article
from posenc_cli.report.code_size import attention_path, encoding_lines
from posenc_cli.tasks import task_of

SCHEMA = "posenc.report/1"
PROFILE_SCHEMA = "posenc.profile/1"
MOST_MULTIPLE = 4.0  # the "4x against 1x"; a study that stops short uses its largest

# the same idea in the other dimension: what a researcher moving from text to images uses
COUNTERPART = {
    "sinusoidal": "sincos2d",
    "learned": "learned2d",
    "rope": "rope2d",
    "t5": "swin",  # a learned bias per bucketed offset
    "shaw": "irpe",  # a learned vector per bucketed offset, on q.k and the values
}
COUNTERPART.update({two: one for one, two in list(COUNTERPART.items())})


@dataclass
class Study:
    path: Path
    kind: str
    task: str
    metric: str
    trained: int | None  # 1x: the longest trained length or the trained image side
    result: dict[str, Any]

    @property
    def name(self) -> str:
        return study_name(self.path)

    @property
    def lower_is_better(self) -> bool:
        return self.metric in LOWER_IS_BETTER

    @property
    def language_model(self) -> bool:
        return models_running_text(self.kind, self.task)

    @property
    def multimodal(self) -> bool:
        """Whether its task answers the article's multimodal advice (images, clips)."""
        return task_of(self.kind).multimodal


def models_running_text(kind: str, task: str) -> bool:
    """Whether a study's runs are language models on running text, as its task says."""
    return task in task_of(kind).language_modelling


def read_study(path: Path, **options: Any) -> Study:
    """A study and its ``compare`` result (``options`` go to ``compare``: fitted_at, ...)."""
    runs = read_runs([path])
    result = compare([path], runs=runs, **options)
    evaluated = runs[0]
    sample = evaluated[0][1] if evaluated else {}
    kind = result["kind"]
    task = sample.get("task") or sample.get("dataset") or kind
    metric = "perplexity" if models_running_text(kind, task) else metrics_of(kind)[0]
    lengths = sample.get("train_lengths")
    trained = lengths[-1] if lengths else sample.get("trained_size")
    return Study(path, kind, str(task), metric, trained, result)


def encoding_groups(study: Study) -> dict[str, dict[str, Any]]:
    """The study's groups by encoding name: an encoding at its defaults, or with parameters of
    its own (``rope2d(variant=mixed)``) where the study holds that encoding only once. Groups
    that also sweep other settings are left to ``compare``."""
    named: dict[str, dict[str, dict[str, Any]]] = {}  # name -> {label: group}
    for label, group in study.result["groups"].items():
        name = label.split("(", 1)[0]
        if " " not in label and name in ENCODINGS:
            named.setdefault(name, {})[label] = group
    out = {}
    for name, groups in named.items():
        if name in groups:  # the defaults, when the study has them
            out[name] = groups[name]
        elif len(groups) == 1:
            out[name] = next(iter(groups.values()))
    return out


def cell_mean(group: dict[str, Any], length: int, metric: str) -> dict[str, Any] | None:
    return group["lengths"].get(str(length), {}).get(metric)


def extrapolation(study: Study, group: dict[str, Any]) -> dict[str, Any] | None:
    """The metric at 1x and at the largest evaluated length <= 4x (past 1x)."""
    if not study.trained:
        return None
    base = cell_mean(group, study.trained, study.metric)
    sizes = sorted(int(n) for n in group["lengths"] if n.isdigit())
    past = [n for n in sizes if study.trained < n <= MOST_MULTIPLE * study.trained]
    if base is None or not past or cell_mean(group, past[-1], study.metric) is None:
        return None
    far = cell_mean(group, past[-1], study.metric)
    ratio = far["mean"] / base["mean"] if base["mean"] else None
    return {
        "multiple": past[-1] / study.trained,
        "length": past[-1],
        "at_1x": base["mean"],
        "at_kx": far["mean"],
        "ratio": ratio,  # kx / 1x: near 1 holds up; for perplexity above 1 is worse
    }


def stability(study: Study, group: dict[str, Any]) -> dict[str, Any]:
    base = cell_mean(group, study.trained, study.metric) if study.trained else None
    return {
        "sd_at_1x": None if base is None else base["std"],
        "seeds": len(group["seeds"]),
        "diverged": len(group.get("diverged", [])),
    }


def read_profile(path: Path) -> dict[str, Any]:
    fix = "give the profile.json that `posenc profile --out DIR` writes"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"--profile {path}: cannot read it as JSON ({err}); {fix}") from None
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise UsageError(f"--profile {path}: not a posenc profile ({PROFILE_SCHEMA}); {fix}")
    return doc


def profile_costs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per encoding: ratios to none at the largest size it ran, and the growth exponents."""
    costs = {}
    for r in doc.get("results", []):
        good = [p for p in r.get("points", []) if p.get("error") is None]
        last = good[-1] if good else {}
        costs[r["encoding"]] = {
            "time_ratio": last.get("time_ratio"),
            "memory_ratio": last.get("memory_ratio"),
            "at_size": last.get("size"),
            "time_exponent": r.get("time_exponent"),
            "memory_exponent": r.get("memory_exponent"),
            "encoding_parameters": r.get("encoding_parameters"),
            "fails_from": next((p["size"] for p in r.get("points", []) if p.get("error")), None),
        }
    return costs


def encoding_row(name: str, studies: list[Study], costs: dict[str, Any]) -> dict[str, Any]:
    cls = encoding_class(name)
    per_study = {}
    for study in studies:
        group = encoding_groups(study).get(name)
        if group is not None:
            per_study[study.name] = {
                "extrapolation": extrapolation(study, group),
                "stability": stability(study, group),
            }
    runs = sum(s["stability"]["seeds"] + s["stability"]["diverged"] for s in per_study.values())
    diverged = sum(s["stability"]["diverged"] for s in per_study.values())
    counterpart = COUNTERPART.get(name)
    dims = [cls.dims] + ([encoding_class(counterpart).dims] if counterpart else [])
    return {
        "encoding": name,
        "family": cls.family,
        "article_family": article.FAMILY.get(name),
        "studies": per_study,
        "cost": costs.get(name),
        "diverged": {
            "runs": runs,
            "diverged": diverged,
            "share": diverged / runs if runs else None,
        },
        "implementation": {"lines": encoding_lines(name), "attention": attention_path(cls)},
        "multimodal": {"dims": dims, "counterpart": counterpart},  # its own first
        "article": {row: article.says(name, row) for row in article.ROWS},
    }


def build_report(paths: list[Path], profile: Path | None) -> dict[str, Any]:
    """The whole report document (``SCHEMA``); scenario advice included."""
    from posenc_cli.report.advice import scenarios

    studies = [read_study(p) for p in paths]
    costs = profile_costs(read_profile(profile)) if profile is not None else {}
    seen = [n for s in studies for n in encoding_groups(s)] + list(costs)
    names = [n for n in ENCODINGS if n in seen]  # registry order
    report = {
        "schema": SCHEMA,
        "profile": None if profile is None else str(profile),
        "studies": [
            {
                "name": s.name,
                "path": str(s.path),
                "kind": s.kind,
                "task": s.task,
                "metric": s.metric,
                "lower_is_better": s.lower_is_better,
                "trained": s.trained,
                "encodings": list(encoding_groups(s)),
            }
            for s in studies
        ],
        "encodings": [encoding_row(n, studies, costs) for n in names],
    }
    report["scenarios"] = scenarios(report, studies)
    return report
