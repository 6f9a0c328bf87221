"""iRPE index functions: the piecewise index and the four bucket maps against a scalar reference
written from the published definitions (Wu et al. 2021, Eq. 18 and section 3.4, with the
official code's conventions), hand-checked entries, translation and symmetry facts, bucket
counts, and parameter errors."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import pytest
import torch

from posenc_cli.encodings.irpe_index import (
    METHODS,
    bucket_ids,
    bucket_table,
    num_buckets,
    params_from_ratio,
    piecewise_index,
)
from posenc_cli.errors import UsageError

RATIOS = [1.9, 3.8, 1.0]
GRIDS = [(5, 5), (3, 7), (7, 3)]


@cache
def ref_g(x: float, alpha: float, beta: float, gamma: float) -> int:
    """Eq. 18 on one number with ``math``: Python's round is half-to-even like torch.round, and
    int() truncates toward zero like the official cast of the clipped float to long."""
    if abs(x) <= alpha:
        return round(x)
    mag = min(
        round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha)), beta
    )
    return int(math.copysign(mag, x))


def ref_pair(method: str, dr: int, dc: int, alpha: float, beta: float, gamma: float):
    """Bucket id(s) of one grid pair with offset (dr, dc) = query - key."""
    B = int(beta)

    def g(x: float) -> int:
        return ref_g(x, alpha, beta, gamma)

    if method == "euclidean":
        return g(round(math.sqrt(dr * dr + dc * dc))) + B
    if method == "quant":
        return g(dr * dr + dc * dc) + B
    if method == "cross":
        return g(dr) + B, g(dc) + B
    return (g(dr) + B) * (2 * B + 1) + (g(dc) + B)


def ref_map(method, height, width, alpha, beta, gamma, prefix):
    """Scalar loop over all token pairs; prefix pairs read bucket ``grid count``."""
    B = int(beta)
    grid_count = (2 * B + 1) ** 2 if method == "product" else 2 * B + 1
    coords = [(r, c) for r in range(height) for c in range(width)]  # row-major
    n = prefix + len(coords)
    out = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i < prefix or j < prefix:
                out[i][j] = (grid_count, grid_count) if method == "cross" else grid_count
            else:
                (ri, ci), (rj, cj) = coords[i - prefix], coords[j - prefix]
                out[i][j] = ref_pair(method, ri - rj, ci - cj, alpha, beta, gamma)
    count = grid_count + (1 if prefix else 0)
    if method == "cross":
        rows = torch.tensor([[e[0] for e in row] for row in out])
        cols = torch.tensor([[e[1] for e in row] for row in out])
        return (rows, cols), count
    return torch.tensor(out), count


def as_tuple(ids):
    return ids if isinstance(ids, tuple) else (ids,)


def used(ids: torch.Tensor) -> list[int]:
    """The ids that occur, ascending (bincount: torch.unique is slow on CPU)."""
    return torch.bincount(ids.flatten()).nonzero().flatten().tolist()


# ---------------------------------------------------------------- piecewise index


def test_params_from_ratio_is_one_two_eight():
    assert params_from_ratio() == (1.9, 3.8, 15.2)
    assert params_from_ratio(3.8) == (3.8, 7.6, 30.4)


def test_piecewise_hand_values_default_ratio():
    # alpha 1.9, beta 3.8, gamma 15.2: g(2) = round(1.947) = 2, g(3) = round(2.317) = 2,
    # g(4) = round(2.580) = 3, and from x = 11 on round(...) = 4 > 3.8, which truncates to 3.
    x = torch.tensor([-11, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 10, 11, 1000])
    expected = [-3, -3, -3, -2, -2, -1, 0, 1, 2, 2, 3, 3, 3, 3, 3]
    got = piecewise_index(x, *params_from_ratio(1.9))
    assert got.dtype == torch.long
    assert got.tolist() == expected


def test_piecewise_cap_truncates_toward_zero():
    # beta = 3.8: a literal min(round(.), beta) would be 3.8; floor would give -4 for negatives.
    a, b, g = params_from_ratio(1.9)
    x = torch.tensor([11.0, -11.0, 1e6, -1e6])
    assert piecewise_index(x, a, b, g).tolist() == [3, -3, 3, -3]


def test_piecewise_boundary_and_half_to_even():
    # |x| == alpha takes the exact branch: round(2.5) = 2 (half to even), while just past alpha
    # the log branch gives round(2.5 + tiny) = 3.
    x = torch.tensor([2.5, -2.5, 2.5001, -2.5001], dtype=torch.float64)
    assert piecewise_index(x, 2.5, 5.0, 20.0).tolist() == [2, -2, 3, -3]
    # The boundary is visible only when round(alpha) > beta: with alpha = beta = 2.6, x = 2.6 is
    # exact (round -> 3) while 2.7 takes the log branch (3 clipped to 2.6, truncated to 2).
    x = torch.tensor([2.6, 2.7, -2.6, -2.7], dtype=torch.float64)
    assert piecewise_index(x, 2.6, 2.6, 10.0).tolist() == [3, 2, -3, -2]
    # Inside the band, round half to even: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2.
    x = torch.tensor([0.5, 1.5, -0.5, -1.5, 0.0, 1.9, -1.9])
    assert piecewise_index(x, 1.9, 3.8, 15.2).tolist() == [0, 2, 0, -2, 0, 2, -2]


@pytest.mark.parametrize("ratio", [*RATIOS, 0.5, 2.5, 8.0])
def test_piecewise_matches_reference(ratio):
    a, b, g = params_from_ratio(ratio)
    ints = list(range(-3000, 3001))
    got = piecewise_index(torch.tensor(ints), a, b, g).tolist()
    assert got == [ref_g(x, a, b, g) for x in ints]
    gen = torch.Generator().manual_seed(0)
    floats = (torch.randn(4000, generator=gen, dtype=torch.float64) * 8 * ratio).tolist()
    got = piecewise_index(torch.tensor(floats, dtype=torch.float64), a, b, g).tolist()
    assert got == [ref_g(x, a, b, g) for x in floats]


@pytest.mark.parametrize("ratio", RATIOS)
def test_piecewise_odd_bounded_monotone(ratio):
    a, b, g = params_from_ratio(ratio)
    x = torch.arange(0, 5000)
    y = piecewise_index(x, a, b, g)
    assert torch.equal(piecewise_index(-x, a, b, g), -y)
    assert y.max().item() == int(b)  # the cap is reached, and never exceeded
    assert bool((y[1:] >= y[:-1]).all())


def test_piecewise_keeps_shape():
    x = torch.arange(-12, 12).view(2, 3, 4)
    assert piecewise_index(x, 1.9, 3.8, 15.2).shape == (2, 3, 4)


# ---------------------------------------------------------------- bucket maps


# 14x14 (DeiT at 224 px, patch 16) only at two ratios: its scalar loop is the slow part.
CASES = [(r, grid, p) for r in RATIOS for grid in GRIDS for p in (0, 1)]
CASES += [(1.9, (14, 14), 1), (3.8, (14, 14), 0)]


@pytest.mark.parametrize(("ratio", "grid", "prefix"), CASES)
@pytest.mark.parametrize("method", METHODS)
def test_bucket_ids_match_reference(method, ratio, grid, prefix):
    a, b, g = params_from_ratio(ratio)
    ids, count = bucket_ids(method, *grid, a, b, g, prefix_tokens=prefix)
    expected, expected_count = ref_map(method, *grid, a, b, g, prefix)
    assert count == expected_count
    for got, exp in zip(as_tuple(ids), as_tuple(expected), strict=True):
        n = prefix + grid[0] * grid[1]
        assert got.shape == (n, n) and got.dtype == torch.long
        assert torch.equal(got, exp)


def test_hand_checked_entries_default_ratio():
    a, b, g = params_from_ratio(1.9)  # B = 3, 7 ids per axis
    # Token k of a 5x5 grid sits at (k // 5, k % 5); ids[query, key], offset = query - key.
    prod, n = bucket_ids("product", 5, 5, a, b, g)
    assert n == 49
    assert prod[0, 24].item() == 0  # offset (-4, -4): g = (-3, -3) -> 0 * 7 + 0
    assert prod[24, 0].item() == 48  # offset (4, 4): (3 + 3) * 7 + (3 + 3)
    assert prod[12, 12].item() == 24  # offset (0, 0): 3 * 7 + 3
    assert prod[12, 11].item() == 25  # offset (0, 1): 3 * 7 + 4
    assert prod[12, 7].item() == 31  # offset (1, 0): 4 * 7 + 3

    euc, n = bucket_ids("euclidean", 5, 5, a, b, g)
    assert n == 7
    assert euc[12, 12].item() == 3  # distance 0 -> g 0 -> shifted by B
    assert euc[18, 12].item() == 4  # offset (1, 1): round(1.41) = 1 -> 1 + 3
    assert euc[24, 0].item() == 6  # offset (4, 4): round(5.66) = 6 -> g 3 -> 6
    assert euc[11, 0].item() == 5  # offset (2, 1): round(2.24) = 2 -> g(2) = 2 -> 5
    assert euc[17, 0].item() == 6  # offset (3, 2): round(3.61) = 4 -> g(4) = 3 -> 6

    quant, _ = bucket_ids("quant", 5, 5, a, b, g)
    assert quant[12, 11].item() == 4  # squared distance 1 -> g 1
    assert quant[18, 12].item() == 5  # squared distance 2 -> g(2) = 2
    assert quant[14, 12].item() == 6  # offset (0, 2): squared 4 -> g(4) = 3 (a rank would give 2)

    (rows, cols), n = bucket_ids("cross", 5, 5, a, b, g)
    assert n == 7
    assert (rows[11, 2].item(), cols[11, 2].item()) == (5, 2)  # offset (2, -1): g = (2, -1)


def test_euclidean_rounds_distance_before_g():
    # Offset (2, 3), ratio 1.9: g(round(sqrt 13)) = g(4) = 3, whereas g(sqrt 13) = g(3.61) = 2.
    a, b, g = params_from_ratio(1.9)
    assert ref_g(math.sqrt(13), a, b, g) == 2  # the alternative really differs here
    euc, _ = bucket_ids("euclidean", 5, 5, a, b, g)
    assert euc[13, 0].item() == 3 + 3


def test_prefix_tokens_share_one_extra_bucket():
    a, b, g = params_from_ratio(1.9)
    for method in METHODS:
        grid_ids, grid_count = bucket_ids(method, 3, 7, a, b, g)
        ids, count = bucket_ids(method, 3, 7, a, b, g, prefix_tokens=2)
        assert count == grid_count + 1
        for got, plain in zip(as_tuple(ids), as_tuple(grid_ids), strict=True):
            assert bool((got[:2, :] == grid_count).all()) and bool((got[:, :2] == grid_count).all())
            assert torch.equal(got[2:, 2:], plain)
            assert int(plain.max()) < grid_count  # the extra id is used by prefix pairs only


@pytest.mark.parametrize("method", METHODS)
def test_same_offset_same_bucket(method):
    a, b, g = params_from_ratio(1.0)
    height, width = 6, 9
    ids, _ = bucket_ids(method, height, width, a, b, g)
    seen = defaultdict(set)
    for i in range(height * width):
        for j in range(height * width):
            offset = (i // width - j // width, i % width - j % width)
            seen[offset].add(tuple(t[i, j].item() for t in as_tuple(ids)))
    assert len(seen) == (2 * height - 1) * (2 * width - 1)
    assert all(len(v) == 1 for v in seen.values())
    # ... and it is the entry of the per-offset table.
    table = as_tuple(bucket_table(method, height, width, a, b, g))
    for (dr, dc), (value,) in seen.items():
        assert value == tuple(t[dr + height - 1, dc + width - 1].item() for t in table)


@pytest.mark.parametrize("ratio", RATIOS)
def test_symmetries(ratio):
    a, b, g = params_from_ratio(ratio)
    B = int(b)
    height, width = 9, 11
    coords = torch.tensor([(r, c) for r in range(height) for c in range(width)])
    diff = coords[:, None] - coords[None, :]  # (HW, HW, 2)
    squared = (diff**2).sum(-1)
    for method in ("euclidean", "quant"):
        ids, _ = bucket_ids(method, height, width, a, b, g)
        assert torch.equal(ids, ids.T)
        by_distance = defaultdict(set)  # undirected: the id depends on |offset| only
        for d2, i in zip(squared.flatten().tolist(), ids.flatten().tolist(), strict=True):
            by_distance[d2].add(i)
        assert all(len(v) == 1 for v in by_distance.values())
    prod, count = bucket_ids("product", height, width, a, b, g)
    assert torch.equal(prod.T, count - 1 - prod)  # id(-offset) = mirror of id(offset)
    assert not torch.equal(prod, prod.T)  # directed
    (rows, cols), _ = bucket_ids("cross", height, width, a, b, g)
    assert torch.equal(rows.T, 2 * B - rows) and torch.equal(cols.T, 2 * B - cols)


@pytest.mark.parametrize("ratio", RATIOS)
def test_cross_maps_each_see_one_axis(ratio):
    a, b, g = params_from_ratio(ratio)
    height, width = 4, 6
    (rows, cols), _ = bucket_ids("cross", height, width, a, b, g)
    r = torch.arange(height).repeat_interleave(width)
    c = torch.arange(width).repeat(height)
    same_row = r[:, None] == r[None, :]
    same_col = c[:, None] == c[None, :]
    B = int(b)
    assert bool((rows[same_row] == B).all()) and bool((rows[~same_row] != B).all())
    assert bool((cols[same_col] == B).all()) and bool((cols[~same_col] != B).all())


@pytest.mark.parametrize("ratio", RATIOS)
def test_bucket_counts(ratio):
    a, b, g = params_from_ratio(ratio)
    B = int(b)
    side = 2 * B + 1
    # 18x18 reaches the cap on every axis at these ratios (ratio 3.8 needs |offset| >= 17).
    size = 18
    prod, n = bucket_ids("product", size, size, a, b, g)
    assert n == side * side == int(prod.max()) + 1
    assert used(prod) == list(range(n))
    (rows, cols), n = bucket_ids("cross", size, size, a, b, g)
    assert n == side
    assert used(rows) == used(cols) == list(range(side))
    # Official layout: undirected ids are shifted by +B like the directed ones, so 0 .. B-1 stay
    # unused. Rounded distances take every integer, so euclidean uses all of B .. 2B; squared
    # distances skip some integers (3 is no sum of two squares), so quant may skip an id.
    euc, n = bucket_ids("euclidean", size, size, a, b, g)
    assert n == side
    assert used(euc) == list(range(B, 2 * B + 1))
    quant, n = bucket_ids("quant", size, size, a, b, g)
    assert n == side
    assert int(quant.min()) == B and int(quant.max()) == 2 * B
    # The count depends on the parameters only, not on the grid.
    for method in METHODS:
        small = bucket_ids(method, 2, 2, a, b, g, prefix_tokens=1)[1]
        assert small == num_buckets(method, b, prefix_tokens=1) == num_buckets(method, b) + 1
        assert small == bucket_ids(method, size, size, a, b, g, prefix_tokens=1)[1]


def test_single_token_grid():
    ids, n = bucket_ids("product", 1, 1, 1.9, 3.8, 15.2, prefix_tokens=1)
    assert ids.tolist() == [[49, 49], [49, 24]] and n == 50


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("alpha", "beta", "gamma", "key"),
    [
        (0.0, 3.8, 15.2, "alpha"),
        (-1.0, 3.8, 15.2, "alpha"),
        (5.0, 3.8, 15.2, "alpha"),
        (1.9, 3.8, 1.9, "gamma"),
        (1.9, 3.8, 1.0, "gamma"),
        (float("nan"), 3.8, 15.2, "alpha"),
        (1.9, float("inf"), 15.2, "beta"),
    ],
)
def test_bad_params_raise_usage_error(alpha, beta, gamma, key):
    with pytest.raises(UsageError, match=rf"^irpe: {key} "):
        piecewise_index(torch.arange(5), alpha, beta, gamma)
    with pytest.raises(UsageError, match=rf"^irpe: {key} "):
        bucket_ids("product", 3, 3, alpha, beta, gamma)


def test_alpha_above_beta_message():
    with pytest.raises(UsageError, match=r"irpe: alpha \(5\.0\) must not exceed beta \(3\.8\)"):
        bucket_ids("euclidean", 3, 3, 5.0, 3.8, 15.2)


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan")])
def test_bad_ratio(ratio):
    with pytest.raises(UsageError, match="irpe: ratio"):
        params_from_ratio(ratio)


def test_bad_method_and_grid():
    with pytest.raises(UsageError, match="irpe: method must be one of"):
        bucket_ids("manhattan", 3, 3, 1.9, 3.8, 15.2)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="irpe: height and width"):
        bucket_ids("quant", 0, 3, 1.9, 3.8, 15.2)
    with pytest.raises(UsageError, match="irpe: prefix_tokens"):
        bucket_ids("quant", 3, 3, 1.9, 3.8, 15.2, prefix_tokens=-1)
