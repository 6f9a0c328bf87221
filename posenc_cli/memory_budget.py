"""Will a problem size fit in memory? Measure small sizes, extrapolate, refuse in one line.

A command that is asked for a size far beyond the machine (``--length 1000000``) would
otherwise die in the allocator, or swap for minutes first. Its memory is measured at a few
small sizes instead, as the bytes alive after every allocation (``LiveTensorBytes``); every
tensor here grows with the size x as 1, x or x^2 (x = positions or tokens, an N x N map is x^2),
so ``a + b x + c x^2`` with non-negative coefficients, fitted to each of those moments,
predicts the large size, and the largest moment is the peak. It is compared with what the
machine has free, less a safety margin, and a size that will not fit is refused with the
largest one that will.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence

import torch

from posenc_cli.errors import UsageError
from posenc_cli.profiling.memory import LiveTensorBytes

# Use at most this share of the free memory: allocator slack, Python objects, other processes.
USABLE_SHARE = 0.8


def available_bytes(device: torch.device | None = None) -> int:
    """Memory free for new tensors: the GPU's free memory, else the kernel's MemAvailable."""
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        pass
    # no /proc (macOS) or an old kernel: free pages, which undercounts reclaimable cache
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Growth:
    """Bytes as a function of size: the largest of several ``a + b x + c x^2`` (one per moment
    of a computation), every coefficient >= 0, so the value never falls as x grows."""

    def __init__(self, coefficients: torch.Tensor) -> None:
        self.coefficients = coefficients.reshape(-1, 3).to(torch.float64)  # rows of (a, b, c)

    def __call__(self, x: float) -> float:
        a, b, c = self.coefficients.unbind(1)
        return float((a + b * x + c * x * x).max())


def fit_growth(xs: Sequence[float], ys: Sequence[float] | torch.Tensor) -> Growth:
    """Least squares ``a + b x + c x^2`` through the points, coefficients kept >= 0.

    ``ys`` holds one measurement per size, or one column per moment of a computation (the
    bytes alive after its k-th allocation, say): each column gets its own polynomial and the
    result is their maximum. Per column every subset of the three terms is fitted and the
    closest fit with no negative coefficient kept (a small non-negative least squares): a
    negative term would predict memory that shrinks with size. Columns of the design are scaled
    to their largest value so that x^2 does not swamp the rest.
    """
    x = torch.as_tensor(xs, dtype=torch.float64)
    y = torch.as_tensor(ys, dtype=torch.float64).reshape(len(x), -1)  # (sizes, moments)
    if x.numel() == 0:
        raise ValueError("fit_growth needs at least one size")
    columns = [torch.ones_like(x), x, x * x]
    best_residual = torch.full((y.shape[1],), float("inf"), dtype=torch.float64)
    best = torch.zeros(y.shape[1], 3, dtype=torch.float64)
    for count in (1, 2, 3):  # fewer terms first: a tie keeps the simpler fit
        for terms in itertools.combinations(range(3), count):
            scale = torch.stack([columns[t].max() for t in terms])
            design = torch.stack([columns[t] for t in terms], 1) / scale  # (sizes, terms)
            solution = torch.linalg.lstsq(design, y).solution  # (terms, moments)
            residual = ((design @ solution - y) ** 2).sum(0)
            better = (solution >= 0).all(0) & (residual < best_residual * (1 - 1e-9))
            best_residual = torch.where(better, residual, best_residual)
            for row, t in enumerate(terms):
                coefficient = solution[row] / scale[row]
                best[:, t] = torch.where(better, coefficient, best[:, t])
            for t in set(range(3)) - set(terms):
                best[:, t] = torch.where(better, 0.0, best[:, t])
    return Growth(best)


def fit_traces(xs: Sequence[float], traces: list[list[int]]) -> Growth:
    """Peak bytes against size from one trace of live bytes per size. At small sizes the peak
    may come at another moment than at large ones (a linear activation, later an N x N map), so
    every moment is extrapolated and the largest taken; traces of different lengths (another
    code path at some size) fall back to fitting the peaks alone."""
    if len({len(trace) for trace in traces}) == 1 and traces[0]:
        return fit_growth(xs, torch.tensor(traces, dtype=torch.float64))
    return fit_growth(xs, [max(trace, default=0) for trace in traces])


def measure_growth(run: Callable[[float], object], sizes: Sequence[float]) -> Growth:
    """Peak tensor bytes of ``run(size)`` (what it returns included), measured at ``sizes`` and
    fitted; an error of ``run`` is the caller's to handle."""
    traces = []
    for size in sizes:
        tracker = LiveTensorBytes(record=True)
        with tracker:
            run(size)
        traces.append(tracker.trace or [])
    return fit_traces(sizes, traces)


def largest_fitting(need: Callable[[int], float], budget: float, upper: int) -> int:
    """The largest size in ``1..upper`` whose ``need`` is within ``budget`` (``need`` grows with
    size); 0 when not even size 1 fits."""
    lo, hi = 0, upper  # need(lo) fits (or lo = 0), need(hi + 1) does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def human_bytes(n: float) -> str:
    """A short figure in decimal units: 7.5 TB, 21 GB, 640 MB."""
    units = (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
    for unit, size in units:
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


def about(n: int) -> int:
    """``n`` rounded down to two significant figures, as an estimate should be (52381 -> 52000)."""
    if n < 100:
        return n
    step = 10 ** (len(str(n)) - 2)
    return n // step * step


def refuse_if_too_big(
    what: str,
    at: str,
    needed: float,
    free: int,
    largest: Callable[[float], str | None],
) -> None:
    """Raise the one-line refusal when ``needed`` bytes exceed the usable share of ``free``.

    ``what`` names the option, its value and what is too big (``--lengths 1000000: alibi``),
    ``at`` the size (``1000000 tokens``); ``largest(budget)`` says which size fits in a budget
    (``about 52000 tokens``), None when none does.
    """
    budget = free * USABLE_SHARE
    if needed <= budget:
        return
    fitting = largest(budget)
    hint = (
        f"the largest that fits is {fitting}"
        if fitting
        else "not even the smallest size fits; free some memory first"
    )
    raise UsageError(
        f"{what} needs about {human_bytes(needed)} at {at}, this machine has "
        f"{human_bytes(free)} free; {hint}"
    )


def refuse_size(
    what: str, size: int, unit: str, need: Callable[[int], float], free: int | None = None
) -> None:
    """``refuse_if_too_big`` for a need that grows with a whole-number size: the largest size
    that fits is searched in ``1..size``. ``free`` defaults to this machine's free memory."""

    def largest(budget: float) -> str | None:
        fitting = largest_fitting(need, budget, size)
        return f"about {about(fitting)} {unit}" if fitting else None

    free = available_bytes() if free is None else free
    refuse_if_too_big(what, f"{size} {unit}", need(size), free, largest)
