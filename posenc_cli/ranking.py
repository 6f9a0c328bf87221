"""Encodings ranked across tasks, the way Kazemnejad et al. 2023 sum up length generalisation.

Each study (a sweep directory, one task) scores every encoding by its metric past the trained
range: seed by seed, the mean over the evaluated lengths beyond the longest trained one. Within a
study the encodings are ranked by their mean score (1 is best, ties share the mean of their
ranks); across studies by their mean rank. Friedman's test (scipy) says whether the rankings
differ beyond chance at all, which three seeds per cell cannot say of any two neighbours.

Encodings are matched across studies by ``compare``'s label, parameters and other swept settings
included (``rope(base=500)`` is not ``rope``). Only the labels every study holds are ranked; the
others are named, not dropped silently.
"""

from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path
from typing import Any

from scipy import stats

from posenc_cli.compare import LOWER_IS_BETTER, metrics_of, study_name, summarise
from posenc_cli.errors import UsageError
from posenc_cli.report.measure import read_study

SCHEMA = "posenc.rank/1"


def past_range(group: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """The group's score: per seed, its mean ``metric`` over the lengths past the trained range;
    and the metric at the longest trained length beside it. None without such lengths."""
    trained = group.get("train_lengths")
    if not trained:
        return None
    top = int(trained[-1])
    # a length only some seeds were evaluated at (one run's extra `posenc evaluate`) has no
    # cell for the group: score the lengths every seed has
    past = sorted(
        (
            n
            for n in group["lengths"]
            if n.isdigit() and int(n) > top and metric in group["lengths"][n]
        ),
        key=int,
    )
    cells = [group["lengths"][n][metric] for n in past]
    inside = group["lengths"].get(str(top), {}).get(metric)
    if not past or inside is None:
        return None
    seeds = cells[0]["seeds"]
    per_seed = [
        statistics.fmean(dict(zip(c["seeds"], c["values"], strict=True))[s] for c in cells)
        for s in seeds
    ]
    score = summarise(per_seed, seeds)
    score.update(lengths=[int(n) for n in past], in_range=inside["mean"])
    if "fitted" in group:
        score["fitted"] = len(group["fitted"]["seeds"])
    return score


def mean_ranks(means: dict[str, float], lower_is_better: bool) -> dict[str, float]:
    """1 for the best mean; ties share the mean of the ranks they span."""
    names = list(means)
    signed = [means[n] if lower_is_better else -means[n] for n in names]
    return dict(zip(names, map(float, stats.rankdata(signed, method="average")), strict=True))


def rank(paths: list[Path], metric: str | None = None, fitted_at: float | None = None) -> dict:
    """``{"metric", "studies", "encodings": {name: {"studies": {study: score}, "mean_rank"}},
    "order", "friedman", "left_out"}``; a score is ``past_range``'s plus its ``rank``."""
    if len(paths) < 2:
        raise UsageError("rank needs two or more studies (one sweep directory per task)")
    studies, scores = [], {}
    for path in paths:
        study = read_study(path, fitted_at=fitted_at, fit_metric=metric)  # one read per study
        chosen = metric or metrics_of(study.kind)[0]
        if chosen not in metrics_of(study.kind):
            raise UsageError(
                f"--metric {chosen!r}: {path} holds {study.kind} runs; choose one of "
                f"{', '.join(metrics_of(study.kind))}"
            )
        metric, result = chosen, study.result
        short_name = study_name(path)
        name = short_name if short_name not in (s["name"] for s in studies) else str(path)
        found = {  # by compare's label: rope(base=500) is not rope
            label: score
            for label, group in result["groups"].items()
            if (score := past_range(group, metric)) is not None
        }
        if not found:
            raise UsageError(
                f"{path}: no encoding was evaluated past its trained range; rank compares "
                "extrapolation, so evaluate longer lengths (eval.lengths) first"
            )
        short = sorted(set(result["groups"]) - set(found))  # there, but not past the range
        studies.append({"name": name, "path": str(path), "task": study.task, "short": short})
        scores[name] = found
    assert metric is not None
    lower = metric in LOWER_IS_BETTER
    common = set.intersection(*(set(found) for found in scores.values()))
    if len(common) < 2:
        raise UsageError(
            "these studies share fewer than two encodings; rank needs the same encodings in "
            "every study"
        )
    everywhere = sorted(common)
    for found in scores.values():
        for encoding, r in mean_ranks({e: found[e]["mean"] for e in everywhere}, lower).items():
            found[encoding]["rank"] = r
    encodings = {
        e: {
            "studies": {s["name"]: scores[s["name"]][e] for s in studies},
            "mean_rank": statistics.fmean(scores[s["name"]][e]["rank"] for s in studies),
        }
        for e in everywhere
    }
    order = sorted(everywhere, key=lambda e: (encodings[e]["mean_rank"], e))
    friedman = None
    if len(studies) >= 3 and len(everywhere) >= 3:  # what scipy's test needs
        with warnings.catch_warnings():  # all tied: scipy divides 0 by 0, answered below
            warnings.simplefilter("ignore", RuntimeWarning)
            test = stats.friedmanchisquare(
                *[[scores[s["name"]][e]["mean"] for s in studies] for e in everywhere]
            )
        statistic, p = float(test.statistic), float(test.pvalue)
        tied = not (math.isfinite(statistic) and math.isfinite(p))  # every study all tied
        friedman = {"statistic": None if tied else statistic, "p": None if tied else p}
    left_out = {  # label -> why, per study it misses
        e: {s["name"]: "short" if e in s["short"] else "absent" for s in studies
            if e not in scores[s["name"]]}
        for e in sorted(set().union(*scores.values(), *(s["short"] for s in studies)) - common)
    }  # fmt: skip
    result = {
        "schema": SCHEMA,
        "metric": metric,
        "lower_is_better": lower,
        "studies": studies,
        "encodings": encodings,
        "order": order,
        "friedman": friedman,
        "left_out": left_out,
    }
    if fitted_at is not None:
        result["fit"] = {"metric": metric, "threshold": fitted_at}
    return result


def cell(score: dict[str, Any], fitted: bool) -> str:
    """``0.418 #3``; with a fit criterion, ``(2/3 fit)`` where not every seed fitted."""
    text = f"{score['mean']:.3f} #{score['rank']:g}"
    if fitted and score["fitted"] < score["n"]:
        text += f" ({score['fitted']}/{score['n']} fit)"
    return text


def rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    fitted = "fit" in result
    header = ["encoding", *(s["name"] for s in result["studies"]), "mean rank"]
    body = []
    for e in result["order"]:
        row = result["encodings"][e]
        cells = [cell(row["studies"][s["name"]], fitted) for s in result["studies"]]
        body.append([e, *cells, f"{row['mean_rank']:.2f}"])
    return header, body


def notes(result: dict[str, Any]) -> list[str]:
    """What the table's numbers are, the Friedman test, and the encodings left out."""
    better = "lower" if result["lower_is_better"] else "higher"
    lines = [
        f"{result['metric']} past the trained range (the mean over every evaluated length beyond "
        f"the longest trained one, seed by seed; {better} is better), its rank in the study "
        "(1 best, ties share), and the mean rank over studies."
    ]
    test = result["friedman"]
    if test is None:
        lines.append("Friedman's test needs three studies or more and three encodings or more.")
    elif test["p"] is None:
        lines.append("Friedman's test: every study ties every encoding; nothing to tell apart.")
    else:
        verdict = "differ" if test["p"] < 0.05 else "are not told apart"
        lines.append(
            f"Friedman's test over {len(result['studies'])} studies: chi2 {test['statistic']:.2f},"
            f" p {test['p']:.3g}; the rankings {verdict} at 5%."
        )
    for e, missing in result["left_out"].items():
        absent = [s for s, why in missing.items() if why == "absent"]
        short = [s for s, why in missing.items() if why == "short"]
        reasons = [f"not in {', '.join(absent)}"] if absent else []
        if short:
            reasons.append(f"not evaluated past the trained range in {', '.join(short)}")
        lines.append(f"{e} is left out: {'; '.join(reasons)}.")
    return lines


def markdown(result: dict[str, Any]) -> str:
    header, body = rows(result)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join([*lines, "", *notes(result)]) + "\n"
