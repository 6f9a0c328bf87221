"""Whether a difference between encodings is real: confidence intervals, Welch's t-test, the
effect size and the seeds a difference would need.

Each figure is over seeds: every seed is one independent training run. The interval is
Student's t on the seeds' mean; Welch's test does not assume equal spreads (an encoding that
sometimes fails to train has a wider one); the effect size is Cohen's d on the two spreads
averaged; the seeds needed are the smallest number per encoding at which a two-sided Welch
test at 5% would find the observed d four times in five (power 0.8).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from scipy import integrate, stats

ALPHA = 0.05
POWER = 0.8
MOST_SEEDS = 1000  # past this a difference is too small to chase with seeds


def ci95(values: list[float]) -> float | None:
    """Half-width of the 95% confidence interval of the mean; None for one value."""
    n = len(values)
    if n < 2:
        return None
    return float(stats.t.ppf(0.975, n - 1)) * statistics.stdev(values) / math.sqrt(n)


def cohens_d(a: list[float], b: list[float]) -> float | None:
    """(mean a - mean b) over the root mean square of the two standard deviations."""
    if len(a) < 2 or len(b) < 2:
        return None
    spread = math.sqrt((statistics.variance(a) + statistics.variance(b)) / 2)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if spread == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / spread


def power(d: float, n: int) -> float:
    """Power of a two-sided two-sample t-test at ``ALPHA`` with ``n`` seeds per side.

    The statistic is ``(Z + shift) / S`` with ``S = sqrt(chi2_df / df)``; the power is the
    chance it passes the critical value, integrated over ``S``. scipy's noncentral t answers NaN
    for the large shifts that a few seeds of a clear difference give, the integral does not.
    The integrand is written with ``math`` rather than scipy's distributions, which cost a
    hundred times more per call: a study of a hundred cells waited minutes on them.
    """
    df = 2 * n - 2
    critical = float(stats.t.ppf(1 - ALPHA / 2, df))
    shift = abs(d) * math.sqrt(n / 2)
    root_df = math.sqrt(df)
    log_norm = (df / 2 - 1) * math.log(2) + math.lgamma(df / 2)  # of the chi density

    def passes(s: float) -> float:  # P(|Z + shift| > critical * s), weighted by S's density
        if s <= 0:
            return 0.0
        tail = 0.5 * (
            math.erfc((critical * s - shift) / math.sqrt(2))
            + math.erfc((critical * s + shift) / math.sqrt(2))
        )
        x = s * root_df
        return tail * math.exp((df - 1) * math.log(x) - x * x / 2 - log_norm) * root_df

    value, _ = integrate.quad(passes, 0, math.inf, limit=200)
    return min(1.0, value)


def seeds_needed(d: float | None) -> int | None:
    """Seeds per encoding that would resolve an effect of size ``d``; None when there is no
    effect to resolve or more than ``MOST_SEEDS`` would be needed."""
    if d is None or d == 0 or math.isnan(d):
        return None
    if math.isinf(d):
        return 2
    # The z-test's count is a close first guess; power grows with n, so walk from it to the
    # first n that reaches POWER (a step or two, against ten for a bisection of 1..MOST_SEEDS).
    z = stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)
    n = min(MOST_SEEDS, max(2, math.ceil(2 * (z / abs(d)) ** 2)))
    if power(d, n) >= POWER:
        while n > 2 and power(d, n - 1) >= POWER:
            n -= 1
        return n
    while n < MOST_SEEDS:
        n += 1
        if power(d, n) >= POWER:
            return n
    return None


def welch(a: list[float], b: list[float]) -> dict[str, float | int | bool | None]:
    """``a`` against the baseline ``b``: the difference of means, Welch's t and p, whether the
    difference is resolved at 5%, Cohen's d and the seeds that d would need."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    out: dict[str, float | int | bool | None] = {"diff": diff, "t": None, "p": None}
    d = cohens_d(a, b)
    if d is not None:
        if statistics.variance(a) == 0 and statistics.variance(b) == 0:
            t, p = (0.0, 1.0) if diff == 0 else (math.copysign(math.inf, diff), 0.0)
        else:
            with near_ties_quiet():
                t, p = stats.ttest_ind(a, b, equal_var=False)
        out.update(t=finite(float(t)), p=float(p))
    out["resolved"] = out["p"] is not None and out["p"] < ALPHA
    out["effect_size"] = None if d is None else finite(d)
    out["seeds_needed"] = seeds_needed(d)
    return out


def paired(a: dict[int, float], b: dict[int, float]) -> dict[str, float | int | bool | None]:
    """The paired t-test over the seeds both have (``seed -> value``): runs of one seed share
    the data split and the batch order, so their difference removes that part of the spread.
    None-valued fields where fewer than two seeds are shared or the differences are all equal."""
    common = sorted(set(a) & set(b))
    out: dict[str, float | int | bool | None] = {"seeds": len(common), "t": None, "p": None}
    differences = [a[s] - b[s] for s in common]
    if len(common) >= 2 and statistics.variance(differences) > 0:
        with near_ties_quiet():
            t, p = stats.ttest_rel([a[s] for s in common], [b[s] for s in common])
        out.update(t=float(t), p=float(p))
    out["resolved"] = out["p"] is not None and out["p"] < ALPHA
    return out


@contextmanager
def near_ties_quiet() -> Iterator[None]:
    """scipy warns of precision loss when seeds are nearly identical (accuracies of 0.9998 and
    1.0); the p it returns stands, and a warning per cell on stderr says nothing more."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Precision loss occurred", category=RuntimeWarning
        )
        yield


def finite(x: float) -> float | None:
    """``x``, or None where it is infinite (two spreads of zero): JSON has no infinity."""
    return x if math.isfinite(x) else None


ADJUSTMENTS = ("holm", "bh")  # family-wise error (Holm 1979), false discovery rate (BH 1995)


def adjusted(p_values: list[float], method: str) -> list[float]:
    """p-values adjusted for testing them all at once: ``holm`` keeps the chance of any false
    resolution at 5%, ``bh`` (Benjamini-Hochberg, scipy) the expected share of false ones."""
    if method == "bh":
        return [float(p) for p in stats.false_discovery_control(p_values)] if p_values else []
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):  # step down: the smallest p times m, the next times m - 1
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        out[i] = running
    return out
