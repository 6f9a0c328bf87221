"""Compare runs: mean and spread over seeds for every metric and every evaluated length.

Runs are grouped by everything that is not the seed (encoding and the swept settings); each
group's figures are the mean and sample standard deviation over its seeds. The best mean per
column is marked. A sweep's output directory stands for all the runs below it.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc_cli.errors import UsageError
from posenc_cli.params import close_match
from posenc_cli.results_file import read as read_results_file
from posenc_cli.runs.directory import DIVERGED
from posenc_cli.runs.evaluation import natural_key
from posenc_cli.statistics import ALPHA, MOST_SEEDS, adjusted, ci95, paired, welch
from posenc_cli.tasks import DEFAULT_KIND, TASKS, task_of

LOWER_IS_BETTER = {"loss", "perplexity"}
# what a metric can take: fractions, percentages, or anything from 0 up (loss, perplexity)
PERCENT = {"top1", "top5", "AP", "AP50", "AP75", "APs", "APm", "APl"}
FRACTION = {"token_accuracy", "exact_match"}


def metric_range(metric: str) -> tuple[float, float]:
    """The values ``metric`` can take; a t-based interval over few seeds can reach past them."""
    if metric in FRACTION:
        return 0.0, 1.0
    if metric in PERCENT:
        return 0.0, 100.0
    return 0.0, float("inf")


Run = tuple[str, dict[str, Any]]  # a run's folder name and its evaluation or divergence record


def metrics_of(kind: str) -> tuple[str, ...]:
    return task_of(kind).metrics


def all_metrics() -> list[str]:
    """Every task's metrics, each once."""
    return list(dict.fromkeys(m for task in TASKS.values() for m in task.metrics))


def run_folders(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The evaluated runs (``eval.json``) and the diverged ones (``diverged.json``) below
    ``paths``, each tree walked once; a path with neither is one line with the fix."""
    evaluated: list[Path] = []
    diverged: list[Path] = []
    markers = {"eval.json": evaluated, DIVERGED: diverged}
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such run or sweep directory")
        if not path.is_dir():
            raise UsageError(
                f"{path}: a file, not a run or sweep directory (nor a results file `posenc "
                f"export` wrote); give its folder, {path.parent}"
            )
        here = {name: [path] for name in markers if (path / name).is_file()}
        if not here:  # a sweep: the runs below it
            for found in sorted(path.rglob("*.json")):
                if found.name in markers:
                    here.setdefault(found.name, []).append(found.parent)
        if not here:
            raise UsageError(
                f"{path}: holds no evaluated run (no eval.json); run `posenc "
                f"train` or `posenc evaluate` first"
            )
        for name, folders in here.items():
            markers[name] += folders
    return evaluated, diverged


def read_runs(paths: list[Path]) -> tuple[list[Run], list[Run]]:
    """Every run below ``paths`` as (folder name, record): the evaluated ones and the diverged
    ones, from run and sweep directories or from results files (``posenc export``)."""
    evaluated: list[Run] = []
    diverged: list[Run] = []
    for path in paths:
        from_file = read_results_file(path)
        if from_file is not None:
            found = [(e["name"], e["evaluation"]) for e in from_file[0]]
            stopped = [(e["name"], e["record"]) for e in from_file[1]]
        else:
            folders, dead = run_folders([path])
            found = [(f.name, read_evaluation(f / "eval.json")) for f in folders]
            stopped = [(f.name, read_divergence(f / DIVERGED)) for f in dead]
        evaluated += found
        diverged += stopped
    return evaluated, diverged


def study_name(path: Path) -> str:
    """A sweep directory's name, or a results file's without ``.json``."""
    return path.stem if path.is_file() else path.name


def read_studies(paths: list[Path]) -> list[tuple[str, tuple[list[Run], list[Run]]]]:
    """Each path's runs under its study name, so that two sweeps of the same encodings (copy
    and copy with randomized positions, say) stay apart."""
    return [(study_name(path), read_runs([path])) for path in paths]


def studies_overlap(studies: list[tuple[str, tuple[list[Run], list[Run]]]]) -> bool:
    """Whether one setting and seed was run in more than one study: then a group is a setting
    within a study, ``rope [copy-randomized]``, not the runs of both pooled."""
    owners: dict[tuple[str, int], str] = {}
    for study, (evaluated, stopped) in studies:
        for name, record in [*evaluated, *stopped]:
            key = (group_label(record, name), record["seed"])
            if owners.setdefault(key, study) != study:
                return True
    return False


def refuse_repeated_seeds(by_group: dict[str, list[dict]]) -> None:
    """A seed counted twice would pose as two samples of one setting."""
    for label, results in by_group.items():
        seeds = [r["seed"] for r in results]
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise UsageError(
                f"{label}: seed {repeated[0]} appears {seeds.count(repeated[0])} times among "
                "these runs (the same study given twice, or two sweeps below one folder?); "
                "give each sweep once, as its own argument"
            )


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def well_formed(result: Any) -> bool:
    """The shape compare reads: the encoding, the seed, and per length a dict of numbers (or an
    ``error`` text)."""
    if not isinstance(result, dict) or not isinstance(result.get("lengths"), dict):
        return False
    known = set(all_metrics())
    cells_ok = all(
        isinstance(c, dict)
        and all(is_number(v) for k, v in c.items() if k in known)
        and isinstance(c.get("error", ""), str)
        for c in result["lengths"].values()
    )
    train = result.get("train_lengths")
    return (
        cells_ok
        and isinstance(result.get("encoding"), str)
        and isinstance(result.get("seed"), int)
        and isinstance(result.get("encoding_params", {}), dict)
        and result.get("kind", DEFAULT_KIND) in TASKS
        and (train is None or (isinstance(train, list) and all(is_number(n) for n in train)))
    )


def read_evaluation(path: Path) -> dict[str, Any]:
    """A run's eval.json; a damaged one (cut short, emptied, edited) is one line with the fix."""
    fix = f"re-run `posenc evaluate {path.parent}` to write it again"
    try:
        result = json.loads(path.read_text())
    except ValueError:  # not JSON, or not text at all
        raise UsageError(f"{path}: damaged (not valid JSON, e.g. cut short); {fix}") from None
    if not well_formed(result):
        raise UsageError(
            f"{path}: damaged (valid JSON, but not an evaluation posenc writes); {fix}"
        )
    return result


