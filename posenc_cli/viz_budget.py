"""What viz-bias and viz-buckets would need in memory, checked before they draw: the tensor
work measured at a few small sizes and extrapolated, plus what the JSON, the PNG or the table
make of the maps. A size that will not fit is refused in one line, naming the largest that will.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from posenc_cli.errors import UsageError

if TYPE_CHECKING:
    from posenc_cli.encodings import PositionEncoding

# What the outputs hold beyond the tensors, per map entry (measured: a float through tolist()
# and json.dumps ~85 bytes, matplotlib's imshow and the PNG ~25 per entry drawn, a cell of the
# rich table of a 2D grid 400-750); rounded up, as the estimate should err on the safe side.
JSON_BYTES, PNG_BYTES, CELL_BYTES = 100, 32, 800
# Sizes the tensor work is measured at before a larger one runs: positions, and grid patches.
PROBE_LENGTHS, PROBE_CELLS = (64, 96, 128), (256, 576, 1024)
Built = list[tuple["PositionEncoding", str]]  # viz-buckets: each encoding drawn, its title


def refuse_big_maps(
    what: str,
    size: int,
    unit: str,
    runs: list[Callable[[float], object]],
    probes: Sequence[float],
    output: Callable[[int], float],
    side: Callable[[int], float] = float,
) -> None:
    """Refuse a size whose maps will not fit in memory: each computation in ``runs`` measured
    at the ``probes`` and extrapolated to ``side(size)``, plus ``output(size)`` bytes for what
    the JSON document, the PNG or the table make of the maps. A probe that is refused (a table
    too short for it) leaves the answer to the full size, whose message names that size."""
    from posenc_cli.memory_budget import measure_growth, refuse_size

    try:
        tensors = [measure_growth(run, probes) for run in runs]
    except UsageError:
        return
    refuse_size(what, size, unit, lambda n: sum(t(side(n)) for t in tensors) + output(n))


def check_bias_memory(encoding: str, enc, length: int, seed: int, as_json: bool, png: bool) -> None:
    """viz-bias: N x N maps per head, every entry a float in JSON and a pixel in the PNG."""
    from posenc_cli.bias_maps import positional_logits

    if length <= PROBE_LENGTHS[-1]:
        return
    maps = sum(m.maps.shape[0] for m in positional_logits(enc, 2, seed))  # of N x N each
    per_entry = JSON_BYTES * as_json + PNG_BYTES * png
    refuse_big_maps(
        f"--length {length}: {encoding}",
        length,
        "positions",
        [partial(positional_logits, enc, seed=seed)],
        PROBE_LENGTHS,
        lambda n: per_entry * maps * n * n,
    )


def check_length_memory(encoding: str, built: Built, length: int, as_json: bool, png: bool) -> None:
    """1D viz-buckets: an N x N map of ids, drawn in the PNG; JSON has the 2N - 1 relative."""
    from posenc_cli.bucket_maps import sequence_buckets

    if length <= PROBE_LENGTHS[-1]:
        return
    refuse_big_maps(
        f"--length {length}: {encoding}",
        length,
        "positions",
        [partial(sequence_buckets, enc, title=name) for enc, name in built],
        PROBE_LENGTHS,
        lambda n: JSON_BYTES * as_json * 2 * n + PNG_BYTES * png * n * n,
    )


def check_grid_memory(
    encoding: str, built: Built, grid: str, height: int, width: int, as_json: bool, png: bool
) -> None:
    """2D viz-buckets: one id per patch and map, written as JSON or as a table, maybe drawn.
    Grids of the same shape are measured against their side (sqrt of the patches), in which
    rows, columns and patches give the 1, x, x^2 the fit expects."""
    from posenc_cli.bucket_maps import scaled_grids

    if height * width <= PROBE_CELLS[-1]:
        return
    grids = {math.sqrt(h * w): (h, w) for h, w in scaled_grids(height, width, PROBE_CELLS)}
    per_cell = JSON_BYTES * as_json + CELL_BYTES * (not as_json) + PNG_BYTES * png
    refuse_big_maps(
        f"--grid {grid}: {encoding}",
        height * width,
        "patches",
        [partial(grid_probe, enc, name, grids) for enc, name in built],
        sorted(grids),
        lambda cells: 2 * len(built) * per_cell * cells,  # 2: iRPE's cross method has two maps
        side=math.sqrt,
    )


def grid_probe(
    enc: PositionEncoding, name: str, grids: dict[float, tuple[int, int]], side: float
) -> list:
    """The bucket maps of the probe grid of that side (query at its corner)."""
    from posenc_cli.bucket_maps import grid_buckets

    return grid_buckets(enc, *grids[side], (0, 0), name)


# A clip's maps: one panel per frame; past these a figure and a table stop being readable,
# and the pairs stay far below what memory holds (one query against every patch).
MAX_CLIP_FRAMES, MAX_CLIP_PATCHES = 16, 65_536


def check_clip_size(grid: str, shape: tuple[int, ...]) -> None:
    """viz-buckets on a clip: refuse more frames or patches than can be drawn."""
    frames, height, width = shape
    if frames > MAX_CLIP_FRAMES or frames * height * width > MAX_CLIP_PATCHES:
        raise UsageError(
            f"--grid {grid}: a clip is drawn one panel per frame, up to {MAX_CLIP_FRAMES} frames "
            f"and {MAX_CLIP_PATCHES:,} patches; give fewer frames or a smaller grid, e.g. 4x8x8"
        )
