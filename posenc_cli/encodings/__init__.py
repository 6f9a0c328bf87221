"""The registry of position encodings: a plain dict from name to class.

``build_encoding(name, **params)`` checks every parameter against the constructor's signature
before anything is built, so a typo is answered with the valid names and a close match.
Model-given arguments (``dim``, ``heads``, ``head_dim``, ``causal``) are passed only to the
encodings whose constructors take them.
"""

from __future__ import annotations

from typing import Any

from posenc_cli.encodings.absolute import LearnedAbsolute, NoPosition, Sinusoidal
from posenc_cli.encodings.alibi import ALiBi
from posenc_cli.encodings.base import MODEL_ARGS, PositionEncoding
from posenc_cli.encodings.cope import CoPE
from posenc_cli.encodings.deberta import DebertaDisentangled
from posenc_cli.encodings.fire import Fire
from posenc_cli.encodings.fox import ForgettingGate
from posenc_cli.encodings.irpe import ImageRPE
from posenc_cli.encodings.irpe_nd import RelativeND
from posenc_cli.encodings.kerple import Kerple
from posenc_cli.encodings.learned2d import Learned2D
from posenc_cli.encodings.mrope import MultiAxisRope
from posenc_cli.encodings.pope import PolarEmbedding
from posenc_cli.encodings.rope import RotaryEmbedding
from posenc_cli.encodings.rope2d import Rope2D
from posenc_cli.encodings.sandwich import Sandwich
from posenc_cli.encodings.shaw import ShawRelative
from posenc_cli.encodings.sincos2d import SinCos2D
from posenc_cli.encodings.swin import SwinBias
from posenc_cli.encodings.t5 import T5Bias
from posenc_cli.encodings.xl import TransformerXLRelative
from posenc_cli.encodings.xpos import XPos
from posenc_cli.errors import UsageError
from posenc_cli.params import close_match, convert, signature_params

ENCODINGS: dict[str, type[PositionEncoding]] = {
    "none": NoPosition,
    "sinusoidal": Sinusoidal,
    "learned": LearnedAbsolute,
    "shaw": ShawRelative,
    "xl": TransformerXLRelative,
    "t5": T5Bias,
    "rope": RotaryEmbedding,
    "alibi": ALiBi,
    "deberta": DebertaDisentangled,
    # published since the source articles (issue 16)
    "fire": Fire,
    "kerple": Kerple,
    "sandwich": Sandwich,
    "xpos": XPos,
    "cope": CoPE,
    "fox": ForgettingGate,
    "pope": PolarEmbedding,
    # image grids (2D positions)
    "sincos2d": SinCos2D,
    "learned2d": Learned2D,
    "rope2d": Rope2D,
    "swin": SwinBias,
    "irpe": ImageRPE,
    # any number of axes: text, images and video in one sequence
    "mrope": MultiAxisRope,
    "irpe_nd": RelativeND,
}


def encoding_class(name: str) -> type[PositionEncoding]:
    if name not in ENCODINGS:
        raise UsageError(
            f"unknown encoding {name!r}{close_match(name, ENCODINGS)}; "
            f"valid: {', '.join(ENCODINGS)}"
        )
    return ENCODINGS[name]


# what an encoding is, by its class's ``dims``
AXES = {1: "a 1D encoding, for sequences", 2: "a 2D encoding, for image grids",
        3: "an N-D encoding, for any number of axes"}  # fmt: skip


def dims_name(dims: int) -> str:
    """``1D``, ``2D``, or ``N-D`` for the encodings of any number of axes (``dims`` 3)."""
    return f"{dims}D" if dims < 3 else "N-D"


def refuse_dims(name: str, dims: tuple[int, ...], model: str, also: tuple[str, ...] = ()) -> None:
    """The one check that an encoding fits a model: its ``dims`` among ``dims`` (or its name in
    ``also``), else a UsageError that says what it is and lists what ``model`` takes."""
    cls = encoding_class(name)
    if cls.dims in dims or name in also:
        return
    valid = [n for n, c in ENCODINGS.items() if c.dims in dims or n in also]
    kinds = " or ".join(dims_name(d) for d in dims)
    raise UsageError(
        f"encoding {name!r} is {AXES[cls.dims]}; {model} takes {kinds} encodings: "
        f"{', '.join(valid)}"
    )


def user_params(name: str) -> dict[str, tuple[Any, Any]]:
    """The parameters a user may set for ``name``: ``param -> (annotation, default)``."""
    spec = signature_params(encoding_class(name).__init__)
    return {k: v for k, v in spec.items() if k not in MODEL_ARGS}


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validate and convert user parameters for ``name``; raises UsageError on any problem."""
    spec = user_params(name)
    out = {}
    for key, value in params.items():
        if key not in spec:
            valid = ", ".join(spec) or "none"
            raise UsageError(
                f"encoding {name!r} has no parameter {key!r}{close_match(key, spec)}; "
                f"valid: {valid}"
            )
        out[key] = convert(value, spec[key][0], f"{name}.{key}")
    return out


def build_encoding(name: str, **params: Any) -> PositionEncoding:
    """Build encoding ``name``; model arguments pass through, user ones are checked first."""
    cls = encoding_class(name)
    accepted = signature_params(cls.__init__)
    model = {k: params.pop(k) for k in MODEL_ARGS if k in params}
    model = {k: v for k, v in model.items() if k in accepted}
    if cls.causal_only:
        model.setdefault("causal", True)  # a caller that says nothing gets the only form
    return cls(**model, **check_params(name, params))


__all__ = [
    "ENCODINGS",
    "PositionEncoding",
    "build_encoding",
    "check_params",
    "refuse_dims",
    "user_params",
]
