"""Measure encodings over problem sizes: counts, peak memory, latency, and the growth exponent.

For each size every encoding is built once, counted (one step under the counting modes),
measured for memory (one more step) and then timed together with the others, interleaved, so
that the ratios to ``none`` come from the same minutes of the same machine. A size an encoding
cannot run (a learned table too short, memory exhausted) is recorded with its error and the
sweep goes on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from posenc_cli.errors import UsageError
from posenc_cli.profiling.flops import OpCounts, count_ops
from posenc_cli.profiling.memory import peak_bytes
from posenc_cli.profiling.timing import interleaved_latency
from posenc_cli.profiling.workloads import Subject, encoding_parameters

Mode = Literal["forward", "train"]
BASELINE = "none"


@dataclass
class Point:
    size: int
    tokens: int
    flops: int | None = None  # matmul-class FLOPs of one step of the mode (2 per multiply-add)
    macs: int | None = None
    forward_flops: int | None = None  # both kinds of step, whatever the mode
    train_flops: int | None = None
    elementwise: int | None = None
    gathers: int | None = None
    encoding_flops: int | None = None  # differences from ``none`` at the same size
    encoding_elementwise: int | None = None
    encoding_gathers: int | None = None
    peak_bytes: int | None = None
    time_median_s: float | None = None
    time_iqr_s: float | None = None
    time_ratio: float | None = None  # to ``none`` at the same size, same run
    memory_ratio: float | None = None
    error: str | None = None


@dataclass
class Result:
    encoding: str
    parameters: int = 0
    encoding_parameters: int = 0
    points: list[Point] = field(default_factory=list)
    time_exponent: float | None = None
    memory_exponent: float | None = None


def fit_exponent(sizes: list[int], values: list[float | None]) -> float | None:
    """Least-squares slope of log(value) on log(size) over the upper half of the sizes (at
    least the two largest), where the leading term of the cost shows. None if too few points."""
    pairs = [(s, v) for s, v in zip(sizes, values, strict=True) if v is not None and v > 0]
    if len(pairs) < 2:
        return None
    pairs = pairs[-max(2, (len(pairs) + 1) // 2) :]
    xs = [math.log(s) for s, _ in pairs]
    ys = [math.log(v) for _, v in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def make_step(subject: Subject, inputs: tuple, mode: Mode) -> Callable[[], None]:
    """One inference forward (eval mode, no autograd) or one training step's forward and
    backward (train mode; the optimiser update is element-wise and left out)."""
    module = subject.module

    def forward() -> None:
        module.eval()
        with torch.no_grad():
            subject.forward(inputs)

    def train_step() -> None:
        module.train()
        for p in module.parameters():
            p.grad = None
        subject.forward(inputs).float().sum().backward()

    return forward if mode == "forward" else train_step


@dataclass
class Sweep:
    build: Callable[[str, int], Subject]  # (encoding name, size) -> subject
    encodings: list[str]
    sizes: list[int]
    mode: Mode = "forward"
    batch: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rounds: int = 3
    min_time: float = 0.1
    time_it: bool = True

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 1:
            raise UsageError("sizes must be whole numbers >= 1, e.g. --lengths 128,256,512")
        if self.batch < 1:
            raise UsageError(f"--batch must be >= 1, got {self.batch}")

    def run(self, advance: Callable[[str], None] = lambda _: None) -> list[Result]:
        names = list(dict.fromkeys([BASELINE, *self.encodings]))  # the baseline first, once
        results = {name: Result(name) for name in names}
        for name in names:
            torch.manual_seed(0)
            subject = self.build(name, max(self.sizes))
            results[name].parameters = sum(p.numel() for p in subject.module.parameters())
            results[name].encoding_parameters = encoding_parameters(subject.module)
        for size in self.sizes:
            steps = {}
            for name in names:
                advance(f"{name} @ {size}")
                point, step = self.measure(name, size)
                results[name].points.append(point)
                if step is not None:
                    steps[name] = step
            if self.time_it and steps:
                advance(f"timing @ {size}")
                sync = (
                    (lambda: torch.cuda.synchronize(self.device))
                    if self.device.type == "cuda"
                    else (lambda: None)
                )
                for name, lat in interleaved_latency(
                    steps, self.rounds, self.min_time, synchronize=sync
                ).items():
                    point = results[name].points[-1]
                    point.time_median_s, point.time_iqr_s = lat.median, lat.iqr
            self.relate(results, names)
        for result in results.values():  # growth against the token count N
            tokens = [p.tokens for p in result.points]
            result.time_exponent = fit_exponent(tokens, [p.time_median_s for p in result.points])
            result.memory_exponent = fit_exponent(tokens, [p.peak_bytes for p in result.points])
        return [results[name] for name in names if name in self.encodings or name == BASELINE]

    def measure(self, name: str, size: int) -> tuple[Point, Callable[[], None] | None]:
        torch.manual_seed(0)
        subject = self.build(name, size)
        subject.module.to(self.device)
        point = Point(size=size, tokens=subject.tokens(size))
        try:
            inputs = subject.inputs(size, self.batch, self.device)
            step = make_step(subject, inputs, self.mode)
            other = make_step(subject, inputs, "train" if self.mode == "forward" else "forward")
            counts: OpCounts = count_ops(step)
            point.flops, point.macs = counts.flops, counts.macs
            other_flops = count_ops(other).flops
            point.forward_flops, point.train_flops = (
                (counts.flops, other_flops)
                if self.mode == "forward"
                else (other_flops, counts.flops)
            )
            point.elementwise, point.gathers = counts.elementwise, counts.gathers
            point.peak_bytes = peak_bytes(step, self.device)
        except (UsageError, ValueError, RuntimeError) as err:  # too long, out of memory
            point.error = str(err).splitlines()[0][:200]
            return point, None
        return point, step

    @staticmethod
    def relate(results: dict[str, Result], names: list[str]) -> None:
        """Fill the ratios and differences to the baseline for the newest size."""
        base = results[BASELINE].points[-1]
        for name in names:
            p = results[name].points[-1]
            if p.error or base.error:
                continue
            p.encoding_flops = p.flops - base.flops
            p.encoding_elementwise = p.elementwise - base.elementwise
            p.encoding_gathers = p.gathers - base.gathers
            if p.time_median_s and base.time_median_s:
                p.time_ratio = p.time_median_s / base.time_median_s
            if base.peak_bytes:
                p.memory_ratio = p.peak_bytes / base.peak_bytes


def to_json(results: list[Result]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
