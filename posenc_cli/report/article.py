"""What the source article (seed 001) says, in English: its selection table (section 4.1),
one column per family, and its scenario advice (section 4.2). Facts to test, not results."""

from __future__ import annotations

# the article's family of each registry encoding (it names four: absolute, relative, RoPE,
# ALiBi); the 2D encodings join the family of the 1D scheme they extend
FAMILY = {
    "sinusoidal": "absolute",
    "learned": "absolute",
    "sincos2d": "absolute",
    "learned2d": "absolute",
    "shaw": "relative",
    "xl": "relative",
    "t5": "relative",
    "deberta": "relative",
    "swin": "relative",
    "irpe": "relative",
    "rope": "rope",
    "rope2d": "rope",
    "alibi": "alibi",
}

ROWS = (
    "position information",
    "extrapolation",
    "compute complexity",
    "implementation complexity",
    "training stability",
    "long sequences",
    "multimodal fit",
)

TABLE = {
    "absolute": (
        "absolute position", "weak (sinusoidal) / none (learned)", "low", "simple", "high",
        "poor", "fair",
    ),
    "relative": ("relative distance", "medium", "medium", "complex", "medium", "good", "good"),
    "rope": (
        "relative distance (through absolute)", "strong", "medium", "medium", "high",
        "excellent", "excellent",
    ),
    "alibi": ("relative distance", "very strong", "low", "simple", "high", "excellent", "good"),
}  # fmt: skip

SCENARIOS = (
    ("general language modelling", "rope"),
    ("strong extrapolation", "alibi"),
    ("limited resources, fixed length", "learned"),
    ("multimodal tasks", "relative variants (T5-style)"),
    ("long documents", "xl"),
)


def says(encoding: str, row: str) -> str:
    """The article's word for ``encoding``'s family on ``row``; '-' for encodings it omits."""
    family = FAMILY.get(encoding)
    return TABLE[family][ROWS.index(row)] if family else "-"