def divergence_ok(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("encoding"), str)
        and isinstance(record.get("seed"), int)
        and isinstance(record.get("encoding_params", {}), dict)
    )


def read_divergence(path: Path) -> dict[str, Any]:
    """A ``diverged.json`` a sweep wrote; damaged, it is one line naming the file."""
    try:
        record = json.loads(path.read_text())
    except ValueError:
        record = None
    if not divergence_ok(record):
        raise UsageError(f"{path}: damaged; delete it and train that run again to record it")
    return record


def group_label(result: dict[str, Any], run_name: str) -> str:
    """The encoding with its parameters, plus any other swept setting named in the run's
    directory (a sweep names runs ``key=value,key=value``); the seed is what varies inside."""
    params = ",".join(f"{k}={v}" for k, v in sorted(result.get("encoding_params", {}).items()))
    label = result["encoding"] + (f"({params})" if params else "")
    swept = [
        part
        for part in run_name.split(",")
        if "=" in part and not part.startswith(("seed=", "encoding."))
    ]
    return " ".join([label, *swept])


def summarise(values: list[float], seeds: list[int]) -> dict[str, Any]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "ci95": ci95(values),  # half-width; None for one seed
        "n": len(values),
        "values": values,  # one per seed, for the tests against a baseline
        "seeds": seeds,  # the seed of each value, for the paired test
    }


