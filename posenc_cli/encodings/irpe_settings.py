"""iRPE's index settings: the ``(alpha, beta, gamma)`` of every index scale, from ``ratio``,
the three values, several ``ratios``, or ``auto`` (the trained grid's rule in
``encodings/adaptive.py``). Plain numbers in, plain numbers out; every bad combination is a
one-line UsageError."""

from __future__ import annotations

from posenc_cli.encodings import adaptive
from posenc_cli.encodings.adaptive import Auto, is_auto
from posenc_cli.encodings.irpe_index import DEFAULT_RATIO, check_params, params_from_ratio
from posenc_cli.errors import UsageError

Params = tuple[float, float, float]  # (alpha, beta, gamma) of one index scale


def index_scales(
    ratio: float,
    alpha: float | None,
    beta: float | None,
    gamma: float | None,
    ratios: list[float] | None,
) -> list[Params]:
    """``(alpha, beta, gamma)`` of every index scale; UsageError on a bad combination."""
    overrides = {"alpha": alpha, "beta": beta, "gamma": gamma}
    if ratios is not None:
        given = [k for k, v in overrides.items() if v is not None]
        if given:
            raise UsageError(
                f"irpe: {', '.join(given)} override a single ratio; with ratios set, leave "
                f"alpha/beta/gamma unset (each ratio r gives r : 2r : 8r)"
            )
        if ratio != DEFAULT_RATIO:
            raise UsageError(
                f"irpe: set either ratio ({ratio}) or ratios ({ratios}), not both; "
                f"put every scale in ratios"
            )
        if not ratios:
            raise UsageError("irpe: ratios is empty; give at least one, e.g. ratios=[1.9, 3.8]")
        scales = [params_from_ratio(r) for r in ratios]
    else:
        base = dict(zip(("alpha", "beta", "gamma"), params_from_ratio(ratio), strict=True))
        base.update({k: v for k, v in overrides.items() if v is not None})
        scales = [(base["alpha"], base["beta"], base["gamma"])]
    for params in scales:
        check_params(*params)
    return scales


def grid_side(height: int | None, width: int | None, why: str) -> int:
    """``max(height, width)`` of the trained grid, or a UsageError saying that ``why`` needs
    them (the ViT and DETR pass both)."""
    fix = "give numbers instead of 'auto'" if why != "rescale" else "set rescale false"
    h = adaptive.check_extent("irpe", "height", height, why, fix)
    w = adaptive.check_extent("irpe", "width", width, why, fix)
    return max(h, w)


def resolve_auto(
    ratio: float | Auto,
    alpha: float | Auto | None,
    beta: float | Auto | None,
    gamma: float | Auto | None,
    ratios: list[float] | None,
    height: int | None,
    width: int | None,
) -> tuple[float, float | None, float | None, float | None]:
    """``(ratio, alpha, beta, gamma)`` with every ``auto`` taken from the trained grid's ratio
    ``max(height, width) / 8`` (``encodings/adaptive.py``, rule 1)."""
    if not any(is_auto(v) for v in (ratio, alpha, beta, gamma)):
        return ratio, alpha, beta, gamma  # type: ignore[return-value]
    if ratios is not None:
        raise UsageError(
            "irpe: 'auto' chooses one index scale; with ratios set, give numbers (or drop ratios)"
        )
    assert height is not None and width is not None  # checked by grid_side
    auto = adaptive.irpe_ratio(height, width)
    derived = dict(zip(("alpha", "beta", "gamma"), params_from_ratio(auto), strict=True))
    picked = {
        key: derived[key] if is_auto(value) else value
        for key, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma))
    }
    base = auto if is_auto(ratio) else ratio
    return base, picked["alpha"], picked["beta"], picked["gamma"]  # type: ignore[return-value]
