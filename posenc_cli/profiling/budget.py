"""The memory ``posenc profile`` will need at the sizes asked for, known before it runs them.

Every encoding (and the ``none`` baseline) runs one step at three probe sizes (about 512 to
1024 tokens) under the profiler's storage tracker (``memory.LiveTensorBytes``); what is held
(parameters, inputs, gradients) and every moment of the step are fitted against the token
count (``memory_budget.fit_growth``) and extrapolated. The sweep keeps every encoding's model
and inputs at a size at once (they are timed in turn) but runs one step at a time, so a size
needs the sum of what is held plus the largest single step. An encoding that switches to a
leaner kernel past the probes (T5's forward pass, from 16 x 91 keys) is measured again at
larger sizes before it is refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from posenc_cli.errors import UsageError
from posenc_cli.memory_budget import (
    USABLE_SHARE,
    Growth,
    available_bytes,
    fit_growth,
    fit_traces,
    refuse_size,
)
from posenc_cli.profiling.memory import LiveTensorBytes
from posenc_cli.profiling.sweep import BASELINE, Mode, make_step
from posenc_cli.profiling.workloads import Subject

# Token counts the probes run at: past every size at which this code base switches attention
# kernels (iRPE's explicit path up to 384 x 384 pairs, Shaw's clipped kernel from 256 x 256,
# T5's from 455 keys in training), so the probes take the path the large sizes will; a
# fraction of a second each for the layer and the text recipes.
PROBE_TOKENS = (512, 768, 1024)


@dataclass
class Footprint:
    held: Growth  # parameters, buffers, inputs (and gradients in training), bytes per token count
    peak: Growth  # what one step allocates at its peak, above what is held


def held_bytes(subject: Subject, inputs: tuple, mode: Mode) -> int:
    """What stays alive while the sweep keeps a subject for timing."""
    params = sum(p.numel() * p.element_size() for p in subject.module.parameters())
    buffers = sum(b.numel() * b.element_size() for b in subject.module.buffers())
    data = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    grads = params if mode == "train" else 0
    return params + buffers + data + grads


def probe(
    build: Callable[[str, int], Subject],
    name: str,
    sizes: list[int],
    mode: Mode,
    batch: int,
    device: torch.device,
) -> Footprint | None:
    """The encoding's footprint against tokens; None if it cannot run the probe sizes (it will
    not run the larger ones either, and the sweep records why)."""
    tokens, held, traces = [], [], []
    for size in sizes:
        torch.manual_seed(0)
        subject = build(name, size)
        subject.module.to(device)
        tracker = LiveTensorBytes(device.type, record=True)
        try:
            inputs = subject.inputs(size, batch, device)
            step = make_step(subject, inputs, mode)
            with tracker:
                step()
        except (UsageError, ValueError, RuntimeError):
            return None
        tokens.append(subject.tokens(size))
        held.append(held_bytes(subject, inputs, mode))
        traces.append(tracker.trace or [])
    return Footprint(fit_growth(tokens, held), fit_traces(tokens, traces))


def size_for_tokens(tokens: Callable[[int], int], target: int) -> int:
    """The smallest size (length or side in px) with at least ``target`` tokens."""
    hi = 1
    while tokens(hi) < target:
        hi *= 2
    lo = hi // 2  # tokens(lo) < target, or lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tokens(mid) < target else (lo, mid)
    return hi


def check_sizes(
    build: Callable[[str, int], Subject],
    encodings: list[str],
    sizes: list[int],
    *,
    unit: str,
    option: str,
    mode: Mode,
    batch: int,
    device: torch.device,
    free: int | None = None,
) -> None:
    """Refuse, in one line, the smallest size the sweep would run out of memory at; ``free``
    stands in for the machine's free memory (tests)."""
    tokens = build(BASELINE, min(sizes)).tokens  # size -> tokens, the same for every encoding
    probes = sorted({size_for_tokens(tokens, target) for target in PROBE_TOKENS})
    if max(sizes) <= probes[-1]:
        return  # the sweep itself costs no more than measuring it would
    footprints = {
        name: found
        for name in dict.fromkeys([BASELINE, *encodings])
        if (found := probe(build, name, probes, mode, batch, device)) is not None
    }
    if not footprints:
        return

    def need(size: int) -> tuple[float, str]:
        n = tokens(size)
        worst = max(footprints, key=lambda name: footprints[name].peak(n))
        held = sum(f.held(n) for f in footprints.values())
        return held + footprints[worst].peak(n), worst

    free = available_bytes(device) if free is None else free
    budget = free * USABLE_SHARE
    retried: set[str] = set()
    for size in sorted(set(sizes)):
        needed, worst = need(size)
        # Before refusing, measure the encoding in the way again at 4x the probe sizes, where
        # one that switches kernels late (T5's forward pass) has switched; only where the
        # estimate says that is cheap (a sixteenth of the budget), the others are plainly too big.
        while needed > budget and worst not in retried:
            retried.add(worst)
            larger = sorted({size_for_tokens(tokens, 4 * target) for target in PROBE_TOKENS})
            if footprints[worst].peak(tokens(larger[-1])) <= budget / 16:
                found = probe(build, worst, larger, mode, batch, device)
                footprints[worst] = found or footprints[worst]
            needed, worst = need(size)
        refuse_size(f"{option} {size}: {worst}", size, unit, lambda s: need(s)[0], free)
