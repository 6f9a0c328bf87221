"""The article's scenario advice (seed 001, section 4.2), each pick beside what was measured.

A verdict is one of: ``agrees`` (the pick is best and Welch's test at 5% tells it apart from
the runner-up), ``disagrees`` (another encoding is better, resolved), ``not resolved`` (the pick
and its nearest rival lie inside the seed spread), ``mixed`` (studies disagree), ``not
measured`` (no study or profile answers it). Means are over seeds, as in ``compare``.
"""

from __future__ import annotations

from typing import Any

from posenc_cli.encodings import ENCODINGS
from posenc_cli.report.article import FAMILY, SCENARIOS
from posenc_cli.report.measure import Study, encoding_groups
from posenc_cli.statistics import welch

AT_PAR = 1.05  # cost ratios within 5% of the cheapest count as cheapest: timing noise


def ranked(study: Study, length: int) -> list[tuple[str, dict[str, Any]]]:
    """(encoding, cell) at ``length``, best first."""
    cells = [
        (name, g["lengths"][str(length)][study.metric])
        for name, g in encoding_groups(study).items()
        if study.metric in g["lengths"].get(str(length), {})
    ]
    return sorted(cells, key=lambda c: c[1]["mean"], reverse=not study.lower_is_better)


def verdict_at(study: Study, length: int, pick: str) -> tuple[str, str] | None:
    """(verdict, sentence) for ``pick`` among the study's encodings at ``length``: best and
    resolved against the runner-up agrees; resolved behind the best disagrees; anything inside
    the seed spread is not resolved."""
    order = ranked(study, length)
    names = [n for n, _ in order]
    if pick not in names or len(names) < 2:
        return None
    cells = dict(order)
    rival = names[1] if names[0] == pick else names[0]
    test = welch(cells[pick]["values"], cells[rival]["values"])
    p = "n/a" if test["p"] is None else f"{test['p']:.3f}"
    where = f"{study.name} at {length}"
    standing = (
        f"{pick} is best" if names[0] == pick
        else f"{pick} ranks {names.index(pick) + 1} of {len(names)}"
    )  # fmt: skip
    text = (
        f"{where}: {standing} on {study.metric} ({cells[pick]['mean']:.3f} against {rival}'s "
        f"{cells[rival]['mean']:.3f}, Welch p {p})"
    )
    if not test["resolved"]:
        return "not resolved", text
    return ("agrees" if names[0] == pick else "disagrees"), text


def combine(verdicts: list[tuple[str, str]]) -> tuple[str, str]:
    if not verdicts:
        return "not measured", ""
    kinds = {v for v, _ in verdicts}
    verdict = kinds.pop() if len(kinds) == 1 else "mixed"
    return verdict, "; ".join(text for _, text in verdicts)


def general_lm(report: dict, studies: list[Study]) -> tuple[str, str]:
    lms = [s for s in studies if s.language_model and s.trained]
    found = [verdict_at(s, s.trained, "rope") for s in lms]
    return combine([f for f in found if f])


def strong_extrapolation(report: dict, studies: list[Study]) -> tuple[str, str]:
    """ALiBi against the others on the metric past the trained range (each study's longest
    length up to 4x), where the claim is measured."""
    found = []
    for s in studies:
        rows = [r for r in report["encodings"] if s.name in r["studies"]]
        far = {r["studies"][s.name]["extrapolation"]["length"] for r in rows
               if r["studies"][s.name]["extrapolation"]}  # fmt: skip
        judged = verdict_at(s, far.pop(), "alibi") if len(far) == 1 else None
        if judged:
            found.append((judged[0], judged[1] + ratio_standing(s, rows, "alibi")))
    return combine(found)


def ratio_standing(study: Study, rows: list[dict], pick: str) -> str:
    """How the pick holds up relative to its own 1x: the ALiBi paper's flat curve."""
    ratios = {
        r["encoding"]: r["studies"][study.name]["extrapolation"]["ratio"]
        for r in rows
        if (r["studies"][study.name]["extrapolation"] or {}).get("ratio") is not None
    }
    if pick not in ratios:
        return ""
    order = sorted(ratios, key=ratios.get, reverse=not study.lower_is_better)
    return (
        f"; far / 1x: {pick} {ratios[pick]:.2f}, rank {order.index(pick) + 1} of {len(order)} "
        f"(best {order[0]} {ratios[order[0]]:.2f})"
    )


def limited_resources(report: dict, studies: list[Study]) -> tuple[str, str]:
    costs = {r["encoding"]: r["cost"] for r in report["encodings"] if r["cost"]}
    mine = costs.get("learned")
    # a causal-only encoding is profiled under the causal mask, whose kernel skips half the
    # pairs: its ratio to a bidirectional none is not like for like
    others = {
        n: c
        for n, c in costs.items()
        if n != "none" and c["time_ratio"] is not None and not ENCODINGS[n].causal_only
    }
    if not mine or mine["time_ratio"] is None or not others:
        return "not measured", ""
    cheapest_time = min(c["time_ratio"] for c in others.values())
    cheapest_memory = min(c["memory_ratio"] for c in others.values())
    cheap = (
        mine["time_ratio"] <= AT_PAR * cheapest_time
        and mine["memory_ratio"] <= AT_PAR * cheapest_memory
    )
    fastest = min(others, key=lambda n: others[n]["time_ratio"])
    text = (
        f"learned costs {mine['time_ratio']:.2f}x none's time and {mine['memory_ratio']:.2f}x "
        f"its memory at {mine['at_size']}; the fastest is {fastest} "
        f"({cheapest_time:.2f}x); the least memory {cheapest_memory:.2f}x"
    )
    return ("agrees" if cheap else "disagrees"), text


def multimodal(report: dict, studies: list[Study]) -> tuple[str, str]:
    """The best relative encoding against the best of the rest in each image study."""
    found = []
    for s in studies:
        if not s.multimodal or not s.trained:
            continue
        order = ranked(s, s.trained)
        relative = [n for n, _ in order if FAMILY.get(n) == "relative"]
        if relative:
            found.append(verdict_at(s, s.trained, relative[0]))
    return combine([f for f in found if f])


def long_documents(report: dict, studies: list[Study]) -> tuple[str, str]:
    """XL at the longest context each LM study evaluated."""
    found = []
    for s in studies:
        if s.language_model:
            sizes = sorted({int(n) for n in s.result["lengths"] if n.isdigit()})
            if sizes:
                found.append(verdict_at(s, sizes[-1], "xl"))
    return combine([f for f in found if f])


CHECKS = (general_lm, strong_extrapolation, limited_resources, multimodal, long_documents)


def scenarios(report: dict, studies: list[Study]) -> list[dict[str, str]]:
    out = []
    for (scenario, pick), check in zip(SCENARIOS, CHECKS, strict=True):
        verdict, measured = check(report, studies)
        out.append(
            {"scenario": scenario, "article_pick": pick, "verdict": verdict, "measured": measured}
        )
    return out