def compare(
    paths: list[Path],
    baseline: str | None = None,
    fitted_at: float | None = None,
    fit_metric: str | None = None,
    adjust: str | None = None,
    runs: tuple[list[Run], list[Run]] | None = None,
) -> dict[str, Any]:
    """``{"groups": {label: {length: {metric: {mean, std, ci95, n, values}}}}, "best": {...}}``;
    with ``baseline`` (a group label) every other group's cells gain ``vs_baseline``; with
    ``fitted_at`` every group gains ``fitted``: its runs whose ``fit_metric`` (the kind's first
    metric by default) reached that value at the longest trained length. ``runs`` are
    ``read_runs(paths)`` where the caller has read them already."""
    by_group: dict[str, list[dict]] = defaultdict(list)
    diverged: dict[str, list[int]] = defaultdict(list)
    study_of: dict[str, str] = {}
    studies = read_studies(paths) if runs is None else [("", runs)]
    qualify = studies_overlap(studies)
    for study, (evaluated, stopped) in studies:
        suffix = f" [{study}]" if qualify else ""
        for name, result in evaluated:
            label = group_label(result, name) + suffix
            by_group[label].append(result)
            study_of[label] = study
        for name, record in stopped:
            label = group_label(record, name) + suffix
            diverged[label].append(record["seed"])
            by_group.setdefault(label, [])
            study_of[label] = study
    refuse_repeated_seeds(by_group)
    groups: dict[str, dict] = {}
    lengths: set[str] = set()
    kinds = {r.get("kind", DEFAULT_KIND) for results in by_group.values() for r in results}
    if not kinds and diverged:
        raise UsageError(
            f"every run below {', '.join(map(str, paths))} diverged ({DIVERGED}); nothing to "
            "compare: lower train.lr (or train.grad_clip) and train again"
        )
    if len(kinds) > 1:
        raise UsageError(
            f"these runs mix kinds ({', '.join(sorted(kinds))}); compare one kind at a time"
        )
    kind = kinds.pop() if kinds else DEFAULT_KIND
    metrics = metrics_of(kind)
    fit = None if fitted_at is None else (fit_metric or metrics[0], fitted_at)
    for label, results in sorted(by_group.items(), key=lambda item: natural_key(item[0])):
        table: dict[str, dict] = {}
        for length in results[0]["lengths"] if results else []:
            cells = [r["lengths"].get(length, {}) for r in results]
            lengths.add(length)
            if any("error" in c for c in cells):
                table[length] = {"error": next(c["error"] for c in cells if "error" in c)}
                continue
            # a metric some run lacks (COCO's AP of a size no object has) is left out
            seeds = [r["seed"] for r in results]
            table[length] = {
                m: summarise([c[m] for c in cells], seeds)
                for m in metrics
                if all(m in c for c in cells)
            }
        groups[label] = {
            "seeds": sorted(r["seed"] for r in results),
            "train_lengths": results[0].get("train_lengths") if results else None,
            "lengths": table,
            "diverged": sorted(diverged.get(label, [])),  # seeds whose loss became NaN
        }
        if qualify:
            groups[label]["study"] = study_of[label]
        if fit is not None:
            groups[label]["fitted"] = fitted_runs(results, *fit)
    ordered = sorted(lengths, key=natural_key)
    best: dict[str, dict[str, list[str]]] = {}
    for length in ordered:
        best[length] = {}
        for metric in metrics:
            scored = {
                label: g["lengths"][length][metric]["mean"]
                for label, g in groups.items()
                if length in g["lengths"] and metric in g["lengths"][length]
            }
            if not scored:
                continue
            top = (min if metric in LOWER_IS_BETTER else max)(scored.values())
            winners = [label for label, value in scored.items() if value == top]
            # a tie across every group (all 0.000, say) singles nobody out
            best[length][metric] = winners if len(winners) < len(scored) else []
    result = {"kind": kind, "lengths": ordered, "groups": groups, "best": best}
    if fit is not None:
        result["fit"] = {"metric": fit[0], "threshold": fit[1]}
    if baseline is not None:
        test_against(result, baseline)
        if adjust is not None:
            adjust_tests(result, adjust)
    return result


ADJUST_NAMES = {
    "holm": "Holm's adjustment over every cell's test",
    "bh": "Benjamini-Hochberg's adjustment over every cell's test",
}


def adjust_note(result: dict[str, Any]) -> str:
    """``, after Holm's adjustment ...`` for a table whose tests were adjusted, else nothing."""
    return f", after {ADJUST_NAMES[result['adjust']]}" if "adjust" in result else ""


def adjust_tests(result: dict[str, Any], method: str) -> None:
    """Adjust every metric's tests against the baseline, Welch's and the paired family apart,
    for being made together (16 encodings at 6 lengths are 90 tests: at 5% about 4 resolve by
    chance alone); ``resolved`` then reads the adjusted p, and the raw p stays."""
    for metric in metrics_of(result["kind"]):
        tests = [
            cells[metric]["vs_baseline"]
            for g in result["groups"].values()
            for cells in g["lengths"].values()
            if isinstance(cells.get(metric), dict) and "vs_baseline" in cells[metric]
        ]
        for family in (tests, [t["paired"] for t in tests if t.get("paired")]):
            tested = [t for t in family if t["p"] is not None]
            for t, p in zip(tested, adjusted([t["p"] for t in tested], method), strict=True):
                t.update(p_adjusted=p, adjusted_by=method, resolved=p < ALPHA)
    result["adjust"] = method


def fitted_runs(results: list[dict[str, Any]], metric: str, threshold: float) -> dict[str, Any]:
    """Which seeds reached ``threshold`` on ``metric`` at their longest trained length: a figure
    past the trained range means something only for a model that fitted the range itself.
    A run not evaluated at that length counts as unknown, not as unfit."""
    lower = metric in LOWER_IS_BETTER
    fitted, unfit, unknown = [], [], []
    for r in results:
        trained = r.get("train_lengths")
        value = r["lengths"].get(str(trained[-1]), {}).get(metric) if trained else None
        if value is None:
            unknown.append(r["seed"])
        elif (value <= threshold) if lower else (value >= threshold):
            fitted.append(r["seed"])
        else:
            unfit.append(r["seed"])
    return {"seeds": sorted(fitted), "unfit": sorted(unfit), "unknown": sorted(unknown)}


def seeds_cell(group: dict[str, Any]) -> str:
    """``3``; with a fit criterion ``3 (2 fit)`` (``?`` where the trained length was not
    evaluated); runs that diverged are counted beside: ``2 (1 diverged)``."""
    text = str(len(group["seeds"]))
    notes = []
    fit = group.get("fitted")
    if fit is not None:
        notes.append("? fit" if fit["unknown"] else f"{len(fit['seeds'])} fit")
    if group.get("diverged"):
        notes.append(f"{len(group['diverged'])} diverged")
    return f"{text} ({', '.join(notes)})" if notes else text


def baselines(groups: dict[str, dict], baseline: str) -> dict[str, str]:
    """Each tested group's baseline: the group ``baseline`` names, or, where it names a study,
    the same setting in that study (``rope [copy-randomized]`` against ``rope [copy]``)."""
    if baseline in groups:
        return {label: baseline for label in groups if label != baseline}
    studies = {g["study"] for g in groups.values() if "study" in g}
    if baseline in studies:
        twins = {
            label: label.removesuffix(f" [{g['study']}]") + f" [{baseline}]"
            for label, g in groups.items()
            if g.get("study") not in (None, baseline)
        }
        return {label: twin for label, twin in twins.items() if twin in groups}
    choices = [*groups, *sorted(studies)]
    raise UsageError(
        f"--baseline {baseline!r}: no such encoding among these runs"
        f"{close_match(baseline, choices)}; choose one of {', '.join(choices)}"
    )


def baseline_name(result: dict[str, Any]) -> str:
    """How tables name what was tested against."""
    base = result["baseline"]
    return base if base in result["groups"] else f"the same encoding in {base}"


def test_against(result: dict[str, Any], baseline: str) -> None:
    """Welch's test of every group against its baseline in every cell both have."""
    groups = result["groups"]
    result["against"] = baselines(groups, baseline)
    result["baseline"] = baseline
    for label, base_label in result["against"].items():
        g, base = groups[label], groups[base_label]["lengths"]
        for length, cells in g["lengths"].items():
            for metric, stats in cells.items():
                other = base.get(length, {}).get(metric)
                if isinstance(stats, dict) and other is not None:
                    stats["vs_baseline"] = welch(stats["values"], other["values"])
                    stats["vs_baseline"]["paired"] = paired(
                        dict(zip(stats["seeds"], stats["values"], strict=True)),
                        dict(zip(other["seeds"], other["values"], strict=True)),
                    )


def column_title(result: dict[str, Any], key: str) -> str:
    return task_of(result.get("kind", DEFAULT_KIND)).column(key)


def cell(stats: dict, metric: str) -> str:
    """``mean ± 95% CI``, then ▲ or ▼ where the difference from the baseline is resolved."""
    if "error" in stats or metric not in stats:
        return "n/a"
    s = stats[metric]
    text = f"{s['mean']:.3f} ± {s['ci95']:.3f}" if s["ci95"] is not None else f"{s['mean']:.3f}"
    test = s.get("vs_baseline")
    if test and test["resolved"]:
        better = (test["diff"] < 0) == (metric in LOWER_IS_BETTER)
        text += " ▲" if better else " ▼"
    return text


def test_cell(stats: dict, metric: str) -> str:
    """``+0.031 (p 0.012, paired p 0.004*, d 1.9, 4 seeds)``: the difference from the
    baseline, Welch's p, the paired p over the seeds both share (where there are two or more),
    the effect size and the seeds per encoding that would resolve it; each p followed by its
    adjusted value where ``--adjust`` asked for one (``p 0.012 holm 0.340``)."""
    test = stats.get(metric, {}).get("vs_baseline") if "error" not in stats else None
    if not test:
        return "n/a"
    if test["p"] is None:
        return f"{test['diff']:+.3f} (one seed)"
    d = "inf" if test["effect_size"] is None else f"{test['effect_size']:.2f}"
    needed = test["seeds_needed"]
    seeds = f"{needed} seeds" if needed else f"> {MOST_SEEDS} seeds"
    mark = "*" if test["resolved"] else ""
    pair = test.get("paired") or {}
    by_seed = ""
    if pair.get("p") is not None:
        by_seed = f", paired p {pair['p']:.3f}{adjusted_p(pair)}{'*' if pair['resolved'] else ''}"
    return (
        f"{test['diff']:+.3f}{mark} (p {test['p']:.3f}{adjusted_p(test)}{by_seed}, d {d}, {seeds})"
    )


def adjusted_p(test: dict) -> str:
    """`` holm 0.340`` after a raw p that was adjusted, else nothing."""
    return f" {test['adjusted_by']} {test['p_adjusted']:.3f}" if "p_adjusted" in test else ""


def test_rows(result: dict[str, Any], metric: str) -> list[list[str]]:
    """One row per group other than the baseline, one test cell per length."""
    return [
        [label, seeds_cell(g), *(test_cell(g["lengths"].get(n, {"error": ""}), metric)
                                        for n in result["lengths"])]
        for label, g in result["groups"].items()
        if label in result["against"]
    ]  # fmt: skip


def rows(result: dict[str, Any], metric: str, mark: Callable[[str], str]) -> list[list[str]]:
    """One row per group: label, seed count, then each length's cell, ``mark`` applied to the
    best; shared by the Markdown and the terminal tables."""
    out = []
    for label, g in result["groups"].items():
        cells = []
        for n in result["lengths"]:
            text = cell(g["lengths"].get(n, {"error": ""}), metric)
            cells.append(mark(text) if label in result["best"].get(n, {}).get(metric, []) else text)
        out.append([label, seeds_cell(g), *cells])
    return out


def fit_note(result: dict[str, Any]) -> str:
    fit = result["fit"]
    sign = "<=" if fit["metric"] in LOWER_IS_BETTER else ">="
    return (
        f"A run fitted when its {fit['metric']} was {sign} {fit['threshold']:g} at its longest "
        "trained length; figures past the trained range mean most where every seed fitted."
    )


def markdown(result: dict[str, Any], metric: str) -> str:
    lengths = result["lengths"]
    head = "| encoding | seeds | " + " | ".join(column_title(result, n) for n in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 2)]
    for row in rows(result, metric, lambda text: f"**{text}**"):
        lines.append("| " + " | ".join(row) + " |")
    if "fit" in result:
        lines += ["", fit_note(result)]
    if "baseline" in result:
        lines += [
            "",
            f"Against {baseline_name(result)} (Welch's t-test, then the paired t-test over "
            f"shared seeds; * resolved at 5%{adjust_note(result)}):",
            "",
        ]
        lines += [head.replace("| encoding |", "| encoding - baseline |", 1), lines[1]]
        lines += ["| " + " | ".join(row) + " |" for row in test_rows(result, metric)]
    return "\n".join(lines)
